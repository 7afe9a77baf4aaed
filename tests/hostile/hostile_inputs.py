"""Hostile input files, written by code: each mixes good records with what an attacker would write.

Every writer returns the fates the file's records must have, in order
(``written`` or a reason), and the urls of its good records. The good
records are real: a JPEG photo each, with a caption the text filters keep,
so the end-to-end build writes them.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import struct
import tarfile
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from common import tfrecord_io as tfrecord

import parquet_footer

CAPTIONS = ["a striped pattern in warm colours", "waves of colour across a wall", "soft bands of light and shade"]


@functools.lru_cache(maxsize=None)
def photo(seed, size=(420, 300)):
    """A JPEG that passes the image filters (size, aspect, not a duplicate of another seed)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size[1], 0:size[0]]
    freq = rng.uniform(0.01, 0.05, 3)
    arr = np.stack([127 + 120 * np.sin(xx * f + yy * f * (i + 1) + seed) for i, f in enumerate(freq)], -1)
    out = io.BytesIO()
    Image.fromarray(arr.astype("uint8")).save(out, format="JPEG", quality=90)
    return out.getvalue()


def good_text(name, i):
    """``(url, caption)`` of good record ``i`` of file ``name``."""
    return f"https://good.example/{name}/{i}.jpg", f"{CAPTIONS[i % 3]} number {i} of {name}"


def good(name, i):
    """``(url, caption, jpeg)`` of good record ``i`` of file ``name``."""
    return (*good_text(name, i), photo(zlib.crc32(f"{name}/{i}".encode()) % 100_000))


# ---------------------------------------------------------------------------
# TFRecord and tf.train.Example wire data
# ---------------------------------------------------------------------------


def _varint(value):
    return tfrecord._varint(value)


def _field(number, payload):
    return tfrecord._field(number, payload)


def example_with(feature_name, feature_bytes, url="https://bad.example/x.jpg"):
    """A valid Example (url, caption) plus one feature whose ``Feature`` message is ``feature_bytes``."""
    base = tfrecord.encode_example({"url": url, "caption": "a record with one bad feature"})
    entry = _field(1, _field(1, feature_name.encode()) + _field(2, feature_bytes))
    return _field(1, _entries(base) + entry)


def _entries(example):
    """The map entries inside an encoded Example's ``features`` field."""
    _, _, features = next(tfrecord._fields_of(memoryview(example)))
    return bytes(features)


def good_example(name, i):
    url, caption, image = good(name, i)
    return tfrecord.encode_example({"url": url, "caption": caption, "image": image})


def write_frames(path, payloads, tail=b""):
    with open(path, "wb") as handle:
        for payload in payloads:
            handle.write(tfrecord.frame_record(payload))
        handle.write(tail)


def length_header(length):
    """A record header claiming ``length`` bytes, with a valid length checksum."""
    head = struct.pack("<Q", length)
    return head + tfrecord._masked_crc(head)


# ---------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------


def write_parquet(path, rows, **kwargs):
    pq.write_table(pa.Table.from_pylist(rows), path, **kwargs)


def good_rows(name, count, start=0):
    rows = []
    for i in range(start, start + count):
        url, caption, image = good(name, i)
        rows.append({"url": url, "caption": caption, "jpg": image})
    return rows


def lying_parquet(path, file_rows=None, group_rows=None, count=6):
    """``count`` good rows in one row group, whose footer then states other row counts."""
    write_parquet(path, good_rows(path.stem, count))
    parquet_footer.set_rows(path, file_rows=file_rows, group_rows=group_rows)


# ---------------------------------------------------------------------------
# Tar shards
# ---------------------------------------------------------------------------


def add_member(tar, name, data, **attributes):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attributes.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data))


def sample_members(name, i):
    url, caption, image = good(name, i)
    key = f"{i:05d}"
    meta = {"url": url, "caption": caption, "key": key, "status": "success"}
    return [(f"{key}.jpg", image), (f"{key}.txt", caption.encode()), (f"{key}.json", json.dumps(meta).encode())]


def tar_bytes(members, fmt=tarfile.PAX_FORMAT):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for member_name, data in members:
            add_member(tar, member_name, data)
    return buffer.getvalue()


def nested_json(depth):
    return b"[" * depth + b"]" * depth


def gzip_zeros(size, chunk=1 << 20):
    """``size`` zero bytes gzipped, without holding them."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as stream:
        block = b"\0" * chunk
        for _ in range(size // chunk):
            stream.write(block)
        stream.write(b"\0" * (size % chunk))
    return out.getvalue()
