"""``--reuse OLD``: a rebuild that takes a previous build's facts writes exactly what a full rebuild writes.

The planted inputs (a repeat pair, a small picture, six records in one
file) are built once with the NSFW scorer on; each case then builds twice
with the same new arguments, in full and with ``--reuse`` of that build, and
the two versions must hold the same files byte for byte (shards, ledger,
candidate table, stats), bar what names the build (its id, start time and
command line) and the read stage's note, which says what was reused. Where
the old facts answer, the rebuild neither decodes, nor scores, nor makes a
stored picture again (the functions that do raise); a damaged or mismatched
old corpus never changes the output, and what cannot be reused is refused
in one line.
"""

import json
import pathlib
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tests.images as made
from common.corpus_dir import resolve
from pipeline.build import launcher
from tests.pipeline.write.test_candidate_table import PLANTED, photo

BASE = ["--set", "vocab_size=0", "--set", "output_max_side=128"]  # pictures re-encoded: a copy is visible


def write_input(directory: pathlib.Path, changed: int = -1) -> str:
    """The planted records as ``part-0.parquet`` (record ``changed`` with another picture)."""
    directory.mkdir(parents=True, exist_ok=True)
    pictures = [photo(p[2] + (100 if i == changed else 0), p[3]) for i, p in enumerate(PLANTED)]
    pq.write_table(pa.table({"url": [p[0] for p in PLANTED], "caption": [p[1] for p in PLANTED],
                             "jpg": pictures}), directory / "part-0.parquet")
    return str(directory / "*.parquet")


def write_more(directory: pathlib.Path) -> None:
    """Two more records in a file of their own (input files the old build never read)."""
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "url": ["https://e.x/10.jpg", "https://e.x/11.jpg"],
        "caption": ["a yellow kite over a green hill", "an old stone bridge over a river"],
        "jpg": [photo(10), photo(11)],
    }), directory / "part-1.parquet")


def build(pattern, output, *args):
    launcher.run(["--input", pattern, "--output", str(output), *BASE, *args])
    return pathlib.Path(resolve(str(output)))


def files(version: pathlib.Path) -> dict:
    return {str(p.relative_to(version)): p.read_bytes() for p in sorted(version.rglob("*")) if p.is_file()}


def funnel_without_read_note(data: bytes) -> dict:
    funnel = json.loads(data)
    for stage in funnel["stages"]:
        if stage["stage"] == "read":
            stage.pop("note", None)
    return funnel


def read_note(version: pathlib.Path) -> str:
    funnel = json.loads((version / "stats" / "funnel.json").read_text())
    return next(stage.get("note", "") for stage in funnel["stages"] if stage["stage"] == "read")


def assert_same_corpus(full: pathlib.Path, reused: pathlib.Path) -> None:
    a, b = files(full), files(reused)
    assert sorted(a) == sorted(b)
    for name in sorted(a):
        if name == "_BUILD.json":  # its command line and start: a rebuild's own
            continue
        if name == "stats/funnel.json":
            assert funnel_without_read_note(a[name]) == funnel_without_read_note(b[name])
        elif name == "manifest.json":
            assert named_apart(a[name], full) == named_apart(b[name], reused)
        else:
            assert a[name] == b[name], name


def named_apart(data: bytes, version: pathlib.Path) -> dict:
    """A manifest without what names its build (its version id and start time)."""
    found = json.loads(data.decode().replace(version.name, "VERSION"))
    found.pop("started", None)
    return found


def no_work(monkeypatch):
    """Decoding for identity, loading the NSFW model, scoring and making a stored picture raise: what a rebuild
    must not redo."""
    from filters import image as image_rules
    from filters import open_nsfw
    from pipeline.write import second_pass

    def refused(*_args, **_kwargs):
        raise AssertionError("derived again what the old build found")

    monkeypatch.setattr(image_rules, "identify", refused)
    monkeypatch.setattr(second_pass, "stored_picture", refused)
    monkeypatch.setattr(open_nsfw.OpenNsfwScorer, "__init__", refused)  # its label is known without it
    for name in dir(open_nsfw):
        scorer = getattr(open_nsfw, name)
        if isinstance(scorer, type) and hasattr(scorer, "score_prepared"):
            monkeypatch.setattr(scorer, "score_prepared", refused)


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    """The planted input built once, NSFW on (the preset's default)."""
    root = tmp_path_factory.mktemp("reuse")
    pattern = write_input(root / "in")
    return root, pattern, build(pattern, root / "old")


def test_a_changed_corpus_wide_threshold_reuses_every_fact_and_writes_the_full_rebuild(old, monkeypatch):
    root, pattern, version = old
    full = build(pattern, root / "full_b", "--set", "max_images_per_text=1")
    no_work(monkeypatch)
    reused = build(pattern, root / "reuse_b", "--set", "max_images_per_text=1", "--reuse", str(root / "old"))
    assert_same_corpus(full, reused)
    assert "6 records' facts reused, 0 derived again" in read_note(reused)
    assert "derived again:" not in read_note(reused)  # nothing the launcher knew of needed deriving again


