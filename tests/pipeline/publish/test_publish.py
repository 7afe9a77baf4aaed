"""Publishing on local files: one-object commit, a crash before it, resume, a failed rebuild, concurrent
builds, shard counts past 99,999; ``tfds.builder_from_directory(OUTPUT)`` reads what is committed."""

import json
import multiprocessing
import os
import subprocess
import sys

import pytest

import repo_root
from common import corpus_dir
from pipeline.funnel.accounting import AccountingError
from pipeline.publish import commit
from pipeline.publish import publisher as publish
from tests.pipeline import publish_cases
from tests.pipeline.publish import commit_race
from tests.pipeline.build.test_build_safety import write_candidates

ROOT = repo_root.ROOT


@pytest.fixture
def pattern(tmp_path):
    return write_candidates(tmp_path / "in", rows=12)


def test_commit_crash_and_resume(pattern, tmp_path):
    publish_cases.commit_and_resume(pattern, str(tmp_path / "out"))


def test_failed_rebuild_leaves_the_previous_corpus(pattern, tmp_path, monkeypatch):
    publish_cases.failed_rebuild_keeps_the_corpus(pattern, str(tmp_path / "out"), monkeypatch)


def test_concurrent_builds(pattern, tmp_path):
    publish_cases.concurrent_builds(pattern, str(tmp_path / "out"))


def test_glob_characters_in_the_output(pattern, tmp_path):
    publish_cases.glob_characters_in_the_output(pattern, str(tmp_path))


