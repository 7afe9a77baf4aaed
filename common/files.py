"""File access for local paths and anything Beam's FileSystems serves (gs://, s3://).

One set of helpers for every package that reads or writes outside a Beam
transform: the dedup index sets and embedder models, the near-duplicate
index, calibration reports, the audit's stats and report. Reads and writes go
through ``FileSystems`` for every path (its local filesystem makes parent
folders on create); bytes are never decompressed by file extension.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Iterator, List, NamedTuple, Union

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

RAW = CompressionTypes.UNCOMPRESSED  # the bytes as stored, whatever the extension
#: One read of a stream: never more is asked for at once (a length read from a file is a claim, not a fact).
CHUNK_BYTES = 1 << 20


def is_remote(path: str) -> bool:
    """A URL with a scheme (``gs://...``), not a local path."""
    return "://" in path


def escape_glob(path: str) -> str:
    """``path`` as a Beam match pattern that matches only itself (``*`` -> ``[*]``)."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def size_of(path: str) -> int:
    """The bytes of the file at ``path``, asked of its file system directly (no match: the path is literal)."""
    return FileSystems.get_filesystem(path).metadata(path).size_in_bytes


def open_raw(path: str):
    """A read stream of the bytes as stored (``read(n)``, ``seek``), whatever the file's extension."""
    return FileSystems.open(path, compression_type=RAW)


def read_bytes(path: str) -> bytes:
    with open_raw(path) as handle:
        return handle.read()


def write_bytes(path: str, data: bytes, mime_type: str = "application/octet-stream") -> None:
    with FileSystems.create(path, mime_type=mime_type, compression_type=RAW) as handle:
        handle.write(data)


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def write_text(path: str, text: str, mime_type: str = "text/plain") -> None:
    write_bytes(path, text.encode("utf-8"), mime_type)


def match(pattern: str) -> List[str]:
    """Sorted files matching a glob; ``**`` matches across folders.

    Local patterns use ``glob``: it returns paths as the caller spelled them
    (relative stays relative, which keys derived from paths rely on) and skips
    folders; Beam's local match walks every file under the pattern's prefix.
    """
    if not is_remote(pattern):
        return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def to_json(obj, sort_keys: bool = False) -> str:
    """The project's JSON files as written: indented, tuples as lists, bytes as text, numpy values as numbers."""
    return json.dumps(obj, indent=1, sort_keys=sort_keys, default=_jsonable)


def _jsonable(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_at_most(handle, size: int) -> bytes:
    """Up to ``size`` bytes, asked for in chunks: a false length allocates nothing it does not read."""
    parts: List[bytes] = []
    left = size
    while left > 0:
        chunk = handle.read(min(left, CHUNK_BYTES))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def skip(handle, size: int) -> int:
    """Read ``size`` bytes through without keeping them; returns how many there were."""
    done = 0
    while done < size:
        chunk = handle.read(min(size - done, CHUNK_BYTES))
        if not chunk:
            break
        done += len(chunk)
    return done


class TooLong(NamedTuple):
    """A line longer than its cap: only its length (its first ``head`` bytes) is kept."""

    length: int
    head: bytes


def lines(handle, max_line_bytes: int) -> Iterator[Union[bytes, TooLong]]:
    """The lines of a byte stream (with their newline), each at most ``max_line_bytes``.

    Works on any ``read(n)`` stream, compressed ones included. A longer line
    is one ``TooLong`` and reading goes on after its newline, so one line
    costs at most its cap in memory. A last line without a newline is a line.
    """
    pending: List[bytes] = []  # the start of the current line, while it is within its cap
    held = 0
    too_long = None  # (length so far, head) of the current line once past its cap
    while True:
        chunk = handle.read(CHUNK_BYTES)
        if not chunk:
            break
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:  # each ends a line
            length = held + len(piece) + 1
            if too_long is not None:
                yield TooLong(too_long[0] + len(piece) + 1, too_long[1])
            elif length > max_line_bytes:
                yield TooLong(length, (b"".join(pending) + piece)[:200])
            elif pending:
                yield b"".join(pending) + piece + b"\n"
            else:
                yield piece + b"\n"
            pending, held, too_long = [], 0, None
        rest = pieces[-1]  # the start of a line that goes on in the next chunk
        if too_long is not None:
            too_long = (too_long[0] + len(rest), too_long[1])
        elif held + len(rest) > max_line_bytes:
            too_long = (held + len(rest), (b"".join(pending) + rest[:200])[:200])
            pending, held = [], 0
        elif rest:
            pending.append(rest)
            held += len(rest)
    if too_long is not None:
        yield TooLong(*too_long)
    elif pending:
        yield b"".join(pending)