def test_a_looser_record_threshold_derives_only_what_the_old_build_never_measured(old):
    """min_shorter_side=20 lets in the 24 px picture: the old build rejected it before its decode and score."""
    root, pattern, _ = old
    full = build(pattern, root / "full_a", "--set", "min_shorter_side=20")
    reused = build(pattern, root / "reuse_a", "--set", "min_shorter_side=20", "--reuse", str(root / "old"))
    assert_same_corpus(full, reused)
    assert "5 records' facts reused, 1 derived again" in read_note(reused)


def test_a_file_whose_kept_records_are_all_copied_is_not_read_again(tmp_path, monkeypatch):
    """Two clean records (no rejection, so no audit sample to read): the first pass reads and checks their bytes,
    the second copies their pictures from the old shards without opening the file again."""
    from pipeline.write import second_pass

    write_more(tmp_path / "in")
    pattern = str(tmp_path / "in" / "*.parquet")
    build(pattern, tmp_path / "old")
    full = build(pattern, tmp_path / "full", "--set", "max_images_per_text=1")

    def refused(*_args, **_kwargs):
        raise AssertionError("read the source file again")

    monkeypatch.setattr(second_pass, "records_of", refused)
    reused = build(pattern, tmp_path / "reuse", "--set", "max_images_per_text=1", "--reuse", str(tmp_path / "old"))
    assert_same_corpus(full, reused)
    assert "2 records' facts reused" in read_note(reused)


def test_new_input_files_are_judged_as_in_a_full_build(old, tmp_path):
    root, _, _ = old
    write_more(root / "in_more")
    pattern = str(root / "in*" / "*.parquet")  # the old build's file where it was, and the new one
    full = build(pattern, tmp_path / "full_c")  # outside the input's location, which is now all of root
    reused = build(pattern, tmp_path / "reuse_c", "--reuse", str(root / "old"))
    assert_same_corpus(full, reused)
    assert "6 records' facts reused, 0 derived again (bytes changed, or not measured before), 2 new" in read_note(
        reused)


def test_an_added_evaluation_set_is_searched_again_and_its_matches_written(old, tmp_path):
    root, pattern, _ = old
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "copy.jpg").write_bytes(photo(PLANTED[1][2], PLANTED[1][3]))
    (tmp_path / "eval" / "other.jpg").write_bytes(made.noise(77, (200, 200), cells=(12, 12), quality=90))
    args = ["--eval_images", f"held={tmp_path / 'eval'}"]
    full = build(pattern, tmp_path / "full_d", *args)
    reused = build(pattern, tmp_path / "reuse_d", *args, "--reuse", str(root / "old"))
    assert_same_corpus(full, reused)
    assert "evaluation matches (the evaluation index differs)" in read_note(reused)
    assert b"near_duplicate_eval/held" in files(reused)["stats/candidates/_summary.json"]


def test_a_changed_source_file_is_judged_again_where_its_bytes_changed(tmp_path):
    pattern = write_input(tmp_path / "in")
    build(pattern, tmp_path / "old", "--set", "nsfw_threshold=1.0")
    write_input(tmp_path / "in", changed=1)  # one picture replaced in place since
    full = build(pattern, tmp_path / "full", "--set", "nsfw_threshold=1.0")
    reused = build(pattern, tmp_path / "reuse", "--set", "nsfw_threshold=1.0", "--reuse", str(tmp_path / "old"))
    assert_same_corpus(full, reused)
    assert "5 records' facts reused, 1 derived again" in read_note(reused)


@pytest.mark.parametrize("damage", ["truncated table", "missing shard"])
def test_a_damaged_old_corpus_never_changes_the_output(old, tmp_path, damage):
    root, pattern, _ = old
    copy = tmp_path / "old"
    shutil.copytree(root / "old", copy)
    version = pathlib.Path(resolve(str(copy)))
    if damage == "truncated table":
        part = next((version / "stats" / "candidates").glob("part-*.parquet"))
        part.write_bytes(part.read_bytes()[:100])
    else:
        for shard in version.glob("*.tfrecord-*"):
            shard.unlink()
    full = build(pattern, tmp_path / "full")
    reused = build(pattern, tmp_path / "reuse", "--reuse", str(copy))
    assert_same_corpus(full, reused)
    if damage == "truncated table":
        assert "0 records' facts reused, 0 derived again (bytes changed, or not measured before), 6 new" in read_note(
            reused)


