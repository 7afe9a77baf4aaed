"""Rewrite a Parquet file's footer: the Thrift compact protocol, read into a tree and written back.

Enough of the protocol for Parquet's ``FileMetaData`` (structs, lists, maps,
integers, binaries, doubles, booleans), so a test can make a footer lie
(``num_rows`` of the file or of a row group, a column chunk's offset or
size) while every other byte stays as pyarrow wrote it.
"""

from __future__ import annotations

import struct

# Compact protocol type ids.
TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)

# Field ids in parquet.thrift.
FILE_NUM_ROWS, FILE_ROW_GROUPS = 3, 4
GROUP_COLUMNS, GROUP_TOTAL_BYTE_SIZE, GROUP_NUM_ROWS = 1, 2, 3
CHUNK_META = 3
META_TOTAL_UNCOMPRESSED, META_TOTAL_COMPRESSED, META_DATA_PAGE_OFFSET = 6, 7, 9


def _varint(data, pos):
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _unzigzag(n):
    return (n >> 1) ^ -(n & 1)


def _zigzag(n):
    return (n << 1) ^ (n >> 63)


def _put_varint(n):
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _read_value(data, pos, kind):
    if kind in (TRUE, FALSE):  # inside a list a bool is its own byte
        return data[pos] == 1, pos + 1
    if kind == BYTE:
        return data[pos], pos + 1
    if kind in (I16, I32, I64):
        raw, pos = _varint(data, pos)
        return _unzigzag(raw), pos
    if kind == DOUBLE:
        return struct.unpack("<d", data[pos:pos + 8])[0], pos + 8
    if kind == BINARY:
        length, pos = _varint(data, pos)
        return bytes(data[pos:pos + length]), pos + length
    if kind in (LIST, SET):
        head = data[pos]
        pos += 1
        size, element = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(data, pos)
        items = []
        for _ in range(size):
            item, pos = _read_value(data, pos, element)
            items.append(item)
        return (element, items), pos
    if kind == MAP:
        size, pos = _varint(data, pos)
        if not size:
            return (0, 0, []), pos
        types = data[pos]
        pos += 1
        pairs = []
        for _ in range(size):
            key, pos = _read_value(data, pos, types >> 4)
            value, pos = _read_value(data, pos, types & 0x0F)
            pairs.append((key, value))
        return (types >> 4, types & 0x0F, pairs), pos
    if kind == STRUCT:
        return read_struct(data, pos)
    raise ValueError(f"thrift type {kind}")


def read_struct(data, pos=0):
    """``([(field id, type, value)], next position)``; a struct value is such a list."""
    fields, last = [], 0
    while True:
        head = data[pos]
        pos += 1
        if head == 0:
            return fields, pos
        delta, kind = head >> 4, head & 0x0F
        if delta:
            field = last + delta
        else:
            raw, pos = _varint(data, pos)
            field = _unzigzag(raw)
        if kind in (TRUE, FALSE):
            value = kind == TRUE
        else:
            value, pos = _read_value(data, pos, kind)
        fields.append([field, kind, value])
        last = field


def _write_value(kind, value):
    if kind in (TRUE, FALSE):
        return bytes([1 if value else 2])
    if kind == BYTE:
        return bytes([value & 0xFF])
    if kind in (I16, I32, I64):
        return _put_varint(_zigzag(value) & ((1 << 64) - 1))
    if kind == DOUBLE:
        return struct.pack("<d", value)
    if kind == BINARY:
        return _put_varint(len(value)) + value
    if kind in (LIST, SET):
        element, items = value
        head = bytes([(len(items) << 4) | element]) if len(items) < 15 else bytes([0xF0 | element]) + _put_varint(len(items))
        return head + b"".join(_write_value(element, item) for item in items)
    if kind == MAP:
        key_kind, value_kind, pairs = value
        if not pairs:
            return b"\x00"
        body = b"".join(_write_value(key_kind, k) + _write_value(value_kind, v) for k, v in pairs)
        return _put_varint(len(pairs)) + bytes([(key_kind << 4) | value_kind]) + body
    if kind == STRUCT:
        return write_struct(value)
    raise ValueError(f"thrift type {kind}")


def write_struct(fields):
    out, last = bytearray(), 0
    for field, kind, value in fields:
        delta = field - last
        if 0 < delta <= 15:
            out.append((delta << 4) | kind)
        else:
            out.append(kind)
            out += _put_varint(_zigzag(field))
        if kind not in (TRUE, FALSE):
            out += _write_value(kind, value)
        last = field
    out.append(0)
    return bytes(out)


def field(fields, number):
    return next(f for f in fields if f[0] == number)


def split_file(data: bytes):
    """``(body, footer)``: everything before the footer, and the footer's Thrift bytes."""
    assert data[:4] == b"PAR1" and data[-4:] == b"PAR1"
    (length,) = struct.unpack("<I", data[-8:-4])
    return data[:-8 - length], data[-8 - length:-8]


def join_file(body: bytes, footer: bytes) -> bytes:
    return body + footer + struct.pack("<I", len(footer)) + b"PAR1"


def rewrite_footer(path, change) -> None:
    """Apply ``change(fields)`` to the file's ``FileMetaData`` tree and write the file back."""
    data = open(path, "rb").read()
    body, footer = split_file(data)
    fields, end = read_struct(footer)
    assert end == len(footer) and write_struct(fields) == footer, "footer does not round-trip"
    change(fields)
    with open(path, "wb") as handle:
        handle.write(join_file(body, write_struct(fields)))


def row_groups(fields):
    return field(fields, FILE_ROW_GROUPS)[2][1]


def set_rows(path, file_rows=None, group_rows=None, group=0) -> None:
    """Make the file footer, or one row group's entry in it, state another row count."""

    def change(fields):
        if file_rows is not None:
            field(fields, FILE_NUM_ROWS)[2] = file_rows
        if group_rows is not None:
            field(row_groups(fields)[group], GROUP_NUM_ROWS)[2] = group_rows

    rewrite_footer(path, change)


def set_chunk(path, group=0, column=0, **values) -> None:
    """Change a column chunk's metadata: ``total_compressed_size=``, ``total_uncompressed_size=``, ``data_page_offset=``."""
    ids = {"total_uncompressed_size": META_TOTAL_UNCOMPRESSED, "total_compressed_size": META_TOTAL_COMPRESSED,
           "data_page_offset": META_DATA_PAGE_OFFSET}

    def change(fields):
        chunk = field(row_groups(fields)[group], GROUP_COLUMNS)[2][1][column]
        meta = field(chunk, CHUNK_META)[2]
        for name, value in values.items():
            field(meta, ids[name])[2] = value

    rewrite_footer(path, change)
