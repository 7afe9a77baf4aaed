"""The output contract on real directories: what --overwrite accepts and later deletes, locations, globs."""

import json

import pytest

from common import files
from pipeline.publish import output_contract as output


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
    assert output.plan_output(str(tmp_path / "new"), overwrite=False).files == []
    (tmp_path / "empty").mkdir()
    assert output.plan_output(str(tmp_path / "empty"), overwrite=False).files == []


def test_non_empty_output_needs_overwrite(tmp_path):
    fake_corpus(tmp_path / "out")
    with pytest.raises(output.OutputRefused, match="--overwrite"):
        output.plan_output(str(tmp_path / "out"), overwrite=False)


def test_overwrite_deletes_nothing_first_then_exactly_the_replaced_build_files(tmp_path):
    files = fake_corpus(tmp_path / "out")
    new = ["versions/20250101T000000Z-0123abcd/" + f for f in ("_BUILD.json", "manifest.json", "stats/funnel.json",
                                                               "alt_text_corpus-train.tfrecord-000000-of-100000")]
    for relative in new:
        (tmp_path / "out" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "out" / relative).write_text("x")
    plan = output.plan_output(str(tmp_path / "out"), overwrite=True)
    assert sorted(plan.files) == sorted(files + [output.MARKER] + new)
    assert len(list((tmp_path / "out").rglob("*.*"))) >= len(files)  # planning touched nothing
    # The plain-layout corpus was replaced by the new version: its files go; the marker, the commit and
    # features.json (TFDS's by-name lookup needs one beside the commit) stay.
    doomed = output.replaced_files(plan.files, "alt_text_corpus", "")
    assert sorted(doomed) == sorted(f for f in files if f not in ("dataset_info.json", "features.json"))
    output.delete_files(str(tmp_path / "out"), doomed)
    assert sorted(output.list_files(str(tmp_path / "out"))) == sorted(
        ["dataset_info.json", "features.json", output.MARKER] + new)
    assert sorted(output.replaced_files(output.list_files(str(tmp_path / "out")), "alt_text_corpus",
                                        "20250101T000000Z-0123abcd")) == sorted(new)


def test_shard_names_of_a_million_shards_are_owned(tmp_path):
    from common.schema import shard_filename

    name = shard_filename("c", "train", 999_999, 1_000_000)
    assert name == "c-train.tfrecord-0999999-of-1000000"
    assert output.owned_by_build(name, "c") and output.owned_by_build(f"versions/20250101T000000Z-0123abcd/{name}", "c")
    assert output.owned_by_build(f"concepts/{name}.json", "c")
    assert not output.owned_by_build("versions/not-a-version/" + name, "c")


def test_every_file_a_build_writes_into_its_version_is_owned():
    """What --overwrite may delete: the candidate table, --webdataset's tars and list, the NSFW gallery."""
    version = "versions/20250101T000000Z-0123abcd/"
    for inside in ("stats/candidates/part-00000-of-00003.parquet", "stats/candidates/_summary.json",
                   "train/00000.tar", "validation/00012.tar", "stats/_webdataset.json", "stats/nsfw_gallery.jsonl"):
        assert output.owned_by_build(version + inside, "c"), inside
    assert not output.owned_by_build(version + "train/notes.tar.bak", "c")


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
    assert sorted(output.plan_output(str(tmp_path / "old"), overwrite=True).files) == sorted(files)


def test_glob_characters_in_the_output_are_literal(tmp_path):
    star = tmp_path / "out*"
    fake_corpus(star)
    neighbour = fake_corpus(tmp_path / "out1")
    plan = output.plan_output(str(star), overwrite=True)
    output.delete_files(str(star), plan.files)
    assert not any(star.rglob("*"))
    assert all((tmp_path / "out1" / f).exists() for f in neighbour)
    bracket = tmp_path / "o[u]t"
    fake_corpus(bracket)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    output.delete_files(str(bracket), output.plan_output(str(bracket), overwrite=True).files)
    assert (tmp_path / "out" / "keep").exists() and not any(bracket.rglob("*"))


def test_escape_glob_matches_only_itself(tmp_path):
    from apache_beam.io.filesystems import FileSystems

    (tmp_path / "a*b").write_text("1")
    (tmp_path / "axxb").write_text("2")
    (tmp_path / "a[x]b").write_text("3")
    for name in ("a*b", "a[x]b"):
        (result,) = FileSystems.match([files.escape_glob(str(tmp_path / name))])
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
