"""TFRecord framing and ``tf.train.Example`` bytes without TensorFlow: the one codec of the project.

A ``tf.train.Example`` is a small protobuf; encoding it by hand (with keys in
a fixed order) keeps the Beam workers free of the TensorFlow dependency and
makes the bytes deterministic. Reading (``read_frames``, ``decode_example``)
is the same codec backwards: the build reads shards as input with it
(``pipeline.readers.tfrecord``), the download stage its staging files, and the
trainer every shard it trains on (``trainer.shard_reader``). It trusts no
length beyond the bytes it has (``common.files.read_at_most``).
``tests/common/test_tfrecord_io.py`` checks the output against TensorFlow's
own parser and reader.
"""

from __future__ import annotations

import functools
import struct
from typing import Collection, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple, Union

import google_crc32c

from common.files import read_at_most, skip

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
    """The file cannot be framed past this point; ``kind`` says why, for callers that word it their own way.

    ``header_truncated``: the file ends inside a record header; ``length_corrupt``:
    a length fails its checksum; ``too_large``: a length over the cap (with
    ``skip_too_large=False``); ``payload_truncated``: the file ends inside a record.
    """

    def __init__(self, message: str, kind: str, length: int = 0):
        super().__init__(message)
        self.kind = kind
        self.length = length


class CorruptPayload(Exception):
    """One record's payload checksum does not match; the next record is still framed."""

    def __init__(self, message: str, length: int = 0):
        super().__init__(message)
        self.length = length  # the payload's (checksummed) length: where the next frame starts


class TooLarge(NamedTuple):
    """A record whose (checksummed) length is over the cap: read through, not kept; the next is still framed."""

    length: int


#: A record longer than this is read through, not kept (``TooLarge``), unless the caller says otherwise.
MAX_RECORD_BYTES = 32 << 20
HEADER_BYTES = 12  # uint64 length, uint32 masked CRC32C of the length
FOOTER_BYTES = 4  # uint32 masked CRC32C of the payload


def read_frames(file_obj, max_record_bytes: int = MAX_RECORD_BYTES,
                skip_too_large: bool = True) -> Iterator[Union[bytes, CorruptPayload, TooLarge]]:
    """Each record's payload, ``CorruptPayload`` for one that fails its checksum, ``TooLarge`` for one over the cap.

    Raises ``FrameError`` where the framing itself breaks: nothing after it
    can be located. A length is believed only as far as the bytes go: a
    payload is read in chunks, so a false length costs no memory. With
    ``skip_too_large=False`` a length over the cap is taken for damage
    (``FrameError`` of kind ``too_large``) instead of being read through.
    """
    while True:
        head = read_at_most(file_obj, HEADER_BYTES)
        if not head:
            return
        if len(head) < HEADER_BYTES:
            raise FrameError(f"truncated record header ({len(head)} of 12 bytes)", "header_truncated")
        if _masked_crc(head[:8]) != head[8:12]:
            raise FrameError("record length checksum mismatch", "length_corrupt")
        (length,) = struct.unpack("<Q", head[:8])
        if length > max_record_bytes:
            if not skip_too_large:
                raise FrameError(f"a record length of {length:,} bytes", "too_large", length)
            present = skip(file_obj, length + FOOTER_BYTES)
            if present < length + FOOTER_BYTES:
                raise FrameError(f"truncated record ({min(present, length):,} of {length:,} payload bytes)",
                                 "payload_truncated", length)
            yield TooLarge(length)
            continue
        payload = read_at_most(file_obj, length)
        tail = read_at_most(file_obj, FOOTER_BYTES)
        if len(payload) < length or len(tail) < FOOTER_BYTES:
            raise FrameError(f"truncated record ({len(payload):,} of {length:,} payload bytes)",
                             "payload_truncated", length)
        if _masked_crc(payload) != tail:
            yield CorruptPayload("record payload checksum mismatch", length)
        else:
            yield payload


def _read_varint(data, pos: int) -> Tuple[int, int]:
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


_FIXED = {1: 8, 5: 4}  # wire type -> bytes


def _fields_of(data) -> Iterator[Tuple[int, int, object]]:
    """``(field number, wire type, value)``: an int for a varint, a slice of ``data`` otherwise.

    ``data`` is a ``memoryview``: slices share its bytes, so walking an
    Example's nested messages copies nothing until a value is kept.
    """
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire in _FIXED or wire == 2:
            if wire == 2:
                length, pos = _read_varint(data, pos)
            else:
                length = _FIXED[wire]
            if pos + length > len(data):
                raise ValueError(f"truncated field {number} ({len(data) - pos:,} of {length:,} bytes)")
            value, pos = data[pos : pos + length], pos + length
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _expect(wire: int, wanted: int, what: str) -> None:
    if wire != wanted:
        raise ValueError(f"{what} has wire type {wire}, not {wanted}")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_KINDS = {1: "bytes_list", 2: "float_list", 3: "int64_list"}


