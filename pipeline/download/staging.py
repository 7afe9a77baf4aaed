"""Staging files: downloaded image bytes, written once, then read like any input file.

The crawl (``pipeline.download.crawl``) writes each fetched body into a
staging file under the output, ``<output>/_downloads/``, a directory shared
by the builds of that output: a build that fails leaves its downloads
there for the next one (``pipeline.download.resume``). A staging file is
a pair:

- ``<stem>.tfrecord``: TFRecord frames of ``tf.train.Example`` with
  ``url``, ``final_url``, ``http_status`` and ``body`` (the project's own
  codec), one per body;
- ``<stem>.index.jsonl``: its sidecar index, one JSON line per URL the
  writer handled, ``{"url", "ordinal", "offset", "status", "final_url",
  "reason"}`` (a failed download: ``reason`` set, ``ordinal`` -1, no body),
  then a last line ``{"complete": <lines before it>}``.

A staging file is complete when its index is, and only then: the index is
written after the bodies are closed, and an index without its last line
(a writer killed while writing it) is no index. ``<stem>`` is the writing
build's id and a random part, so a build can tell its own files and older
ones from those of builds that started after it (``pipeline.publish``
deletes the older ones once a build is committed).

A writer closes its file and writes its index every ``max_records`` URLs
or ``max_seconds``, whichever comes first: a build killed mid-crawl loses
at most that much of what it fetched.

The second pass reads a staging file as it reads an input file, by ordinal
(``read_file``); what a shard needs of the URL-list row (key, alt-text,
carried columns) travels with the light row. An extra per-record stage
that needs the bytes of a downloaded image reads one body by its offset
(``read_body``).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Iterator, List, Optional

from apache_beam.io.filesystems import FileSystems

from common import files
from common import state_files as sf
from common import tfrecord_io as tfrecord
from common.schema import Candidate
from pipeline.readers.rows import Columns

READER = "staging"
DIRECTORY = "_downloads"
BODIES, INDEX = ".tfrecord", ".index.jsonl"
#: ``<build id>-<32 hex>``: the build id sorts by the build's start (``pipeline.publish.output_contract.new_version_id``).
STEM = re.compile(r"^(?P<build>\d{8}T\d{6}Z-[0-9a-f]{8,32})-[0-9a-f]{32}$")


def directory(output_dir: str) -> str:
    return FileSystems.join(output_dir, DIRECTORY)


def index_path(bodies_path: str) -> str:
    return bodies_path[: -len(BODIES)] + INDEX


def bodies_path(index: str) -> str:
    return index[: -len(INDEX)] + BODIES


def build_of(name: str) -> Optional[str]:
    """The id of the build that wrote a staging file (its name), or None if it is not one."""
    for suffix in (BODIES, INDEX):
        if name.endswith(suffix):
            found = STEM.match(name[: -len(suffix)])
            return found.group("build") if found else None
    return None


class StagingWriter:
    """Staging files of one writer: bodies in order, failures noted, closed and indexed every so often.

    ``write`` returns where the body went, ``(path, ordinal, offset)``;
    ``note`` records a failed URL in the index; ``due`` says the file should
    be closed now (``close`` writes its index and returns the entries).
    """

    def __init__(self, staging_dir: str, build_id: str, max_records: int = 1000, max_seconds: float = 60.0,
                 clock=time.monotonic):
        self.staging_dir = staging_dir
        self.build_id = build_id
        self.max_records = max_records
        self.max_seconds = max_seconds
        self.clock = clock
        self._start()

    def _start(self) -> None:
        self.path = FileSystems.join(self.staging_dir, f"{self.build_id}-{uuid.uuid4().hex}{BODIES}")
        self.handle = None
        self.bodies = self.offset = 0
        self.entries: List[dict] = []
        self.opened_at = self.clock()

    def write(self, url: str, final_url: str, http_status: int, body: bytes) -> tuple:
        if self.handle is None:
            self.handle = FileSystems.create(self.path)
        frame = tfrecord.frame_record(tfrecord.encode_example(
            {"url": url, "final_url": final_url, "http_status": int(http_status), "body": body}))
        self.handle.write(frame)
        where = (self.path, self.bodies, self.offset)
        self.entries.append({"url": url, "ordinal": self.bodies, "offset": self.offset, "status": int(http_status),
                             "final_url": final_url, "reason": ""})
        self.bodies += 1
        self.offset += len(frame)
        return where

    def note(self, url: str, final_url: str, http_status: int, reason: str) -> None:
        self.entries.append({"url": url, "ordinal": -1, "offset": -1, "status": int(http_status),
                             "final_url": final_url, "reason": reason})

    def due(self) -> bool:
        return bool(self.entries) and (
            len(self.entries) >= self.max_records or self.clock() - self.opened_at >= self.max_seconds)

    def close(self) -> List[dict]:
        """Closes the bodies, then writes the index (nothing when nothing was handled); starts a new file."""
        entries = self.entries
        if self.handle is not None:
            self.handle.close()
        if entries:
            lines = [json.dumps(entry, sort_keys=True) for entry in entries]
            lines.append(json.dumps({"complete": len(entries)}))
            with FileSystems.create(index_path(self.path)) as handle:
                handle.write(("\n".join(lines) + "\n").encode("utf-8"))
        self._start()
        return entries


def entry_schema(entry: dict, where: str) -> None:
    """One line of a sidecar index (``StagingWriter``), as a later build's plan reads it (``common.state_files``)."""
    for name in ("url", "final_url", "reason"):
        sf.text(sf.field(entry, name, where), f"{where}.{name}")
    for name in ("ordinal", "offset"):
        sf.whole(sf.field(entry, name, where), f"{where}.{name}", low=-1)
    sf.whole(sf.field(entry, "status", where), f"{where}.status", low=-1, high=999)


