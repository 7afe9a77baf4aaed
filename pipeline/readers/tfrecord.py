"""TFRecord files of ``tf.train.Example``, e.g. this project's own shards (for re-filtering).

Parsed with the project's own codec (``common.tfrecord_io``), so workers need
no TensorFlow. Features are looked up like columns: url ``url``, caption
``texts``/``caption``/..., image ``image``/``jpg``/...; ``original_width`` /
``original_height`` are the source size and ``key``/``sha256`` are carried as
``source_key``/``source_sha256``. A feature with several values uses the first.

Each record is one input record:

- a record whose payload checksum fails -> ``read/corrupt_record`` (the next
  one is still framed and read);
- a record longer than ``--read_max_record_bytes`` -> ``read/too_large``
  (read through, never held; its length is checksummed, so the next one is
  still framed);
- a payload that is not an Example (a truncated field, a known field of the
  wrong wire type, a float list that is not whole floats) ->
  ``read/malformed_record``;
- a file whose framing breaks (truncated, bad length checksum, a ``.gz``
  cut short) is one ``read/truncated_file`` record from where it stopped:
  nothing after that point can be located.

A TFRecord file states no count of its own, but a TFDS directory's
``dataset_info.json`` states every shard's length. When the file is such a
shard, that length is its count: a truncated shard's ``read/truncated_file``
says how many records it is missing (``unread_records``), and a shard that
holds another number than stated is reconciled by ``pipeline.readers.file_records``.
Without it, ``unread_records`` is ``unknown``. The file may be compressed
(``.gz``, as ``TFRecordDataset(compression_type="GZIP")`` reads).
"""

from __future__ import annotations

import posixpath
from typing import Iterator, Optional

from apache_beam.io.filesystems import FileSystems

from common import tfrecord_io as codec
from common.files import read_at_most
from common.schema import make_key
from filters import stages
from pipeline.readers.limits import ReadLimits, load_json
from pipeline.readers.losses import malformed, marker, too_large
from pipeline.readers.rows import Columns, Rejection, Row, decided, first_present, to_record
from pipeline.readers.streams import StreamError, open_input


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


def _whole_number(value) -> Optional[int]:
    """A length as TFDS writes it (int64 as a decimal string, in proto JSON), or None."""
    if isinstance(value, str) and value.isdigit() and len(value) <= 19:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def stated_length(path: str, limits: ReadLimits = ReadLimits()) -> Optional[int]:
    """The shard's length from ``dataset_info.json`` in its directory (TFDS naming), or None.

    The file is metadata like any other input: read within the record cap,
    and a length that is not a whole number states nothing.
    """
    directory, name = posixpath.split(path.replace("\\", "/"))
    info_path = FileSystems.join(directory, "dataset_info.json") if directory else "dataset_info.json"
    try:
        with FileSystems.open(info_path) as handle:
            info = load_json(read_at_most(handle, limits.max_record_bytes))
        suffix = info.get("fileFormat", "tfrecord")
        for split in info.get("splits", []):
            lengths = split.get("shardLengths", [])
            width = max(5, len(str(len(lengths))))  # TFDS: at least 5 digits, more from 100,000 shards on
            for index, length in enumerate(lengths):
                if name == f"{info.get('name')}-{split.get('name')}.{suffix}-{index:0{width}d}-of-{len(lengths):0{width}d}":
                    return _whole_number(length)
    except Exception:  # absent, unreadable or not TFDS metadata: the shard states no count
        return None
    return None


def example_record(position: str, payload, columns: Columns, wanted) -> object:
    """One framed record -> its ``Candidate`` or ``Rejection``."""
    if isinstance(payload, codec.TooLarge):
        return too_large(position, "record", payload.length, columns.limits.max_record_bytes, "--read_max_record_bytes")
    if isinstance(payload, codec.CorruptPayload):
        return Rejection(make_key(position, ""), stages.reason("read", "corrupt_record"), url=position, alt_text=str(payload))
    try:
        features = codec.decode_example(payload, wanted, first_only=True)
    except ValueError as error:  # includes a name that is not UTF-8
        return malformed(position, f"not a tf.train.Example: {error}")
    return to_record(example_row(position, features, columns), columns.carry, columns.download)


def read_handle(path: str, handle, columns: Columns = Columns(), stated: Optional[int] = None) -> Iterator[object]:
    wanted = frozenset(columns.wanted())
    index = 0
    try:
        for payload in codec.read_frames(handle, columns.limits.max_record_bytes):
            index += 1
            position = f"{path}#{index}"
            yield decided(position, lambda: example_record(position, payload, columns, wanted))
    except (codec.FrameError, StreamError) as error:
        if stated is None:
            yield marker(f"{path}#after-{index}", "truncated_file", f"{error}; the file states no count", None)
        else:
            unread = max(stated - index, 0)
            yield marker(f"{path}#after-{index}", "truncated_file",
                         f"{error}; {unread:,} of the {stated:,} records dataset_info.json states not read", unread)


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    stated = stated_length(path, columns.limits)
    with open_input(path) as handle:
        yield from read_handle(path, handle, columns, stated)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """The shard length ``dataset_info.json`` states, or None (a bare TFRecord file states no count)."""
    return stated_length(path, columns.limits)