def _feature_list(feature) -> Tuple[int, object]:
    """``(kind, list message)`` of a ``Feature`` (a oneof: the last kind present wins); kind 0 if empty."""
    found = (0, memoryview(b""))
    for kind, wire, payload in _fields_of(feature):
        if kind in _KINDS:
            _expect(wire, 2, f"Feature.{_KINDS[kind]}")
            found = (kind, payload)
    return found


def _list_values(kind: int, body, first_only: bool) -> List[Value]:
    values: List[Value] = []
    for number, wire, value in _fields_of(body):
        if number != 1:
            continue
        if kind == 1:  # bytes_list
            _expect(wire, 2, "a bytes_list value")
            values.append(bytes(value))
        elif kind == 2:  # float_list: packed (wire 2) or one fixed32 (wire 5)
            if wire not in (2, 5):
                raise ValueError(f"a float_list value has wire type {wire}")
            if len(value) % 4:
                raise ValueError(f"a float_list of {len(value):,} bytes, not whole 4-byte floats")
            count = 1 if first_only else len(value) // 4
            values.extend(struct.unpack(f"<{count}f", value[: 4 * count]))
        elif kind == 3:  # int64_list: packed (wire 2) or one varint (wire 0)
            if wire == 0:
                values.append(_signed(value))
            elif wire == 2:
                pos = 0
                while pos < len(value):
                    item, pos = _read_varint(value, pos)
                    values.append(_signed(item))
                    if first_only:
                        break
            else:
                raise ValueError(f"an int64_list value has wire type {wire}")
        if first_only and values:
            return values[:1]
    return values


def _named_features(payload: bytes) -> Iterator[Tuple[Optional[str], object]]:
    """``(name or None, Feature bytes)`` of each entry of a serialised Example's feature map, in order; the wire
    types checked on the way (``ValueError``). Unknown fields are skipped, as protobuf does."""
    for number, wire, value in _fields_of(memoryview(payload)):
        if number != 1:
            continue
        _expect(wire, 2, "Example.features")
        for entry_number, entry_wire, entry in _fields_of(value):
            if entry_number != 1:
                continue
            _expect(entry_wire, 2, "a feature map entry")
            name, feature = None, memoryview(b"")
            for field, field_wire, item in _fields_of(entry):
                if field == 1:
                    _expect(field_wire, 2, "a feature name")
                    name = bytes(item).decode("utf-8")
                elif field == 2:
                    _expect(field_wire, 2, "a Feature")
                    feature = item
            yield name, feature


def decode_example(payload: bytes, names: Optional[Collection[str]] = None, first_only: bool = False) -> Dict[str, List[Value]]:
    """A serialised ``tf.train.Example`` as ``{name: [values]}`` (bytes, int or float values).

    Raises ``ValueError`` on bytes that are not an Example: a truncated
    field, a known field of the wrong wire type, a float list of a length
    that is not whole floats, a name that is not UTF-8. ``names``: decode
    only these features' values (every feature is still walked and checked,
    and every name is in the result); ``first_only``: at most one value per
    feature, so a list of millions costs nothing to skip.
    """
    features: Dict[str, List[Value]] = {}
    for name, feature in _named_features(payload):
        if name is None:
            raise ValueError("feature map entry without a name")
        kind, body = _feature_list(feature)
        if names is not None and name not in names:
            _list_values(kind, body, first_only=True)  # its first value is checked, none kept
            continue
        features[name] = _list_values(kind, body, first_only)
    return features


def first_values(payload: bytes, names: Collection[str]) -> Dict[str, Value]:
    """``{name: first value}`` of these features of a serialised ``tf.train.Example``, walking its features only
    until each name is found (a name absent or without values is absent from the result).

    For a payload whose frame's checksum has just been checked (a copy from a
    shard this project wrote): ``decode_example`` walks and checks every
    feature, which for a picture copied from a shard costs more than the copy.
    ``ValueError`` on what it walks of bytes that are not an Example.
    """
    wanted, found = set(names), {}
    for name, feature in _named_features(payload):
        if name not in wanted:
            continue
        values = _list_values(*_feature_list(feature), first_only=True)
        if values:
            found[name] = values[0]
        else:
            found.pop(name, None)
        if len(found) == len(wanted):
            return found
    return found
