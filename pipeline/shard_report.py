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

from common.schema import shard_filename
from pipeline import tfds_metadata
from pipeline.write import SHARDS_FILE



class ShardsMissing(Exception):
    """The report names shards that are not in the directory, or of another size."""


def read(directory: str, name: str) -> Dict[str, Dict[str, list]]:
    """The report of the job that wrote ``directory``, as ``{split: {"records", "bytes", "crc32c"}}``."""
    with FileSystems.open(FileSystems.join(directory, SHARDS_FILE)) as handle:
        report = json.loads(handle.read())
    return fill_in_legacy(directory, name, report)


def fill_in_legacy(directory: str, name: str, report: dict) -> Dict[str, Dict[str, list]]:
    """ADAPTER, to delete once the job reports bytes and crc32c itself.

    A job of the old writer reports ``{split: [records per shard]}``; the
    bytes and CRCs are then read here from the files (the launcher reads the
    whole corpus once: fine on test data, slow on a real one).
    """
    import google_crc32c

    filled = {}
    for split, entry in report.items():
        if isinstance(entry, dict):
            filled[split] = entry
            continue
        sizes, crcs = [], []
        for index in range(len(entry)):
            checksum = google_crc32c.Checksum()
            size = 0
            with FileSystems.open(FileSystems.join(directory, shard_filename(name, split, index, len(entry))),
                                  compression_type="uncompressed") as handle:
                while chunk := handle.read(1 << 22):
                    checksum.update(chunk)
                    size += len(chunk)
            sizes.append(size)
            crcs.append(checksum.digest().hex())
        filled[split] = {"records": list(entry), "bytes": sizes, "crc32c": crcs}
    return filled


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
