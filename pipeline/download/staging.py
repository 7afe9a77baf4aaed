"""Staging files: downloaded image bytes, written once, then read like any input file.

The download stage writes each fetched body into a staging file of the
build's output (``<output>/downloads/<id>.tfrecord``: TFRecord frames of
``tf.train.Example`` with ``url``, ``final_url``, ``http_status`` and
``body``, the project's own codec), and the record it hands to the first
pass points there (``Candidate.origin``: ``("staging", path, ordinal)``).
The second pass reads a staging file as it reads an input file, by
ordinal (``read_file``); what a shard needs of the URL-list row (key,
alt-text, carried columns) travels with the light row.
"""

from __future__ import annotations

import uuid
from typing import Iterator, Optional

from apache_beam.io.filesystems import FileSystems

from common.schema import Candidate
from pipeline import tfrecord
from pipeline.readers.rows import Columns

READER = "staging"
DIRECTORY = "downloads"


def directory(output_dir: str) -> str:
    return FileSystems.join(output_dir, DIRECTORY)


class StagingWriter:
    """One staging file, opened on the first body; ``write`` returns the body's origin."""

    def __init__(self, staging_dir: str):
        self.path = FileSystems.join(staging_dir, f"{uuid.uuid4().hex}.tfrecord")
        self.handle = None
        self.count = 0

    def write(self, url: str, final_url: str, http_status: int, body: bytes) -> tuple:
        if self.handle is None:
            self.handle = FileSystems.create(self.path)
        payload = tfrecord.encode_example({"url": url, "final_url": final_url, "http_status": int(http_status),
                                           "body": body})
        self.handle.write(tfrecord.frame_record(payload))
        self.count += 1
        return READER, self.path, self.count - 1

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def read_file(path: str, columns: Columns = Columns()) -> Iterator[Candidate]:
    """A staging file's bodies, in order, as records without key or alt-text (the light row has them).

    A body that fails its checksum, or is over ``--read_max_record_bytes``
    (larger than ``--download_max_bytes`` let in), comes back without bytes:
    the second pass rejects its rows as changed since the first.
    """
    with FileSystems.open(path) as handle:
        for payload in tfrecord.read_frames(handle, columns.limits.max_record_bytes):
            if not isinstance(payload, (bytes, bytearray, memoryview)):  # CorruptPayload, TooLarge
                yield Candidate(key="", url="", alt_text="", image=None)
                continue
            features = tfrecord.decode_example(payload)
            url = features.get("url", [b""])[0]
            yield Candidate(key="", url=url.decode("utf-8", "replace"), alt_text="",
                            image=bytes(features.get("body", [b""])[0]))


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    return None
