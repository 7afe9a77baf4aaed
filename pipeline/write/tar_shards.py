"""WebDataset shards as img2dataset writes them: ``<split>/00000.tar``, three members per record.

    --webdataset:   VERSION/train/00000.tar, 00001.tar, ...   VERSION/validation/00000.tar, ...

A sample is ``KEY.jpg`` (the stored picture, the TFRecord shards' ``image``),
``KEY.txt`` (the normalised alt-text, their ``texts``) and ``KEY.json``
(``key``, ``url``, ``caption``, the stored ``width``/``height``,
``original_width``/``original_height``, ``sha256``, ``phash``, ``status``
"success" and each carried ``source_<column>``, as img2dataset's own
``.json`` holds them), in that order. The key is the record's key (24 hex
digits: no dot, so WebDataset's key rule splits the names where they were
joined). Shards follow the TFRecord plan (``pipeline.write.shards``): the
same records in the same order, shard ``i`` of a split holding what
``<name>-<split>.tfrecord-i-of-N`` holds, so the two formats of one build
agree record for record.

The archive is written here, not by ``tarfile``: ustar headers with a fixed
owner, mode and time of 0, so two builds write the same bytes, and the
writer knows each sample's offset (the candidate table's ``offset``) and
the file's crc32c as it streams, like ``ShardWriter``.
"""

from __future__ import annotations

import json
import tarfile
from typing import Dict, Iterable, List, Sequence, Tuple

import google_crc32c
from apache_beam.io.filesystems import FileSystems

from common.corpus_dir import TARS_FILE  # noqa: F401 (the job's report of its tars, as _shards.json is)
from common.schema import CARRIED_PREFIX, CONCEPTS_FEATURE, Candidate
from pipeline.write.shards import shard_list

BLOCK = 512
#: The second pass's formats: the TFDS TFRecord shards (the trainer's, always) and these tars (``--webdataset``).
TFRECORD, WEBDATASET = "tfrecord", "webdataset"
FORMATS = (TFRECORD, WEBDATASET)


def tar_name(split: str, index: int) -> str:
    """A tar's path inside the version: ``train/00000.tar`` (five digits and more, as img2dataset numbers)."""
    return f"{split}/{index:05d}.tar"


def sample_json(record: Candidate, carried: Sequence[str] = ()) -> dict:
    """The ``KEY.json`` member: the record's facts under img2dataset's names, then the carried columns."""
    described = {
        "key": record.key, "url": record.url, "caption": record.text, "status": "success",
        "width": record.stored_width, "height": record.stored_height,
        "original_width": record.width, "original_height": record.height,
        "sha256": record.sha256, "phash": record.phash,
    }
    have = dict(record.carried)
    for column in carried:
        described[CARRIED_PREFIX + column] = have.get(column, "")
    if record.concepts is not None:
        described[CONCEPTS_FEATURE] = " ".join(record.concepts)
    return described


def sample_members(record: Candidate, carried: Sequence[str] = ()) -> List[Tuple[str, bytes]]:
    return [
        (f"{record.key}.jpg", record.image),
        (f"{record.key}.txt", record.text.encode("utf-8")),
        (f"{record.key}.json", json.dumps(sample_json(record, carried), sort_keys=True).encode("utf-8")),
    ]


def member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")


def member_bytes(name: str, data: bytes) -> bytes:
    padding = -len(data) % BLOCK
    return member_header(name, len(data)) + data + b"\0" * padding


class TarShardWriter:
    """One tar, written as its records come: its size, crc32c and the offset of each sample; never the records."""

    def __init__(self, path: str):
        self.path = path
        self.handle = FileSystems.create(path)
        self.records = 0
        self.bytes = 0
        self.crc = 0

    def _put(self, data: bytes) -> None:
        self.handle.write(data)
        self.crc = google_crc32c.extend(self.crc, data)
        self.bytes += len(data)

    def write(self, record: Candidate, carried: Sequence[str] = ()) -> int:
        """Writes one sample; returns where its first member's header starts."""
        offset = self.bytes
        self._put(b"".join(member_bytes(name, data) for name, data in sample_members(record, carried)))
        self.records += 1
        return offset

    def close(self) -> dict:
        self._put(b"\0" * (2 * BLOCK))  # the end-of-archive marker
        self.handle.close()
        return {"records": self.records, "bytes": self.bytes, "crc32c": f"{self.crc:08x}"}


def write_empty_tar(output_dir: str, split: str) -> dict:
    """The one tar of a split without records (an archive with no member)."""
    return TarShardWriter(FileSystems.join(output_dir, tar_name(split, 0))).close()


def read_member(handle) -> Tuple[str, bytes]:
    """The member whose header starts at the handle's position: ``(name, data)``."""
    header = handle.read(BLOCK)
    info = tarfile.TarInfo.frombuf(header, "utf-8", "strict")
    data = handle.read(info.size)
    if len(data) != info.size:
        raise ValueError(f"tar member {info.name} is cut short")
    handle.read(-info.size % BLOCK)  # the padding to the next header
    return info.name, data


def tar_list(written: Iterable[Tuple[str, int, dict]]) -> Dict[str, Dict[str, list]]:
    """``(split, index, {"records", "bytes", "crc32c"})`` per tar -> ``stats/_webdataset.json``'s document:
    per split, the files (relative to the version) and their records, bytes and crc32c, by index."""
    return {split: {"files": [tar_name(split, i) for i in range(len(entry["records"]))], **entry}
            for split, entry in shard_list(written, kind="tar").items()}
