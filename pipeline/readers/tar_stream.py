"""A tar archive read as a stream, member by member, believing its headers only as far as the bytes go.

Python's ``tarfile`` in stream mode ends quietly at a header that is cut
short or fails its checksum (the members after it are lost without a word),
keeps every header it has read in a list, and reads a pax or GNU long-name
header whole whatever size it claims. This reader is the part of POSIX tar
that WebDataset shards use (ustar with its prefix, pax ``path``/``size``
records, GNU long names and base-256 sizes), and:

- every header's checksum is verified; a bad or cut header, a size that is
  not a number, data that ends early, or an archive that ends without its
  end-of-archive block raise ``TarError`` (nothing after it can be located);
- a member's data is read only if the caller asks and it is within the cap
  (``Member.read``), otherwise read through in bounded chunks;
- a pax or long-name header over ``max_header_bytes`` (or malformed) is
  read through and the member it describes comes with ``Member.problem``:
  ``(reason, note)``, ``too_large`` or ``malformed_record``.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

from common.files import read_at_most, skip

BLOCK = 512
REGULAR = (b"0", b"\x00", b"7")


class TarError(Exception):
    """The archive cannot be framed past this point.

    ``at_header``: it broke at a member's header, so every member before it
    was read whole; otherwise inside a member's data.
    """

    def __init__(self, message: str, at_header: bool = True):
        super().__init__(message)
        self.at_header = at_header


def _padding(size: int) -> int:
    return -size % BLOCK


def _octal(field: bytes, what: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256: big sizes; a negative one is no size
        if field[0] & 0x40:
            raise TarError(f"negative {what} in a header")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\x00", 1)[0].strip(b" ")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarError(f"{what} {text[:20]!r} in a header is not octal") from None


def _checksum_ok(block: bytes) -> bool:
    """The header's checksum, as unsigned bytes (POSIX) or signed ones (some old tars)."""
    stated = _octal(block[148:156], "checksum")
    rest = block[:148] + block[156:]
    unsigned = 8 * 32 + sum(rest)
    signed = unsigned - 256 * sum(1 for b in rest if b > 127)
    return stated in (unsigned, signed)


def _text(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(data: bytes) -> dict:
    """``"%d key=value\\n"`` records; a malformed one raises ``ValueError``."""
    found, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\x00":
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        record = data[space + 1:pos + length]
        if length <= space - pos or not record.endswith(b"\n") or b"=" not in record:
            raise ValueError(f"malformed pax record at byte {pos}")
        key, value = record[:-1].split(b"=", 1)
        found[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return found


class Member:
    """One archive member; ``read()`` its data (once, before the next member)."""

    def __init__(self, name: str, size: int, regular: bool, problem: Optional[Tuple[str, str]], handle):
        self.name, self.size, self.regular, self.problem = name, size, regular, problem
        self._handle, self._read = handle, False

    def read(self) -> bytes:
        self._read = True
        data = read_at_most(self._handle, self.size)
        if len(data) < self.size:
            raise TarError(f"member {self.name!r} ends early ({len(data):,} of {self.size:,} bytes)", at_header=False)
        return data

    def _finish(self) -> None:
        rest = _padding(self.size) + (0 if self._read else self.size)
        if skip(self._handle, rest) < rest:
            raise TarError(f"member {self.name!r} ends early (claims {self.size:,} bytes)", at_header=False)


def members(handle, max_header_bytes: int) -> Iterator[Member]:
    """Every member of the tar stream ``handle``, in order."""
    pending: dict = {}  # what pax/long-name headers say about the next member
    problem = None
    offset = 0
    while True:
        block = read_at_most(handle, BLOCK)
        if not block:
            raise TarError(f"the archive ends at byte {offset:,} without its end-of-archive block")
        if len(block) < BLOCK:
            raise TarError(f"header cut short at byte {offset:,} ({len(block)} of {BLOCK} bytes)")
        if not block.strip(b"\x00"):
            return  # end of archive; what follows is padding
        if not _checksum_ok(block):
            raise TarError(f"header at byte {offset:,} fails its checksum")
        size = _octal(block[124:136], "size")
        kind = block[156:157]
        name = _text(block[:100])
        if block[257:262] == b"ustar" and block[345:500].strip(b"\x00"):
            name = _text(block[345:500]) + "/" + name
        if kind in (b"x", b"L", b"K", b"g"):  # about the next member (g: all of them; K: a link name; ignored)
            if size > max_header_bytes:
                if skip(handle, size + _padding(size)) < size + _padding(size):
                    raise TarError(f"an extended header at byte {offset:,} ends early (claims {size:,} bytes)")
                problem = ("too_large", f"an extended header of {size:,} bytes, over {max_header_bytes:,}")
            else:
                data = read_at_most(handle, size)
                if len(data) < size or skip(handle, _padding(size)) < _padding(size):
                    raise TarError(f"an extended header at byte {offset:,} ends early (claims {size:,} bytes)")
                if kind == b"L":
                    pending["path"] = _text(data)
                elif kind == b"x":
                    try:
                        pending.update(_pax_records(data))
                    except ValueError as error:
                        problem = ("malformed_record", f"pax header: {error}")
            offset += BLOCK + size + _padding(size)
            continue
        name = pending.get("path", name)
        if "size" in pending:
            try:
                size = int(pending["size"])
            except ValueError:
                raise TarError(f"pax size {pending['size'][:20]!r} is not a number") from None
            if size < 0:
                raise TarError("negative pax size")
        if kind in (b"1", b"2", b"3", b"4", b"5", b"6"):  # links, devices, directories, fifos: no data follows
            size = 0
        member = Member(name, size, kind in REGULAR, problem, handle)
        pending, problem = {}, None
        yield member
        member._finish()
        offset += BLOCK + size + _padding(size)
