"""What a reader will hold of one input record, and reading a stream within those bounds.

A file's lengths, counts and sizes are claims made by whoever wrote it. The
readers never allocate or loop on a claim beyond what the bytes hold: a
stream is read in chunks of at most ``CHUNK_BYTES``, a member or record
larger than its cap is skipped (read through, not kept) and becomes one
``read/too_large`` record, and a line is cut at its cap. The caps are build
options (``--read_max_record_bytes``, ``--read_max_line_bytes``), like the
download's ``--download_max_bytes``; with them a worker's reading holds a
few records at a time whatever a file claims.
"""

from __future__ import annotations

import json
import re
from typing import Iterator, List, NamedTuple, Union

from common.files import CHUNK_BYTES

#: JSON nested deeper is refused before it is parsed: Python's parser recurses, and how deep it
#: can go depends on the caller's stack, so a fixed bound keeps a line's fate the same in every pass.
MAX_JSON_DEPTH = 100


class ReadLimits(NamedTuple):
    """The caps on one input record (``--read_max_*``)."""

    #: One record as stored: a TFRecord payload, a tar or folder sample's members together, a Parquet row's cells.
    max_record_bytes: int = 32 << 20
    #: One line of a TSV/JSONL URL list, and a sample's ``.json``/``.txt`` member (parsed as text).
    max_line_bytes: int = 1 << 20

    def check(self) -> "ReadLimits":
        for name, value in self._asdict().items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--read_{name} {value}: must be a whole number >= 1")
        return self


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


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(raw: bytes) -> int:
    """How deeply ``raw``'s arrays and objects nest (brackets inside strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return raw.count(b"[") + raw.count(b"{")  # an upper bound, and within the limit
    import numpy as np

    codes = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = (np.isin(codes, (ord("["), ord("{")))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


class TooDeep(ValueError):
    """JSON nested past ``MAX_JSON_DEPTH``."""


def load_json(raw: bytes):
    """``json.loads`` of one line or member; ``ValueError`` for bad JSON or nesting past ``MAX_JSON_DEPTH``."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    depth = json_depth(raw)  # bounds the nesting, so the parser's recursion cannot run out
    if depth > MAX_JSON_DEPTH:
        raise TooDeep(f"JSON nested {depth} deep, more than {MAX_JSON_DEPTH}")
    return json.loads(raw)


_FLAGS = (
    ("max_record_bytes", "largest input record kept, in bytes: a TFRecord payload, a tar or folder sample's members "
                         "together, a Parquet row's cells; a larger one is read/too_large, read through and never held"),
    ("max_line_bytes", "largest URL-list line (TSV, JSONL) and sample .json/.txt member kept, in bytes; a longer one "
                       "is read/too_large"),
)


def add_arguments(parser) -> None:
    """The ``--read_max_*`` flags, with ``ReadLimits``' defaults."""
    for name, text in _FLAGS:
        default = ReadLimits._field_defaults[name]
        parser.add_argument(f"--read_{name}", dest=f"read_{name}", type=int, default=default,
                            help=f"{text} (default {default:,})")


def from_options(opts) -> ReadLimits:
    """``ReadLimits`` from parsed flags; ``ValueError`` names a flag out of range."""
    return ReadLimits(**{name: getattr(opts, f"read_{name}") for name, _ in _FLAGS}).check()