def test_tfds_reads_the_committed_version_and_the_cli_resumes(pattern, tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    out = tmp_path / "out"
    publish_cases.build(pattern, str(out), "--detached")
    assert not (out / "dataset_info.json").exists()
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", ALT_TEXT_CORPUS_LOG_DIR=str(tmp_path / "logs"))
    done = subprocess.run([sys.executable, "-m", "pipeline.publish", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "committed" in done.stdout.splitlines()[-1]
    builder = tfds.builder_from_directory(str(out))
    keys = sorted(x["key"].numpy() for split in builder.info.splits for x in builder.as_dataset(split=split))
    version, seen = publish_cases.visible(str(out))
    assert [k.decode() for k in keys] == sorted(k for v in seen.values() for k in v)
    assert all(s.filename_template.template.startswith(f"versions/{version}/") for s in builder.info.splits.values())
    again = subprocess.run([sys.executable, "-m", "pipeline.publish", str(out)], cwd=ROOT, env=env,
                           capture_output=True, text=True)
    assert again.returncode == 0 and "was already committed" in again.stdout


def test_of_two_commits_from_the_same_state_one_wins(tmp_path):
    """Two processes commit at once, both expecting the output they started from: one lands, one is refused."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    start = commit.read(str(tmp_path)).token
    procs = [ctx.Process(target=commit_race.commit_from, args=(str(tmp_path), f"{{\"n\": {i}}}".encode(), start, queue))
             for i in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join()
    (winner,) = [r for r in results if r != "conflict"]
    assert results.count("conflict") == 1 and winner in ('{"n": 0}', '{"n": 1}')
    assert (tmp_path / "dataset_info.json").read_text() == winner
    assert sorted(os.listdir(tmp_path)) == ["dataset_info.json"]


def fake_version(out, version, shards):
    """A finished job's version directory with ``shards`` empty train shard files, made without Beam."""
    from common.schema import shard_filename

    directory = out / "versions" / version
    (directory / "stats").mkdir(parents=True)
    for split, count in shards.items():
        for index in range(count):
            (directory / shard_filename("c", split, index, count)).touch()
    report = {split: {"records": [0] * n, "bytes": [0] * n, "crc32c": ["00000000"] * n} for split, n in shards.items()}
    (directory / "stats" / "_shards.json").write_text(json.dumps(report))
    (directory / "stats" / "funnel.json").write_text(json.dumps(
        {"input": 0, "written": {s: 0 for s in shards}, "rejected_total": 0, "conserved": True, "stages": []}))
    (directory / "stats" / "candidates").mkdir()
    (directory / "stats" / "candidates" / "_summary.json").write_text(json.dumps({"rows": 0, "fates": {}, "files": {}}))
    publish.write_request(str(directory), {
        "version": version, "name": "c", "dataset_version": "1.0.0", "description": "empty shards",
        "carried": [], "concepts": False, "expects": "0", "replaces": None, "keep_previous": False})
    return directory


# 100,001 shard files, made and checked one by one (6 CPU-seconds): CI's integration run. Its light twin below
# publishes a few shards the same way and checks the names past 99,999 shards without making the files.
@pytest.mark.integration
def test_a_split_of_100001_shards_is_published_and_loads_with_tfds(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    out = tmp_path / "out"
    version = "20250101T000000Z-0123abcd"
    directory = fake_version(out, version, {"train": 100_001, "validation": 1})
    assert (directory / "c-train.tfrecord-100000-of-100001").exists()
    result = publish.publish(str(out))
    assert result.version == version
    assert corpus_dir.resolve(str(out)) == str(directory)
    info = tfds.builder_from_directory(str(out)).info
    assert info.splits["train"].num_shards == 100_001 and info.splits["train"].num_examples == 0
    paths = info.splits["train"].filename_template.sharded_filepaths(100_001)
    assert os.path.exists(paths[-1]) and paths[-1].name == "c-train.tfrecord-100000-of-100001"


def test_a_split_of_a_few_shards_is_published_and_loads_with_tfds_whose_names_past_99999_are_ours(tmp_path):
    from common.schema import shard_filename

    tfds = pytest.importorskip("tensorflow_datasets")
    out = tmp_path / "out"
    version = "20250101T000000Z-0123abcd"
    directory = fake_version(out, version, {"train": 3, "validation": 1})
    result = publish.publish(str(out))
    assert result.version == version
    assert corpus_dir.resolve(str(out)) == str(directory)
    info = tfds.builder_from_directory(str(out)).info
    assert info.splits["train"].num_shards == 3 and info.splits["train"].num_examples == 0
    template = info.splits["train"].filename_template
    paths = template.sharded_filepaths(3)
    assert os.path.exists(paths[-1]) and paths[-1].name == "c-train.tfrecord-00002-of-00003"
    # Past 99,999 shards the numbers take six digits: the writer's name of the last one is the one tfds reads.
    last = template.sharded_filepath(shard_index=100_000, num_shards=100_001)
    assert last.name == shard_filename("c", "train", 100_000, 100_001) == "c-train.tfrecord-100000-of-100001"


def test_a_missing_shard_stops_the_publication(tmp_path):
    out = tmp_path / "out"
    directory = fake_version(out, "20250101T000000Z-0123abcd", {"train": 3, "validation": 1})
    os.remove(directory / "c-train.tfrecord-00001-of-00003")
    with pytest.raises(publish.PublishError, match=r"c-train.tfrecord-00001-of-00003: missing"):
        publish.publish(str(out))
    assert not (out / "dataset_info.json").exists()


def test_a_candidate_table_short_of_a_row_stops_the_publication(tmp_path):
    out = tmp_path / "out"
    directory = fake_version(out, "20250101T000000Z-0123abcd", {"train": 1, "validation": 1})
    (directory / "stats" / "funnel.json").write_text(json.dumps(
        {"input": 1, "written": {"train": 0, "validation": 0}, "rejected_total": 1, "conserved": True,
         "stages": [{"stage": "text", "in": 1, "out": 0, "rejected": {"text/empty": 1}}]}))
    with pytest.raises(AccountingError, match=r"the candidate table.s rows stand for 0 records, the funnel.s input is 1"):
        publish.publish(str(out))
    assert not (out / "dataset_info.json").exists()


def test_an_old_corpus_of_the_plain_layout_is_read_and_replaced(pattern, tmp_path):
    """A corpus of the plain layout (shards at the top, COMPLETED): readers resolve it to itself; a new
    build's commit takes its place and only then are its files deleted."""
    from pipeline.publish import output_contract as output
    from pipeline.publish.tfds_metadata import write_metadata as write_tfds_metadata
    from pipeline.write.shards import write_contiguous_shards

    out = tmp_path / "out"
    out.mkdir()
    lengths = {"train": write_contiguous_shards(str(out), "alt_text_corpus", "train", [], 1),
               "validation": write_contiguous_shards(str(out), "alt_text_corpus", "validation", [], 1)}
    write_tfds_metadata(str(out), "alt_text_corpus", lengths, "old")
    (out / "COMPLETED").touch()
    assert corpus_dir.resolve(str(out)) == str(out)
    publish_cases.build(pattern, str(out), "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == sorted([output.MARKER, "dataset_info.json", "features.json",
                                                            "versions"])
    assert publish_cases.visible(str(out))[0] == corpus_dir.list_versions(str(out))[0]
