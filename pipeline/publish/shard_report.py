"""The job's report of its shards, ``stats/_shards.json``, and the check that the files are there.

The job writes, per split, lists indexed by shard number::

    {"train": {"records": [...], "bytes": [...], "crc32c": ["<8 hex>", ...]}, ...}

``crc32c`` is the Castagnoli CRC of the whole file (what GCS reports for an
object), as 8 lower-case hex digits. ``check_files`` compares the report
with one listing of the directory: a shard missing or of another size
stops the publication.
"""

from __future__ import annotations

import json
from typing import Dict, List

from apache_beam.io.filesystems import FileSystems

from common.corpus_dir import SHARDS_FILE
from common.schema import shard_filename
from pipeline.publish import tfds_metadata


class ShardsMissing(Exception):
    """The report names shards that are not in the directory, or of another size."""


def read(directory: str, name: str) -> Dict[str, Dict[str, list]]:
    """The report of the job that wrote ``directory``, as ``{split: {"records", "bytes", "crc32c"}}``."""
    with FileSystems.open(FileSystems.join(directory, SHARDS_FILE)) as handle:
        report = json.loads(handle.read())
    return report


def check_files(directory: str, name: str, report: Dict[str, Dict[str, list]]) -> None:
    """Raise ``ShardsMissing`` unless every reported shard is in ``directory`` with its reported size."""
    listed = tfds_metadata.list_shards(directory, name)
    for split, entry in report.items():
        count = len(entry["records"])
        if not (len(entry["bytes"]) == len(entry["crc32c"]) == count):
            raise ShardsMissing(f"{SHARDS_FILE}: split {split!r} lists {count} shards but "
                                f"{len(entry['bytes'])} sizes and {len(entry['crc32c'])} checksums")
        present = listed.get(split, {})
        wrong = [i for i in range(count) if present.get(i) != (count, entry["bytes"][i])]
        if wrong:
            i = wrong[0]
            have = present.get(i)
            what = "missing" if have is None else f"{have[1]} bytes of {have[0]} shards"
            raise ShardsMissing(
                f"{len(wrong):,} shard(s) of split {split!r} in {directory} do not match the job's report, e.g. "
                f"{shard_filename(name, split, i, count)}: {what}, reported {entry['bytes'][i]} bytes")


def lengths(report: Dict[str, Dict[str, list]]) -> Dict[str, List[int]]:
    return {split: list(entry["records"]) for split, entry in report.items()}
