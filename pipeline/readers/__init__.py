"""Input formats: one module per format, chosen by file name (``--input_format`` overrides).

| format | files | module |
|---|---|---|
| ``parquet`` | ``*.parquet`` (img2dataset ``--output_format parquet``, Hugging Face, Spark) | ``parquet`` |
| ``webdataset`` | ``*.tar`` (img2dataset ``--output_format webdataset``, with its ``*.parquet``) | ``webdataset`` |
| ``files`` | ``NNNNN.parquet`` + folder ``NNNNN/`` (img2dataset ``--output_format files``) | ``folders`` |
| ``tsv`` | ``*.tsv``, ``*.tsv.gz`` (CC3M/CC12M URL lists) | ``tsv`` |
| ``jsonl`` | ``*.jsonl``, ``*.jsonl.gz`` (URL lists) | ``jsonl`` |
| ``tfrecord`` | ``*.tfrecord``, ``*.tfrecord-00000-of-00016``, ``*.tfrec`` (``tf.train.Example``) | ``tfrecord`` |

Each module has ``read_file(path, columns)`` (every record of one file, a
``Candidate`` or a ``Rejection`` each; rules in ``rows``; what it cannot
read, one marker record counting it: ``losses``; nothing held past the caps
of ``columns.limits``: ``limits``) and ``expected_records(path, columns)``
(the count the file itself states, or None). The same bytes and columns
give the same records in the same order. Files that are not data (``*_stats.json``, ``_SUCCESS``, hidden
files, a TFDS directory's ``dataset_info.json``/``features.json``/
``COMPLETED``) are never read or counted.
"""

from __future__ import annotations

import posixpath
import re
from typing import Optional

from pipeline.readers import folders, jsonl, parquet, tfrecord, tsv, webdataset

FORMATS = {
    "parquet": parquet,
    "webdataset": webdataset,
    "files": folders,
    "tsv": tsv,
    "jsonl": jsonl,
    "tfrecord": tfrecord,
}

_COMPRESSED = re.compile(r"\.(gz|bz2|zst|deflate)$")
_BY_NAME = (
    (re.compile(r"\.parquet$"), "parquet"),
    (re.compile(r"\.tar$"), "webdataset"),
    (re.compile(r"\.tsv$"), "tsv"),
    (re.compile(r"\.(jsonl|ndjson)$"), "jsonl"),
    (re.compile(r"\.(tfrecords?|tfrec)(-\d+-of-\d+)?$"), "tfrecord"),
)
NON_DATA_NAMES = frozenset({"dataset_info.json", "features.json", "COMPLETED", "image.image.json"})


def base_name(path: str) -> str:
    return posixpath.basename(path.replace("\\", "/").rstrip("/"))


def is_non_data(path: str) -> bool:
    """Bookkeeping next to data: downloader stats, Spark/Hadoop markers, hidden files, TFDS metadata."""
    name = base_name(path)
    return name.startswith(("_", ".")) or name.endswith("_stats.json") or name in NON_DATA_NAMES


def format_by_name(path: str) -> Optional[str]:
    name = _COMPRESSED.sub("", base_name(path).lower())
    for pattern, fmt in _BY_NAME:
        if pattern.search(name):
            return fmt
    return None


def format_of(path: str, override: Optional[str] = None) -> Optional[str]:
    """The format to read ``path`` with: ``override`` if given, else by its name (None: unknown)."""
    if override:
        if override not in FORMATS:
            raise ValueError(f"unknown input format {override!r}; one of {', '.join(FORMATS)}")
        return override
    return format_by_name(path)
