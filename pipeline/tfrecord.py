"""TFRecord shards without TensorFlow on the workers: writing and reading.

A ``tf.train.Example`` is a small protobuf; encoding it by hand (with keys in
a fixed order) keeps the Beam workers free of the TensorFlow dependency and
makes the bytes deterministic. Reading (``read_frames``, ``decode_example``)
is the same codec backwards, for re-filtering shards as input. ``tests/pipeline/test_tfrecord.py`` checks the
output against TensorFlow's own parser and reader.
"""

from __future__ import annotations

import functools
import struct
from typing import Dict, Iterable, Iterator, List, Tuple, Union

import google_crc32c

Value = Union[bytes, str, int]


_ONE_BYTE = [bytes([i]) for i in range(0x80)]


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 negatives as two's complement, 10 bytes
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


# Length-delimited field tags: (field number << 3) | 2.
_TAG_1, _TAG_2, _TAG_3 = b"\x0a", b"\x12", b"\x1a"


@functools.lru_cache(maxsize=1024)
def _name_entry(name: str) -> bytes:
    """A feature map entry's key field (the same few names on every record)."""
    return _field(1, name.encode("utf-8"))


def _feature(value: Value) -> bytes:
    if isinstance(value, bool) or isinstance(value, int):
        packed = _varint(int(value))
        int64_list = _TAG_1 + _varint(len(packed)) + packed  # Int64List.value (packed)
        return _TAG_3 + _varint(len(int64_list)) + int64_list  # Feature.int64_list
    if isinstance(value, str):
        value = value.encode("utf-8")
    value = bytes(value)
    bytes_list = _TAG_1 + _varint(len(value)) + value  # BytesList.value
    return _TAG_1 + _varint(len(bytes_list)) + bytes_list  # Feature.bytes_list


def encode_example(features: Dict[str, Value]) -> bytes:
    """Serialise a flat dict of scalar bytes/str/int features as tf.train.Example."""
    entries = []
    for name, value in features.items():
        feature = _feature(value)
        entry = _name_entry(name) + _TAG_2 + _varint(len(feature)) + feature
        entries.append(_TAG_1 + _varint(len(entry)) + entry)  # Features.feature map entry
    body = b"".join(entries)
    return _TAG_1 + _varint(len(body)) + body  # Example.features


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return struct.pack("<I", masked)


def frame_record(payload: bytes) -> bytes:
    """One TFRecord: length, crc(length), payload, crc(payload)."""
    length = struct.pack("<Q", len(payload))
    return length + _masked_crc(length) + payload + _masked_crc(payload)


def write_records(file_obj, payloads: Iterable[bytes]) -> int:
    count = 0
    for payload in payloads:
        file_obj.write(frame_record(payload))
        count += 1
    return count


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


class FrameError(Exception):
    """The file cannot be framed past this point (bad length checksum, truncated)."""


class CorruptPayload(Exception):
    """One record's payload checksum does not match; the next record is still framed."""


def read_frames(file_obj) -> Iterator[Union[bytes, CorruptPayload]]:
    """Each record's payload, or ``CorruptPayload`` for one that fails its checksum.

    Raises ``FrameError`` where the framing itself breaks: nothing after it
    can be located.
    """
    while True:
        head = file_obj.read(12)
        if not head:
            return
        if len(head) < 12:
            raise FrameError(f"truncated record header ({len(head)} of 12 bytes)")
        if _masked_crc(head[:8]) != head[8:12]:
            raise FrameError("record length checksum mismatch")
        (length,) = struct.unpack("<Q", head[:8])
        payload = file_obj.read(length)
        tail = file_obj.read(4)
        if len(payload) < length or len(tail) < 4:
            raise FrameError(f"truncated record ({len(payload)} of {length} payload bytes)")
        if _masked_crc(payload) != tail:
            yield CorruptPayload("record payload checksum mismatch")
        else:
            yield payload


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields_of(data: bytes) -> Iterator[Tuple[int, int, object]]:
    """``(field number, wire type, value)``: value is int (varint/fixed) or bytes (length-delimited)."""
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            value, pos = data[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature_values(feature: bytes) -> List[Value]:
    values: List[Value] = []
    for kind, _, payload in _fields_of(feature):
        for number, wire, value in _fields_of(payload):
            if number != 1:
                continue
            if kind == 1:  # bytes_list
                values.append(bytes(value))
            elif kind == 2:  # float_list: packed or not
                values.extend(struct.unpack(f"<{len(value) // 4}f", value))  # packed or one fixed32
            elif kind == 3:  # int64_list: packed (wire 2) or one varint (wire 0)
                if wire == 0:
                    values.append(_signed(value))
                else:
                    pos = 0
                    while pos < len(value):
                        item, pos = _read_varint(value, pos)
                        values.append(_signed(item))
    return values


def decode_example(payload: bytes) -> Dict[str, List[Value]]:
    """A serialised ``tf.train.Example`` as ``{name: [values]}`` (bytes, int or float values).

    Raises ``ValueError`` on bytes that are not an Example.
    """
    features: Dict[str, List[Value]] = {}
    for number, wire, value in _fields_of(payload):
        if number != 1 or wire != 2:
            continue
        for entry_number, entry_wire, entry in _fields_of(value):
            if entry_number != 1 or entry_wire != 2:
                continue
            name, feature = None, b""
            for field, field_wire, item in _fields_of(entry):
                if field == 1 and field_wire == 2:
                    name = bytes(item).decode("utf-8")
                elif field == 2 and field_wire == 2:
                    feature = bytes(item)
            if name is None:
                raise ValueError("feature map entry without a name")
            features[name] = _feature_values(feature)
    return features
