"""The build's safety on real directories: what it deletes, where it refuses to write,
concurrent and killed builds, zero-record builds, per-row accounting and a quiet console.

Real Parquet files, the real Beam job (FnApiRunner), the real command line in subprocesses.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import repo_root
from corpus_paths import committed
from pipeline.build import launcher
from pipeline.funnel import accounting as finish
from pipeline.publish import output_contract as output
from tests import images as made
from tests.pipeline.readers.test_file_records import make_input_tree

ROOT = repo_root.ROOT
QUICK = ["--set", "vocab_size=0", "--set", "nsfw_threshold=1.0"]


def write_candidates(directory, rows=6):
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "url": [f"https://e.x/{i}.jpg" for i in range(rows)],
        "caption": [f"a small test picture number {i}" for i in range(rows)],
        "jpg": [made.swatch(i) for i in range(rows)],
    })
    pq.write_table(table, directory / "part-0.parquet")
    return directory / "*.parquet"


def snapshot(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def cli(*args, env_extra=None, **kwargs):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "pipeline.build", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One small corpus; tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("built")
    pattern = write_candidates(root / "in")
    launcher.run(["--input", str(pattern), "--output", str(root / "corpus"), *QUICK])
    return root, pattern


def copy_corpus(built, tmp_path, name="corpus"):
    import shutil

    root, pattern = built
    shutil.copytree(root / "corpus", tmp_path / name)
    return tmp_path / name, pattern


def test_a_build_is_complete_and_marked(built):
    root, _ = built
    files = set(snapshot(root / "corpus"))
    version = committed(root / "corpus").relative_to(root / "corpus").as_posix()
    assert {output.MARKER, "dataset_info.json", f"{version}/manifest.json", f"{version}/stats/funnel.json"} <= files
    assert {f for f in files if "/" not in f} == {output.MARKER, "dataset_info.json", "features.json"}


def test_overwrite_refuses_when_anything_else_is_there_and_deletes_nothing(built, tmp_path):
    corpus, pattern = copy_corpus(built, tmp_path)
    (corpus / "notes.txt").write_text("my notes")
    before = snapshot(corpus)
    with pytest.raises(output.OutputRefused, match="notes.txt"):
        launcher.run(["--input", str(pattern), "--output", str(corpus), "--overwrite", *QUICK])
    assert snapshot(corpus) == before


def test_overwrite_of_a_directory_that_is_not_a_corpus_is_refused(built, tmp_path):
    _, pattern = built
    data = tmp_path / "data"
    data.mkdir()
    (data / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(output.OutputRefused, match="not a corpus"):
        launcher.run(["--input", str(pattern), "--output", str(data), "--overwrite", *QUICK])
    assert snapshot(data) == {"holiday.jpg": b"precious"}


def test_invalid_arguments_leave_the_previous_corpus_untouched(built, tmp_path):
    corpus, pattern = copy_corpus(built, tmp_path)
    before = snapshot(corpus)
    for bad in (["--name", "../escaped"], ["--set", "no_such_threshold=1"], ["--eval_images", "x=/no/such/dir"],
                ["--embedder", "nope"], ["--no_such_beam_flag=1"], ["--runner", "NoSuchRunner"],
                ["--input_format", "xls"], ["--version", "../1.0.0"]):
        with pytest.raises(launcher.UsageError):
            launcher.run(["--input", str(pattern), "--output", str(corpus), "--overwrite", *QUICK, *bad])
        assert snapshot(corpus) == before, bad
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("where", ["in", "in/corpus", "."])
def test_output_equal_to_inside_or_containing_the_input_is_refused(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    write_candidates(tmp_path / "in")
    before = snapshot(tmp_path)
    with pytest.raises(launcher.UsageError, match="input location"):
        launcher.run(["--input", "in/*.parquet", "--output", where, "--overwrite", *QUICK])
    assert snapshot(tmp_path) == before


def test_glob_characters_in_the_output_are_literal(built, tmp_path):
    _, pattern = built
    neighbour = tmp_path / "out!"  # matched by the pattern out*, and listed before it
    neighbour.mkdir()
    theirs = {name: b"someone else's " + name.encode() * 50 for name in (
        "alt_text_corpus-train.tfrecord-00000-of-00001", "alt_text_corpus-validation.tfrecord-00000-of-00001",
        "alt_text_corpus-train.tfrecord-00000-of-00009", "COMPLETED")}
    for name, data in theirs.items():
        (neighbour / name).write_bytes(data)
    star = tmp_path / "out*"
    for _ in range(2):  # a build, then --overwrite of it
        launcher.run(["--input", str(pattern), "--output", str(star), "--overwrite", *QUICK])
    assert snapshot(neighbour) == theirs
    shards = sorted(p for p in committed(star).iterdir() if p.name.startswith("alt_text_corpus-"))
    info = json.loads((star / "dataset_info.json").read_text())
    assert len(shards) == sum(len(s["shardLengths"]) for s in info["splits"])
    assert len(list((star / "versions").iterdir())) == 1  # the first build's version went with the --overwrite
    # Metadata describes this output's own files, not the neighbour's.
    assert sum(int(s.get("numBytes", 0)) for s in info["splits"]) == sum(p.stat().st_size for p in shards)


def test_zero_record_build_ends_with_its_funnel(tmp_path):
    """An empty Parquet file: exit 0, the funnel printed and saved, a clear message, no traceback."""
    import tensorflow_datasets as tfds

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"url": pa.array([], pa.string()), "caption": pa.array([], pa.string()),
                             "jpg": pa.array([], pa.binary())}), tmp_path / "in" / "empty.parquet")
    done = cli("--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out"), *QUICK,
               env_extra={"ALT_TEXT_CORPUS_LOG_DIR": str(tmp_path / "logs")})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no traceback, no library warnings on the console
    assert "funnel of 'alt_text_corpus'" in done.stdout and "no record was written" in done.stdout
    assert not any(word in line for line in done.stdout.splitlines() for word in ("WARNING", "INFO", "I0000"))
    funnel = json.loads((committed(tmp_path / "out") / "stats" / "funnel.json").read_text())
    assert funnel["input"] == 0 and funnel["conserved"]
    info = tfds.builder_from_directory(str(tmp_path / "out")).info
    assert {name: split.num_examples for name, split in info.splits.items()} == {"train": 0, "validation": 0}
    assert (tmp_path / "logs" / "build.log").exists()


@pytest.mark.slow
def test_strict_preset_writes_nothing_and_says_so(built, tmp_path):
    _, pattern = built
    funnel = launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK,
                        "--set", "min_words=19", "--set", "max_words=20"])
    assert funnel["written"] == {"train": 0, "validation": 0} and funnel["rejected_total"] == funnel["input"] == 6
    assert committed(tmp_path / "out").is_dir()


def test_every_row_of_every_readable_file_is_accounted_for(tmp_path, capsys):
    """The funnel's input is the rows the files state: the unreadable row group's 20 rows are input, rejected."""
    from pipeline.audit import auditor

    expected = make_input_tree(tmp_path / "in")
    stated = dict(expected, **{"read/unreadable_row_group": 20})  # its one marker record stands for 20 rows
    funnel = launcher.run(["--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out"), *QUICK,
                        "--set", "min_shorter_side=0", "--set", "min_words=1"])
    footers = sum(pq.ParquetFile(path).metadata.num_rows for path in (tmp_path / "in").rglob("*.parquet")
                  if path.is_file() and path.name != "d.parquet" and "_temporary" not in path.parts)
    assert funnel["conserved"] and funnel["input"] == sum(stated.values()) == footers + 1  # + the unreadable file
    assert funnel["reading"] == {"read": funnel["input"] - 20, "unread": 20, "unknown_losses": 0, "beyond_stated": 0}
    read = next(row for row in funnel["stages"] if row["stage"] == "read")["rejected"]
    assert read == {k: v for k, v in stated.items() if k != "written"}
    corpus = committed(tmp_path / "out")
    ledger = [json.loads(line) for f in output.list_files(str(corpus)) if f.startswith("stats/rejected/")
              for line in (corpus / f).read_text().splitlines()]
    assert sum(row.get("unread_records", 1) for row in ledger) == funnel["rejected_total"]
    assert any(row["url"].endswith("d.parquet") and row["reason"] == "read/unreadable_file" for row in ledger)
    # The console and the report say how much of the stated input was never read.
    line = f"input: the files state {funnel['input']:,} records; {funnel['input'] - 20:,} read, 20 stated but unreadable"
    assert line in capsys.readouterr().out
    assert line in open(auditor.render_report(str(tmp_path / "out")), encoding="utf-8").read()


def test_accounting_against_the_footers():
    funnel = {"input": 10, "conserved": True}
    assert finish.accounting_problems(funnel, {"parquet_rows": 9, "unreadable_files": 1}) == []
    (problem,) = finish.accounting_problems(funnel, {"parquet_rows": 12, "unreadable_files": 0})
    assert "differs from the files' metadata" in problem
    assert finish.accounting_problems(funnel, {"parquet_rows": 4, "tsv_records": 5, "unreadable_files": 1}) == []
    assert finish.accounting_problems({"input": 3, "conserved": False}, None) == [
        "conservation law violated: input != written + rejected"]


@pytest.mark.slow
def test_a_killed_build_is_refused_and_a_new_build_replaces_it(tmp_path):
    """Build A is killed while its job runs: nothing is committed, the audit refuses the output; a new
    build with --overwrite commits its own version and leaves A's (uncommitted) files alone."""
    pattern = write_candidates(tmp_path / "in", rows=400)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", ALT_TEXT_CORPUS_LOG_DIR=str(tmp_path / "logs"))
    first = subprocess.Popen([sys.executable, "-m", "pipeline.build", "--input", str(pattern), "--output", str(out),
                              *QUICK], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(out.glob("versions/*/" + output.REQUEST)):
        assert time.time() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not (out / "dataset_info.json").exists()
    (killed,) = [p.name for p in (out / "versions").iterdir()]
    audit = subprocess.run([sys.executable, "-m", "pipeline.audit", str(out), "--no_html"], cwd=ROOT, env=env,
                           capture_output=True, text=True)
    assert audit.returncode == 2 and "has no committed corpus" in audit.stderr
    killed_files = snapshot(out / "versions" / killed)
    second = cli("--input", str(pattern), "--output", str(out), "--overwrite", *QUICK)
    assert second.returncode == 0, second.stderr
    assert f"1 uncommitted build(s) ({killed})" in second.stdout
    assert committed(out).name != killed and snapshot(out / "versions" / killed) == killed_files


def test_usage_mistake_is_one_error_line_and_one_usage_line(tmp_path):
    """A bad preset value: the error first, one usage line, exit 2, the output never created."""
    pattern = write_candidates(tmp_path / "in")
    done = cli("--input", str(pattern), "--output", str(tmp_path / "out"), "--set", "min_shorter_side=-5")
    assert done.returncode == launcher.EXIT_USAGE
    lines = done.stderr.splitlines()
    assert lines == ["error: min_shorter_side: must be an integer in [0, inf), got -5", launcher.SHORT_USAGE], done.stderr
    assert not (tmp_path / "out").exists()
