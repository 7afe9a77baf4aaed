"""Stored pictures read back from the shards a corpus already wrote: what a selection copies instead of re-encoding.

A selection (``python -m pipeline.select``) writes its records from the same
sources as the build that made its candidate table, by the same second pass
(``pipeline.write.second_pass``). The stored picture of a record (the source
JPEG as it came, or its re-encode at ``output_max_side`` and
``output_jpeg_quality``) is a function of the source bytes and those two
values; a record the source corpus wrote already has it in a shard, at the
offset its candidate table names. The second pass still reads and checks the
source record (its sha256 must be the table's), and then copies the picture
from ``<shard>@<offset>`` (``LightRow.stored_at``) instead of decoding,
resizing and encoding it again: on photographs the re-encode is most of a
build's cost. A copy whose record is not the row's (another key there) is
not used; the picture is then made from the source as usual. A rebuild
(``--reuse``) copies the same way, but its first pass has just read and
checked the source bytes: where nothing else of the source is needed, the
second pass does not read it again.

Both formats are read: a TFRecord frame (``common.tfrecord_io``) whose
Example holds ``key`` and ``image``, and a tar sample
(``pipeline.write.tar_shards``) whose first member is ``KEY.jpg``.
"""

from __future__ import annotations

import json
from typing import Dict, Optional, Tuple

from apache_beam.io.filesystems import FileSystems

from common import tfrecord_io
from pipeline.write import tar_shards


def stored_at(shard_path: str, offset: int) -> str:
    return f"{shard_path}@{offset}"


def parse_stored_at(value: str) -> Tuple[str, int]:
    path, _, offset = value.rpartition("@")
    return path, int(offset)


class StoredCopies:
    """Open shards of one source corpus, read at increasing offsets (one file group of the second pass at a time)."""

    def __init__(self):
        self.handles: Dict[str, object] = {}

    def read(self, value: str) -> Optional[Tuple[str, bytes, int, int]]:
        """``(key, picture, width, height)`` of the record at ``<shard>@<offset>``; None if it cannot be read there."""
        path, offset = parse_stored_at(value)
        try:
            handle = self.handles.get(path)
            if handle is None:
                handle = self.handles[path] = FileSystems.open(path)
            handle.seek(offset)
            if path.endswith(".tar"):
                return _sample_at(handle)
            return _example_at(handle)
        except Exception:  # a shard gone or damaged since: the picture is made from the source instead
            return None

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
        self.handles = {}


def _example_at(handle) -> Optional[Tuple[str, bytes, int, int]]:
    payload = next(tfrecord_io.read_frames(handle), None)  # FrameError where the framing breaks: caught above
    if not isinstance(payload, bytes):
        return None
    example = tfrecord_io.first_values(payload, ("key", "image", "width", "height"))  # the frame's CRC held
    if len(example) < 4:
        return None
    return (bytes(example["key"]).decode("utf-8"), bytes(example["image"]), int(example["width"]),
            int(example["height"]))


def _sample_at(handle) -> Optional[Tuple[str, bytes, int, int]]:
    members = dict(tar_shards.read_member(handle) for _ in range(3))  # KEY.jpg, KEY.txt, KEY.json
    image = next((data for name, data in members.items() if name.endswith(".jpg")), None)
    described = next((json.loads(data) for name, data in members.items() if name.endswith(".json")), None)
    if image is None or not isinstance(described, dict):
        return None
    return described["key"], image, int(described["width"]), int(described["height"])
