"""``dataset_info.json`` and ``features.json`` without TensorFlow Datasets.

The launcher writes these two files after the job so that
``tfds.builder_from_directory(out)`` (and big_vision, and our trainer) load
the corpus. TFDS itself would write them with
``tfds.folder_dataset.write_metadata``, but TFDS pulls in TensorFlow: a
Dataflow launcher installed with the base requirements has neither. The
files are plain JSON, so they are built here from ``common.schema``: the
same bytes TFDS writes for our features (``tests/pipeline/publish/test_tfds_metadata.py``
compares the two when TFDS is installed).

Shard sizes come from one listing of the output (``list_shard_sizes``: a
single ``FileSystems.match`` of a glob), not one call per shard: a 1B-row
corpus has ~10^5 shards, and each match is a GCS request.
"""

from __future__ import annotations

import json
import re
from typing import Dict, List, Mapping, Sequence

from apache_beam.io.filesystems import FileSystems

from common.schema import FEATURES, SPLITS, carried_features, concepts_features

FILE_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_TFDS = "tensorflow_datasets.core.features."
_CLASS = {"image": _TFDS + "image_feature.Image", "text": _TFDS + "text_feature.Text", "scalar": _TFDS + "scalar.Scalar"}


def _feature(kind: str, dtype: str, doc: str) -> dict:
    entry = {"description": doc, "pythonClassName": _CLASS[kind]}
    if kind == "image":
        entry["image"] = {"dtype": "uint8", "encodingFormat": "jpeg", "shape": {"dimensions": ["-1", "-1", "3"]}}
    elif kind == "text":
        entry["text"] = {}
    else:
        entry["tensor"] = {"dtype": dtype, "encoding": "none", "shape": {}}
    return entry


def features_json(carried: Sequence[str] = (), concepts: bool = False) -> str:
    """``features.json`` of the shards' features (``FEATURES``) plus ``source_<column>`` for ``carried``
    and, for a build with ``--concepts``, ``concepts``."""
    extra = {**carried_features(carried), **(concepts_features() if concepts else {})}
    features = {name: _feature(*spec) for name, spec in {**FEATURES, **extra}.items()}
    document = {"featuresDict": {"features": features}, "pythonClassName": _TFDS + "features_dict.FeaturesDict"}
    return json.dumps(document, indent=4, sort_keys=True)


def dataset_info_json(
    name: str, shard_lengths: Mapping[str, List[int]], split_bytes: Mapping[str, int], description: str,
    version: str = "1.0.0", directory: str = "", features: str = "",
) -> str:
    """``dataset_info.json``: name, version, and per split its shard lengths and bytes.

    Protobuf's JSON form, as TFDS writes it: int64 values as strings,
    fields at their default (0, "") left out, keys sorted.
    ``directory`` (relative, e.g. ``versions/<id>``) goes in front of every
    shard path (``filepathTemplate``); ``features`` (``features_json``) is
    then carried inside, since TFDS reads a ``features`` field before any
    ``features.json`` beside the file: the file alone describes the corpus.
    """
    splits = []
    for split in SPLITS:
        lengths = shard_lengths.get(split)
        if not lengths:
            continue
        template = f"{directory.strip('/')}/{FILE_TEMPLATE}" if directory else FILE_TEMPLATE
        entry = {"filepathTemplate": template, "name": split}
        if split_bytes.get(split, 0):
            entry["numBytes"] = str(int(split_bytes[split]))
        entry["shardLengths"] = [str(int(n)) for n in lengths]
        splits.append(entry)
    info = {"fileFormat": "tfrecord", "name": name, "splits": splits, "version": version}
    if description:
        info["description"] = description
    if features:
        info["features"] = json.loads(features)
    return json.dumps(dict(sorted(info.items())), indent=2)


def list_shard_sizes(output_dir: str, name: str) -> Dict[str, Dict[int, int]]:
    """``{split: {shard index: bytes}}`` of ``<name>-<split>.tfrecord-NNNNN-of-MMMMM`` in ``output_dir``: one match."""
    return {split: {index: size for index, (_, size) in shards.items()}
            for split, shards in list_shards(output_dir, name).items()}


#: A shard's file name: TFDS pads both numbers to at least 5 digits, more from 100,000 shards on.
SHARD_NAME = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]*)-(?P<split>[^-/]+)\.tfrecord-(?P<index>\d{5,})-of-(?P<count>\d{5,})$")


def list_shards(directory: str, name: str) -> Dict[str, Dict[int, tuple]]:
    """``{split: {index: (shard count in its name, bytes)}}`` of the shard files of ``name`` in ``directory``: one listing."""
    from common.files import escape_glob

    pattern = FileSystems.join(escape_glob(directory), escape_glob(name) + "-*.tfrecord-*-of-*")
    found: Dict[str, Dict[int, tuple]] = {}
    for metadata in FileSystems.match([pattern])[0].metadata_list:
        shard = SHARD_NAME.fullmatch(metadata.path.rstrip("/").rsplit("/", 1)[-1])
        if shard and shard["name"] == name:
            found.setdefault(shard["split"], {})[int(shard["index"])] = (int(shard["count"]), metadata.size_in_bytes)
    return found


def split_bytes(output_dir: str, name: str, shard_lengths: Mapping[str, List[int]]) -> Dict[str, int]:
    """Bytes per split of the shards ``shard_lengths`` names; a listed shard that is missing is an error."""
    listed = list_shard_sizes(output_dir, name)
    totals = {}
    for split, lengths in shard_lengths.items():
        sizes = listed.get(split, {})
        missing = [i for i in range(len(lengths)) if i not in sizes]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} shard(s) of split {split!r} missing in {output_dir}, e.g. index {missing[0]}")
        totals[split] = sum(sizes[i] for i in range(len(lengths)))
    return totals


def _write(path: str, text: str) -> None:
    with FileSystems.create(path) as handle:
        handle.write(text.encode("utf-8"))


def write_metadata(
    output_dir: str, name: str, shard_lengths: Mapping[str, List[int]], description: str,
    carried: Sequence[str] = (), version: str = "1.0.0", concepts: bool = False,
) -> None:
    """``dataset_info.json`` + ``features.json`` for the shards in ``output_dir``."""
    sizes = split_bytes(output_dir, name, shard_lengths)
    _write(FileSystems.join(output_dir, "features.json"), features_json(carried, concepts))
    _write(FileSystems.join(output_dir, "dataset_info.json"),
           dataset_info_json(name, shard_lengths, sizes, description, version))