def read_index(path: str) -> Optional[List[dict]]:
    """A sidecar index's entries (each with ``path``: its bodies file), or None if it is incomplete or damaged
    (a damaged index is as good as none: its URLs are fetched again)."""
    try:
        with files.open_raw(path) as handle:
            rows = list(sf.jsonl_rows(handle))
    except OSError:
        return None
    if not rows or any(isinstance(row, sf.Problem) for row in rows):
        return None
    *entries, trailer = rows
    if trailer.get("complete") != len(entries):
        return None
    try:
        for number, entry in enumerate(entries, start=1):
            entry_schema(entry, f"line {number}")
    except sf.Problem:
        return None
    bodies = bodies_path(path)
    return [dict(entry, path=bodies) for entry in entries]


def read_file(path: str, columns: Columns = Columns()) -> Iterator[Candidate]:
    """A staging file's bodies, in order, as records without key or alt-text (the light row has them).

    A body that fails its checksum, or is over ``--read_max_record_bytes``
    (larger than ``--download_max_bytes`` let in), comes back without bytes:
    the second pass rejects its rows as changed since the first.
    """
    with FileSystems.open(path) as handle:
        for payload in tfrecord.read_frames(handle, columns.limits.max_record_bytes):
            yield _record(payload)


def _record(payload) -> Candidate:
    if not isinstance(payload, (bytes, bytearray, memoryview)):  # CorruptPayload, TooLarge
        return Candidate(key="", url="", alt_text="", image=None)
    features = tfrecord.decode_example(payload)
    url = features.get("url", [b""])[0]
    return Candidate(key="", url=url.decode("utf-8", "replace"), alt_text="",
                     image=bytes(features.get("body", [b""])[0]))


def read_body(path: str, offset: int, max_record_bytes: int = Columns().limits.max_record_bytes) -> Optional[bytes]:
    """The body of the frame at ``offset`` of a staging file (None if it no longer reads)."""
    with FileSystems.open(path) as handle:
        handle.seek(offset)
        for payload in tfrecord.read_frames(handle, max_record_bytes):
            return _record(payload).image
    return None


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    return None
