"""The job's report of its shards, ``stats/_shards.json``, and the check that the files are there.

The job writes, per split, lists indexed by shard number::

    {"train": {"records": [...], "bytes": [...], "crc32c": ["<8 hex>", ...]}, ...}

``crc32c`` is the Castagnoli CRC of the whole file (what GCS reports for an
object), as 8 lower-case hex digits. ``check_files`` compares the report
with one listing of the directory: a shard missing or of another size
stops the publication.
"""

from __future__ import annotations

import re
from typing import Dict, List

from apache_beam.io.filesystems import FileSystems

from common import state_files as sf
from common.corpus_dir import SHARDS_FILE
from common.schema import shard_filename
from pipeline.publish import tfds_metadata


class ShardsMissing(Exception):
    """The report names shards that are not in the directory, or of another size."""


#: Shards per split a report may list (a TFDS shard index has 5 digits at least; a million is far beyond any build).
MAX_SHARDS = 1_000_000


def report_schema(doc) -> dict:
    """``stats/_shards.json``: per split, equal-length lists of records, bytes and crc32c (``common.state_files``)."""
    def split(entry, where):
        sf.obj(entry, where)
        for name in ("records", "bytes"):
            for i, value in enumerate(sf.array(sf.field(entry, name, where), f"{where}.{name}", MAX_SHARDS)):
                sf.whole(value, f"{where}.{name}[{i}]")
        for i, value in enumerate(sf.array(sf.field(entry, "crc32c", where), f"{where}.crc32c", MAX_SHARDS)):
            if not (isinstance(value, str) and re.fullmatch(r"[0-9a-f]{8}", value)):
                raise sf.Problem(f"{where}.crc32c[{i}]: {sf.shown(value)}, not 8 hex digits")

    return sf.mapping(doc, "", split, max_len=100)


def read(directory: str, name: str) -> Dict[str, Dict[str, list]]:
    """The report of the job that wrote ``directory``, as ``{split: {"records", "bytes", "crc32c"}}``;
    ``common.state_files.DamagedFile`` if it is damaged."""
    path = FileSystems.join(directory, SHARDS_FILE)
    report = sf.read_json(path, report_schema)
    if report is None:
        raise FileNotFoundError(path)
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
