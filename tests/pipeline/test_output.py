"""The output contract on real directories: what --overwrite may delete, locations, globs, the lock."""

import json
import multiprocessing
import os

import pytest

from pipeline import output


def fake_corpus(directory, name="alt_text_corpus", marker=True):
    directory.mkdir(parents=True, exist_ok=True)
    files = [
        f"{name}-train.tfrecord-00000-of-00002", f"{name}-train.tfrecord-00001-of-00002",
        f"{name}-validation.tfrecord-00000-of-00001", "dataset_info.json", "features.json", "COMPLETED",
        "stats/funnel.json", "stats/rejected/rejected-00000-of-00001.jsonl", "stats/report.html",
        "near_duplicates/index/vectors.npy", "vocab.txt",
    ]
    for relative in files:
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    (directory / "dataset_info.json").write_text(json.dumps({"name": name}))
    if marker:
        output.write_marker(str(directory), name)
    return files


def test_empty_or_missing_output_needs_nothing(tmp_path):
    assert output.plan_output(str(tmp_path / "new"), overwrite=False).to_delete == []
    (tmp_path / "empty").mkdir()
    assert output.plan_output(str(tmp_path / "empty"), overwrite=False).to_delete == []


def test_non_empty_output_needs_overwrite(tmp_path):
    fake_corpus(tmp_path / "out")
    with pytest.raises(output.OutputRefused, match="--overwrite"):
        output.plan_output(str(tmp_path / "out"), overwrite=False)


def test_overwrite_deletes_exactly_the_build_files(tmp_path):
    files = fake_corpus(tmp_path / "out")
    plan = output.plan_output(str(tmp_path / "out"), overwrite=True)
    assert sorted(plan.to_delete) == sorted(files + [output.MARKER])
    output.delete_planned(plan)
    assert os.listdir(tmp_path / "out") == []


def test_overwrite_refuses_a_directory_with_anything_else_and_deletes_nothing(tmp_path):
    fake_corpus(tmp_path / "out")
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "out" / "other_corpus-train.tfrecord-00000-of-00001").write_text("another dataset's shard")
    before = sorted(p for p in (tmp_path / "out").rglob("*"))
    with pytest.raises(output.OutputRefused, match="notes.txt"):
        output.plan_output(str(tmp_path / "out"), overwrite=True)
    assert sorted(p for p in (tmp_path / "out").rglob("*")) == before


