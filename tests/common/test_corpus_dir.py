"""Which directory a reader opens: the committed version, a plain-layout corpus, a version given directly."""

import json

import pytest

from common import corpus_dir

VERSION = "20250101T000000Z-0123abcd"


def commit_naming(output, version):
    split = {"name": "train", "filepathTemplate": f"versions/{version}/{{DATASET}}-{{SPLIT}}.{{FILEFORMAT}}-{{SHARD_X_OF_Y}}"}
    (output / "dataset_info.json").write_text(json.dumps({"name": "c", "splits": [split]}))


def test_an_output_resolves_to_its_committed_version_only(tmp_path):
    older, newer = tmp_path / "versions" / VERSION, tmp_path / "versions" / "20260101T000000Z-0123abcd"
    for version in (older, newer):
        version.mkdir(parents=True)
        (version / "manifest.json").write_text("{}")
    commit_naming(tmp_path, VERSION)
    assert corpus_dir.resolve(str(tmp_path)) == str(older)  # the newer one was never committed
    assert corpus_dir.resolve(str(newer)) == str(newer)  # a finished version, named directly
    assert corpus_dir.list_versions(str(tmp_path)) == [VERSION, newer.name]


def test_an_output_with_nothing_committed_is_refused_in_one_line_unless_allowed(tmp_path):
    (tmp_path / "versions" / VERSION).mkdir(parents=True)
    (tmp_path / "versions" / VERSION / "_BUILD.json").write_text("{}")
    with pytest.raises(corpus_dir.IncompleteCorpus, match=r"no committed corpus.*pipeline.publish.*--flag") as error:
        corpus_dir.resolve(str(tmp_path), flag="--flag")
    assert "\n" not in str(error.value)
    assert corpus_dir.resolve(str(tmp_path), allow_incomplete=True) == str(tmp_path / "versions" / VERSION)


def test_the_plain_layout_is_itself_when_completed(tmp_path):
    (tmp_path / "dataset_info.json").write_text(json.dumps({"name": "c", "splits": [
        {"name": "train", "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"}]}))
    with pytest.raises(corpus_dir.IncompleteCorpus, match="has no COMPLETED"):
        corpus_dir.resolve(str(tmp_path))
    (tmp_path / "COMPLETED").touch()
    assert corpus_dir.resolve(str(tmp_path)) == str(tmp_path)
    assert corpus_dir.read_dir(str(tmp_path / "missing")) == str(tmp_path / "missing")
