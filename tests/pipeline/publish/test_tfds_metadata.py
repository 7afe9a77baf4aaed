"""The launcher's TFDS metadata: TFDS's own bytes without TFDS, from one listing of the shards."""

import json
import os
import sys

import pytest
from apache_beam.io.filesystems import FileSystems

from common.schema import SPLITS, carried_features, shard_filename
from pipeline.publish import tfds_metadata


def write_shards(directory, name, shard_lengths):
    for split, lengths in shard_lengths.items():
        for index, length in enumerate(lengths):
            path = os.path.join(directory, shard_filename(name, split, index, len(lengths)))
            with open(path, "wb") as handle:
                handle.write(b"x" * (100 * length + index))


def tfds_reference(directory, name, shard_lengths, description, carried, version):
    """What the launcher wrote with TFDS before: write_metadata, then the dataset's own name."""
    tfds = pytest.importorskip("tensorflow_datasets")
    from common.schema import tfds_features

    split_infos = []
    for split in SPLITS:
        lengths = shard_lengths.get(split)
        if not lengths:
            continue
        paths = [os.path.join(directory, shard_filename(name, split, i, len(lengths))) for i in range(len(lengths))]
        split_infos.append(tfds.core.SplitInfo(
            name=split, shard_lengths=list(lengths), num_bytes=sum(os.path.getsize(p) for p in paths),
            filename_template=tfds.core.ShardedFileTemplate(
                data_dir=directory, template=tfds_metadata.FILE_TEMPLATE, dataset_name=name, split=split,
                filetype_suffix="tfrecord")))
    tfds.folder_dataset.write_metadata(
        data_dir=directory, features=tfds_features(carried_features(carried)), split_infos=split_infos,
        filename_template=tfds_metadata.FILE_TEMPLATE, description=description, version=version, check_data=False)
    info_path = os.path.join(directory, "dataset_info.json")
    with open(info_path) as handle:
        info = json.load(handle)
    info["name"] = name
    with open(info_path, "w") as handle:
        handle.write(json.dumps(info, indent=2))
    return {f: open(os.path.join(directory, f), "rb").read() for f in ("dataset_info.json", "features.json")}


@pytest.mark.parametrize("shard_lengths, carried, version", [
    ({"train": [1445, 1443], "validation": [163]}, ("key", "sha256"), "1.0.0"),
    ({"train": [3], "validation": [0]}, (), "2.1.0"),
    ({"train": [0], "validation": [0]}, ("caption", "id"), "1.0.0"),  # an empty corpus
])
def test_metadata_bytes_equal_what_tfds_writes(tmp_path, shard_lengths, carried, version):
    ours, theirs = tmp_path / "ours", tmp_path / "tfds"
    for directory in (ours, theirs):
        directory.mkdir()
        write_shards(str(directory), "corpus_x", shard_lengths)
    expected = tfds_reference(str(theirs), "corpus_x", shard_lengths, "a test corpus", carried, version)
    tfds_metadata.write_metadata(str(ours), "corpus_x", shard_lengths, "a test corpus", carried, version)
    assert {f: (ours / f).read_bytes() for f in expected} == expected


def test_metadata_is_written_without_tensorflow_datasets_from_one_listing(tmp_path, monkeypatch):
    # A launcher installed with the base requirements has no TFDS (nor TF).
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    lengths = {"train": [5, 4, 6, 5, 5], "validation": [2]}
    write_shards(str(tmp_path), "corpus", lengths)
    # A neighbour whose name ends like ours, and another dataset in the same folder, are not ours.
    (tmp_path / "xcorpus-train.tfrecord-00000-of-00001").write_bytes(b"y" * 999)
    (tmp_path / "other-train.tfrecord-00000-of-00001").write_bytes(b"y" * 999)
    calls = []
    real_match = FileSystems.match
    monkeypatch.setattr(FileSystems, "match", lambda patterns, *a, **k: calls.append(patterns) or real_match(patterns, *a, **k))

    tfds_metadata.write_metadata(str(tmp_path), "corpus", lengths, "desc", ("key",))
    assert len(calls) == 1  # one listing, whatever the number of shards
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    train = sum(100 * n + i for i, n in enumerate(lengths["train"]))
    assert [(s["name"], s["shardLengths"], s["numBytes"]) for s in info["splits"]] == [
        ("train", ["5", "4", "6", "5", "5"], str(train)), ("validation", ["2"], "200")]
    features = json.loads((tmp_path / "features.json").read_text())["featuresDict"]["features"]
    assert "source_key" in features and "image" in features


def test_a_missing_shard_is_an_error(tmp_path):
    write_shards(str(tmp_path), "corpus", {"train": [1, 1, 1]})
    os.remove(tmp_path / "corpus-train.tfrecord-00001-of-00003")
    with pytest.raises(FileNotFoundError, match="1 shard"):
        tfds_metadata.write_metadata(str(tmp_path), "corpus", {"train": [1, 1, 1]}, "desc")


def test_the_written_metadata_loads_with_tfds(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    from common import tfrecord_io as tfrecord

    lengths = {"train": [2], "validation": [1]}
    for split, (n,) in lengths.items():
        records = [tfrecord.encode_example({"image": b"", "texts": f"t{i}", "key": f"k{i}", "url": "u", "width": 1,
                                            "height": 1, "original_width": 1, "original_height": 1, "sha256": "",
                                            "phash": ""}) for i in range(n)]
        with FileSystems.create(str(tmp_path / shard_filename("corpus", split, 0, 1))) as handle:
            tfrecord.write_records(handle, records)
    tfds_metadata.write_metadata(str(tmp_path), "corpus", lengths, "desc")
    builder = tfds.builder_from_directory(str(tmp_path))
    assert builder.info.splits["train"].num_examples == 2 and builder.info.name == "corpus"
