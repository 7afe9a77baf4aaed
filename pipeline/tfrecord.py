"""TFRecord shards without TensorFlow on the workers.

A ``tf.train.Example`` is a small protobuf; encoding it by hand (with keys in
a fixed order) keeps the Beam workers free of the TensorFlow dependency and
makes the bytes deterministic. ``tests/pipeline/test_tfrecord.py`` checks the
output against TensorFlow's own parser and reader.
"""

from __future__ import annotations

import struct
from typing import Dict, Iterable, Union

import google_crc32c

Value = Union[bytes, str, int]


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 negatives as two's complement, 10 bytes
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


def _feature(value: Value) -> bytes:
    if isinstance(value, bool) or isinstance(value, int):
        return _field(3, _field(1, _varint(int(value))))  # Feature.int64_list.value (packed)
    if isinstance(value, str):
        value = value.encode("utf-8")
    return _field(1, _field(1, bytes(value)))  # Feature.bytes_list.value


def encode_example(features: Dict[str, Value]) -> bytes:
    """Serialise a flat dict of scalar bytes/str/int features as tf.train.Example."""
    entries = b"".join(
        _field(1, _field(1, name.encode("utf-8")) + _field(2, _feature(value)))
        for name, value in features.items()
    )
    return _field(1, entries)  # Example.features(Features.feature map entries)


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