@pytest.mark.parametrize("state,message", [
    ("no directory", "no such directory"),
    ("uncommitted", "not a committed corpus"),
    ("no table", "candidate table is missing"),
    ("older facts", "whose facts are not this one's"),
    ("download", "--reuse with --download"),
])
def test_what_cannot_be_reused_is_refused_in_one_line(old, tmp_path, capsys, state, message):
    root, pattern, _ = old
    copy = tmp_path / "old"
    shutil.copytree(root / "old", copy)
    version = pathlib.Path(resolve(str(copy)))
    args = []
    if state == "no directory":
        copy = tmp_path / "nowhere"
    elif state == "uncommitted":
        (copy / "dataset_info.json").unlink()
    elif state == "no table":
        (version / "stats" / "candidates" / "_summary.json").unlink()
    elif state == "older facts":
        request = json.loads((version / "_BUILD.json").read_text())
        del request["facts"]
        (version / "_BUILD.json").write_text(json.dumps(request))
    else:
        args = ["--download"]
    with pytest.raises(SystemExit) as exited:
        launcher.main(["--input", pattern, "--output", str(tmp_path / "new"), *BASE, *args, "--reuse", str(copy)])
    assert exited.value.code == launcher.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err.splitlines()[0], err
    assert not (tmp_path / "new").exists()


def test_a_worker_whose_scorer_loads_other_than_its_machine_cache_said_fails_the_build_in_one_line(
        old, tmp_path, capsys, monkeypatch):
    """The rebuild takes the old scores by the label the cache gives; the scorer loaded for the one record the
    looser rule lets in is another (a patched probe): the build fails rather than mix two scorers' scores."""
    from filters import nsfw, open_nsfw, open_nsfw_labels
    from filters.presets import get_preset

    root, pattern, _ = old
    monkeypatch.setenv(open_nsfw_labels.CACHE_ENV, str(tmp_path / "cache"))
    nsfw.NsfwScoring.from_preset(get_preset("align")).load()  # this machine's cache: the old build's scorer
    monkeypatch.setattr(open_nsfw, "_SESSIONS", {})  # no session of this process's: the label is the cache's
    monkeypatch.setattr(open_nsfw, "_int8", lambda *args: (None, "int8 not used: a patched probe"))
    with pytest.raises(SystemExit) as exited:
        launcher.main(["--input", pattern, "--output", str(tmp_path / "new"), *BASE, "--set", "min_shorter_side=20",
                       "--reuse", str(root / "old")])
    assert exited.value.code == launcher.EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ScorerNotAsKnown" in err[0] and "build again" in err[0], err
    assert not list((tmp_path / "new").rglob("*.parquet"))


@pytest.mark.integration
@pytest.mark.parametrize("change", ["looser record rule", "added evaluation set"])
def test_a_rebuild_of_the_sample_with_reuse_writes_the_full_rebuild(sample_dir, sample_build, tmp_path, change):
    """The embedded sample (NSFW on, its evaluation set, ~1,650 records with every planted case), rebuilt from the
    run's sample build: the planted records' twins above, at the sample's size. (Integration: four builds.)"""
    from tests.sample_corpus import build_args

    old = sample_build[0].parent.parent  # the output whose committed version the fixture names
    if change == "looser record rule":
        extra = ["--set", "min_words=2"]
    else:
        (tmp_path / "eval").mkdir()
        table = pq.read_table(next((sample_dir / "candidates").glob("*.parquet")), columns=["jpg"])
        for i, data in enumerate([d for d in table.column("jpg").to_pylist() if d][:20]):
            (tmp_path / "eval" / f"{i}.jpg").write_bytes(data)
        extra = ["--eval_images", f"added={tmp_path / 'eval'}"]
    full_out, reuse_out = tmp_path / "full", tmp_path / "reuse"
    launcher.run(build_args(sample_dir, full_out, *extra))
    launcher.run(build_args(sample_dir, reuse_out, *extra, "--reuse", str(old)))
    full, reused = pathlib.Path(resolve(str(full_out))), pathlib.Path(resolve(str(reuse_out)))
    assert_same_corpus(full, reused)
    note = read_note(reused)
    assert " 0 new" in note and "records' facts reused" in note, note


def test_dataflows_translation_of_a_rebuild_carries_the_reuse_and_says_so(old, tmp_path, capsys):
    """``--dry_run=true``: Dataflow translates the job with its reuse note step; the summary names the old
    version and that workers must reach it."""
    from pipeline.build import dry_run

    root, pattern, _ = old
    jobs = []
    real = dry_run.build_job

    def recording(*args, **kwargs):
        jobs.append(real(*args, **kwargs))
        return jobs[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dry_run, "build_job", recording)
        launcher.main(["--input", pattern, "--output", str(tmp_path / "new"), *BASE, "--reuse", str(root / "old"),
                       "--runner", "DataflowRunner", "--project", "my-project", "--region", "us-central1",
                       "--temp_location", "gs://my-bucket/tmp", "--dry_run=true"])
    printed = capsys.readouterr().out
    old_version = resolve(str(root / "old"))
    assert f"reuses: the facts of {old_version} (1 input file(s)" in printed
    assert old_version in printed.split("cannot reach:")[1]
    names = [t.unique_name for t in jobs[0].proto.components.transforms.values()]
    assert "WriteBuildStats/ReuseNote" in names and "FirstPass/JudgeRecords/ReadAndJudge" in names
    assert not (tmp_path / "new").exists()
