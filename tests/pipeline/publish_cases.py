"""What a build's publication must guarantee, written once for any storage the output may be on.

Each case takes an output path (a local directory or ``gs://`` on the
storage emulator) and a small Parquet input; the real build runs (Beam's
FnApiRunner in this process). ``test_publish.py`` runs them on local
files, ``test_publish_gcs.py`` through Beam's GCS filesystem.

A "crash between the shards and the commit" is a ``--detached`` build: its
job has written every shard and stat and the launcher returned before
publishing, exactly the state a launcher killed after ``wait_until_finish``
leaves behind.
"""

import json

import pytest
from apache_beam.io.filesystems import FileSystems

from common import corpus_dir
from common import tfrecord_io as tfrecord
from common.schema import shard_filename
from pipeline.build import launcher
from pipeline.publish import commit
from pipeline.publish import output_contract as output
from pipeline.publish import publisher as publish

QUICK = ["--set", "vocab_size=0", "--set", "nsfw_threshold=1.0", "--set", "min_shorter_side=0",
         "--set", "min_words=1", "--set", "validation_fraction=0.3"]


def build(pattern, out, *extra):
    return launcher.run(["--input", str(pattern), "--output", out, *QUICK, *extra])


def files_of(out):
    """{relative path: bytes} of everything under ``out``."""
    result = {}
    for relative in output.list_files(out):
        with FileSystems.open(FileSystems.join(out, relative), compression_type="uncompressed") as handle:
            result[relative] = handle.read()
    return result


def visible(out):
    """What a reader sees: (version, {split: sorted keys}) read through the commit object and the shards."""
    directory = corpus_dir.resolve(out)
    info = json.loads(commit.read(out).data)
    keys = {}
    for split in info["splits"]:
        count = len(split["shardLengths"])
        for index in range(count):
            directory_part = split["filepathTemplate"].rpartition("/")[0]
            path = FileSystems.join(out, directory_part, shard_filename(info["name"], split["name"], index, count))
            with FileSystems.open(path, compression_type="uncompressed") as handle:
                for payload in tfrecord.read_frames(handle):
                    keys.setdefault(split["name"], []).append(tfrecord.decode_example(payload)["key"][0].decode())
    assert sum(len(v) for v in keys.values()) == sum(int(n) for s in info["splits"] for n in s["shardLengths"])
    return directory.rstrip("/").rsplit("/", 1)[-1], {split: sorted(v) for split, v in keys.items()}


def versions(out):
    return corpus_dir.list_versions(out)


def commit_and_resume(pattern, out):
    """A build commits; a second build's job finishes but is not published: readers still see the first,
    byte for byte; publishing it (twice) commits it and removes the first."""
    funnel = build(pattern, out)
    first, seen = visible(out)
    assert sum(len(v) for v in seen.values()) == sum(funnel["written"].values()) > 0
    before = files_of(out)

    assert build(pattern, out, "--overwrite", "--detached") == {}
    (pending,) = [v for v in versions(out) if v != first]
    after = files_of(out)
    assert {k: v for k, v in after.items() if not k.startswith(f"versions/{pending}/")} == before
    assert visible(out) == (first, seen)

    result = publish.publish(out)
    assert (result.version, result.replaced, result.already) == (pending, first, False) and result.deleted > 0
    assert visible(out) == (pending, seen)  # the same input: the same records
    assert versions(out) == [pending]
    manifest = json.loads(files_of(out)[f"versions/{pending}/manifest.json"])
    assert manifest["replaces"] == first and manifest["conservation"].startswith("input ")
    again = publish.publish(out)
    assert again.already and visible(out) == (pending, seen)


def failed_rebuild_keeps_the_corpus(pattern, out, monkeypatch):
    """--overwrite whose job fails: the previous corpus is there, unchanged, and still the one committed."""
    from pipeline.write import shards

    build(pattern, out)
    before, seen = files_of(out), visible(out)

    def disk_full(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(shards.ShardWriter, "write", disk_full)
    with pytest.raises(Exception, match="no space left"):
        build(pattern, out, "--overwrite")
    monkeypatch.undo()
    after = files_of(out)
    (failed,) = [v for v in versions(out) if v != seen[0]]
    assert {k: v for k, v in after.items() if not k.startswith(f"versions/{failed}/")} == before
    assert visible(out) == seen
    with pytest.raises(publish.PublishError, match="has not finished"):
        publish.publish(out, failed)
    assert files_of(out) == after


def concurrent_builds(pattern, out):
    """Two builds run at once: the first to finish commits; the second's commit is refused with its
    version intact, and --replace commits it over the first."""
    build(pattern, out, "--detached")
    build(pattern, out, "--overwrite", "--detached")  # started before the first one was published
    a, b = versions(out)
    publish.publish(out, a)
    committed_a = files_of(out)
    with pytest.raises(commit.CommitConflict, match=f"--build {b} --replace"):
        publish.publish(out, b)
    assert files_of(out) == committed_a
    result = publish.publish(out, b, replace=True)
    assert result.replaced == a and visible(out)[0] == b and versions(out) == [b]


def glob_characters_in_the_output(pattern, base):
    """An output named with every glob character builds, commits and is overwritten as the literal directory it
    names, beside a neighbour its name matches as a pattern (``c1x``), which stays as it was."""
    neighbour = FileSystems.join(base, "c1x")
    build(pattern, neighbour)
    theirs = files_of(neighbour)
    out = FileSystems.join(base, "c[12]?*")  # [12] matches the 1, ? the x, * nothing
    funnel = build(pattern, out)
    first, seen = visible(out)
    assert sum(len(v) for v in seen.values()) == sum(funnel["written"].values()) > 0
    build(pattern, out, "--overwrite")
    second, again = visible(out)
    assert second != first and again == seen and versions(out) == [second]
    assert files_of(neighbour) == theirs
