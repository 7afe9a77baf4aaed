"""An input file as a byte stream: gzip and bzip2 decoded in bounded steps, a cut stream an error.

Beam's own decompressing reader returns a truncated ``.gz`` as if it had
ended there (the lines after the cut are lost without a word), and it is not
iterable by line. Here the raw bytes come from ``FileSystems`` (local or
``gs://``) and are decoded with ``zlib``/``bz2`` at most ``CHUNK_BYTES`` of
output at a time, so a bomb costs time in proportion to what it inflates to,
never memory. A stream that is corrupt or ends before its end-of-stream
marker raises ``StreamError`` where the problem is, after every byte before
it was delivered; an I/O error of the file system is not a ``StreamError``
(the runner retries it). Concatenated gzip members are read as one stream,
as ``gzip``/``zcat`` do. Other compressions Beam knows (``.zst``,
``.deflate``) are decoded by Beam.
"""

from __future__ import annotations

import bz2
import zlib
from typing import Optional

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from common.files import CHUNK_BYTES


class StreamError(Exception):
    """The compressed stream is corrupt or cut short: nothing after this point can be read."""


def _decompressor(kind: str):
    return zlib.decompressobj(wbits=31) if kind == "gz" else bz2.BZ2Decompressor()


class Decompressed:
    """``read(n)`` of a gzip or bzip2 stream over a raw ``read(n)`` stream."""

    def __init__(self, raw, kind: str):
        self.raw, self.kind = raw, kind
        self.decoder = _decompressor(kind)
        self.input = b""  # compressed bytes not yet given to the decoder
        self.started = False  # the current member has had input
        self.finished = False
        self.error: Optional[StreamError] = None

    def _next_member(self) -> bool:
        """After a member's end: start the next one, or finish (False) at the end of the file."""
        rest = self.decoder.unused_data + self.input
        while not rest.strip(b"\x00"):  # zero padding after the last member, as gzip tolerates
            rest = self.raw.read(CHUNK_BYTES)
            if not rest:
                return False
        self.decoder, self.input, self.started = _decompressor(self.kind), rest, False
        return True

    def _decode(self, data: bytes, want: int) -> bytes:
        try:
            out = self.decoder.decompress(data, want)
        except (zlib.error, OSError, EOFError, ValueError) as error:
            raise StreamError(f"corrupt {self.kind} stream: {error}") from None
        if self.kind == "gz":  # after the member's end its rest is in unused_data, not here
            self.input = b"" if self.decoder.eof else self.decoder.unconsumed_tail
        return out

    def _step(self, want: int) -> bytes:
        """Up to ``want`` decoded bytes; b"" only at the end of the stream."""
        while not self.finished:
            if self.decoder.eof:
                if not self._next_member():
                    self.finished = True
                    break
                continue
            if not self.input:
                drained = self.kind == "gz" or not self.decoder.needs_input
                out = self._decode(b"", want) if self.started and drained else b""
                if out:
                    return out
                if self.decoder.eof:
                    continue
                self.input = self.raw.read(CHUNK_BYTES)
                if not self.input:
                    if self.started:
                        raise StreamError(f"the {self.kind} stream ends before its end-of-stream marker")
                    self.finished = True
                    break
            data, self.input = self.input, b""
            self.started = True
            out = self._decode(data, want)
            if out:
                return out
        return b""

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise ValueError("read() needs a size: a stream is never read whole")
        if self.error is not None:
            raise self.error
        parts, held = [], 0
        while held < size:
            try:
                out = self._step(min(size - held, CHUNK_BYTES))
            except StreamError as error:
                if not parts:
                    raise
                self.error = error  # the bytes before the problem first, the problem at the next read
                break
            if not out:
                break
            parts.append(out)
            held += len(out)
        return b"".join(parts)

    def close(self) -> None:
        self.raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def compression_of(path: str) -> str:
    lowered = path.lower()
    if lowered.endswith(".gz"):
        return "gz"
    if lowered.endswith(".bz2"):
        return "bz2"
    return ""


def open_input(path: str):
    """``path`` as a byte stream with ``read(n)``, decoded by its extension (``.gz``, ``.bz2``)."""
    kind = compression_of(path)
    if not kind:
        return FileSystems.open(path)  # Beam decodes .zst/.deflate by name, and passes other files through
    return Decompressed(FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED), kind)


def read_line_list(path: str, columns, read_lines):
    """A URL list's records: its lines, capped at ``max_line_bytes``, through the format's ``read_lines``.

    A stream that breaks (a cut gzip member, a bad bz2 block) ends the file
    as one ``read/truncated_file`` marker after what was read: a line list
    states no count of its own.
    """
    from pipeline.readers.limits import lines
    from pipeline.readers.losses import marker

    count = 0
    with open_input(path) as handle:
        try:
            for record in read_lines(path, lines(handle, columns.limits.max_line_bytes), columns):
                count += 1
                yield record
        except StreamError as error:
            yield marker(f"{path}#after-{count}", "truncated_file", f"{error}; a line list states no count", None)