def test_overwrite_refuses_a_directory_that_is_not_a_corpus(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.parquet").write_bytes(b"PAR1")
    with pytest.raises(output.OutputRefused, match="not a corpus"):
        output.plan_output(str(data), overwrite=True)
    assert (data / "part-0.parquet").exists()


def test_a_corpus_built_before_the_marker_is_recognised(tmp_path):
    files = fake_corpus(tmp_path / "old", marker=False)
    assert sorted(output.plan_output(str(tmp_path / "old"), overwrite=True).to_delete) == sorted(files)


def test_glob_characters_in_the_output_are_literal(tmp_path):
    star = tmp_path / "out*"
    fake_corpus(star)
    neighbour = fake_corpus(tmp_path / "out1")
    plan = output.plan_output(str(star), overwrite=True)
    output.delete_planned(plan)
    assert not any(star.rglob("*"))
    assert all((tmp_path / "out1" / f).exists() for f in neighbour)
    bracket = tmp_path / "o[u]t"
    fake_corpus(bracket)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    output.delete_planned(output.plan_output(str(bracket), overwrite=True))
    assert (tmp_path / "out" / "keep").exists() and not any(bracket.rglob("*"))


def test_escape_glob_matches_only_itself(tmp_path):
    from apache_beam.io.filesystems import FileSystems

    (tmp_path / "a*b").write_text("1")
    (tmp_path / "axxb").write_text("2")
    (tmp_path / "a[x]b").write_text("3")
    for name in ("a*b", "a[x]b"):
        (result,) = FileSystems.match([output.escape_glob(str(tmp_path / name))])
        assert [m.path for m in result.metadata_list] == [str(tmp_path / name)]


@pytest.mark.parametrize("out, location, relation", [
    ("in", "in", "is"),
    ("in/corpus", "in", "is inside"),
    (".", "in", "contains"),
])
def test_output_equal_to_inside_or_containing_an_input_is_refused(tmp_path, monkeypatch, out, location, relation):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    with pytest.raises(output.OutputRefused, match=relation):
        output.check_location(out, [output.input_location("in/*.parquet")])
    output.check_location("elsewhere", [output.input_location("in/*.parquet")])


def test_input_location_of_patterns():
    assert output.input_location("/d/x/*.parquet") == "/d/x"
    assert output.input_location("/d/x/part-[0-9].parquet") == "/d/x"
    assert output.input_location("/d/x/file.parquet") == "/d/x/file.parquet"
    assert output.input_location("gs://b/p/*.parquet") == "gs://b/p"


@pytest.mark.parametrize("name", ["../escaped", "a/b", "", "x-y", "1abc", "a b", "..", "name*"])
def test_dataset_names_must_be_plain(name):
    assert output.valid_dataset_name(name) is not None


def test_plain_dataset_names_pass():
    assert output.valid_dataset_name("alt_text_corpus") is None
    assert output.valid_dataset_name("CC12M_v2") is None


def _try_lock(directory, run_id, queue):
    try:
        output.Lock(directory, run_id).acquire()
        queue.put(run_id)
    except output.OutputLocked as error:
        queue.put(str(error))


def test_lock_admits_one_build_of_two_at_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_try_lock, args=(str(tmp_path), f"run{i}", queue)) for i in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join()
    winners = [r for r in results if r in ("run0", "run1")]
    assert len(winners) == 1
    (loser,) = [r for r in results if r not in winners]
    assert "another build is writing" in loser and winners[0] in loser


def test_a_lock_of_a_dead_process_on_this_host_is_dropped_a_live_one_is_not(tmp_path):
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / output.LOCK).write_text(json.dumps(
        {"run_id": "killed", "host": socket.gethostname(), "pid": int(dead.stdout), "started": "then"}))
    output.Lock(str(tmp_path), "next").ensure_free()
    assert not (tmp_path / output.LOCK).exists()
    (tmp_path / output.LOCK).write_text(json.dumps(
        {"run_id": "running", "host": socket.gethostname(), "pid": os.getpid(), "started": "now"}))
    with pytest.raises(output.OutputLocked, match="run running"):
        output.Lock(str(tmp_path), "next").ensure_free()


def test_lock_release_and_takeover_detection(tmp_path):
    first = output.Lock(str(tmp_path), "a")
    first.acquire()
    with pytest.raises(output.OutputLocked):
        output.Lock(str(tmp_path), "b").acquire()
    (tmp_path / output.LOCK).write_text(json.dumps({"run_id": "intruder"}))
    with pytest.raises(output.OutputLocked):
        first.check()
    os.remove(tmp_path / output.LOCK)
    second = output.Lock(str(tmp_path), "b")
    second.acquire()
    second.release()
    assert not (tmp_path / output.LOCK).exists()


def test_publish_moves_staged_files_to_final_names(tmp_path):
    staging = output.staging_dir(str(tmp_path), "run1")
    os.makedirs(os.path.join(staging, "stats"))
    open(os.path.join(staging, "stats", "funnel.json"), "w").write("{}")
    open(os.path.join(staging, "x-train.tfrecord-00000-of-00001"), "w").write("r")
    moved = output.publish(staging, str(tmp_path))
    assert sorted(moved) == ["stats/funnel.json", "x-train.tfrecord-00000-of-00001"]
    assert sorted(os.listdir(tmp_path)) == ["stats", "x-train.tfrecord-00000-of-00001"]
