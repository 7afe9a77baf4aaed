"""TFRecord files of ``tf.train.Example``, e.g. this project's own shards (for re-filtering).

Parsed with the project's own codec (``pipeline.tfrecord``), so workers need
no TensorFlow. Features are looked up like columns: url ``url``, caption
``texts``/``caption``/..., image ``image``/``jpg``/...; ``original_width`` /
``original_height`` are the source size and ``key``/``sha256`` are carried as
``source_key``/``source_sha256``. A feature with several values uses the first.

Each record is one input record:

- a record whose payload checksum fails -> ``read/corrupt_record`` (the next
  one is still framed and read);
- a payload that is not an Example -> ``read/malformed_record``;
- a file whose framing breaks (truncated, bad length checksum) is
  ``read/truncated_file`` from where it stopped: nothing after that point
  can be located.

A TFRecord file states no count of its own, but a TFDS directory's
``dataset_info.json`` states every shard's length. When the file is such a
shard, that length is the count: a truncated shard rejects exactly the
records it is missing, and reading any other number stops the job. Without
it, a truncated file adds one ``read/truncated_file`` record.
"""

from __future__ import annotations

import json
import posixpath
from typing import Iterator, Optional

from apache_beam.io.filesystems import FileSystems

from common.schema import make_key
from filters import stages
from pipeline import tfrecord as codec
from pipeline.readers.rows import Columns, Rejection, Row, first_present, to_record


def example_row(position: str, features: dict, columns: Columns) -> Row:
    meta = {name: values[0] for name, values in features.items() if values}
    url_col = first_present(columns.url, features)
    caption_col = first_present(columns.caption, features)
    image_col = first_present(columns.image, features)
    missing = tuple(n for n, c in (("url", url_col), ("caption", caption_col)) if c is None)
    return Row(
        position,
        meta.get(url_col) if url_col else None,
        meta.get(caption_col) if caption_col else None,
        image=meta.get(image_col) if image_col else None,
        meta=meta,
        missing=missing,
        has_image_column=image_col is not None,
    )


def stated_length(path: str) -> Optional[int]:
    """The shard's length from ``dataset_info.json`` in its directory (TFDS naming), or None."""
    directory, name = posixpath.split(path.replace("\\", "/"))
    info_path = FileSystems.join(directory, "dataset_info.json") if directory else "dataset_info.json"
    try:
        with FileSystems.open(info_path) as handle:
            info = json.loads(handle.read())
    except Exception:
        return None
    suffix = info.get("fileFormat", "tfrecord")
    for split in info.get("splits", []):
        lengths = split.get("shardLengths", [])
        width = max(5, len(str(len(lengths))))  # TFDS: at least 5 digits, more from 100,000 shards on
        for index, length in enumerate(lengths):
            if name == f"{info.get('name')}-{split.get('name')}.{suffix}-{index:0{width}d}-of-{len(lengths):0{width}d}":
                return int(length)
    return None


def read_handle(path: str, handle, columns: Columns = Columns(), stated: Optional[int] = None) -> Iterator[object]:
    index = 0
    try:
        for payload in codec.read_frames(handle):
            index += 1
            position = f"{path}#{index}"
            if isinstance(payload, codec.CorruptPayload):
                yield Rejection(make_key(position, ""), stages.reason("read", "corrupt_record"), url=position, alt_text=str(payload))
                continue
            try:
                features = codec.decode_example(payload)
            except (ValueError, UnicodeDecodeError) as error:
                yield Rejection(make_key(position, ""), stages.reason("read", "malformed_record"), url=position, alt_text=repr(error)[:200])
                continue
            yield to_record(example_row(position, features, columns), columns.carry, columns.download)
    except codec.FrameError as error:
        missing = stated - index if stated is not None and stated > index else 1
        for number in range(index + 1, index + 1 + missing):
            where = f"{path}#{number}" if stated is not None else f"{path}#after-{index}"
            yield Rejection(make_key(where, ""), stages.reason("read", "truncated_file"), url=where, alt_text=str(error))


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    stated = stated_length(path)
    with FileSystems.open(path) as handle:
        yield from read_handle(path, handle, columns, stated)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """The shard length ``dataset_info.json`` states, or None (a bare TFRecord file states no count)."""
    return stated_length(path)
