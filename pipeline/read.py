"""Reading candidates: img2dataset-style Parquet files into ``Candidate`` records.

Files are matched (``fileio.MatchFiles``), never embedded in the job graph, so
the same code reads a local glob or ``gs://bucket/shards/*.parquet``. A match
that is a Spark/Hive-style directory (``x.parquet/part-*.parquet``, with
``_SUCCESS``, ``.crc`` and other hidden files beside them) is read file by
file, hidden files skipped.

Accounting is per row, against the file's own footer. Each row group is read
on its own, and each row becomes exactly one ``Candidate`` or ``Rejection``:

- a bad cell rejects its row with a reason (``read/caption_not_utf8``,
  ``read/url_not_text``, ``read/bad_image_column``, ...), not the file;
- a row group that cannot be decoded rejects its rows (as many as the footer
  says it has) as ``read/unreadable_row_group``, and the other row groups
  are read;
- a file whose row count cannot be known (no footer, not Parquet) is one
  ``read/unreadable_file`` rejection that carries the file name.

Each file then yields exactly as many records as its footer says it has rows
(1 for an unreadable file); anything else stops the job. The ``read``
Metrics counters (``parquet_rows``, ``unreadable_files``) let the launcher
reconcile the funnel's input with the files' metadata.

Image cells are binary (img2dataset's ``jpg``) or Hugging Face's image struct
``{bytes, path}``; a column of any other type rejects each of its rows as
``read/bad_image_column``. String columns are read as raw bytes and decoded
per cell, so one invalid UTF-8 caption costs one row.
"""

from __future__ import annotations

from typing import Iterator, List, NamedTuple, Optional

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from filters import stages
from filters.text import decode_caption
from pipeline.schema import Candidate, make_key
from pipeline.stats import METRICS_NAMESPACE

URL_COLUMNS = ("url",)
CAPTION_COLUMNS = ("caption", "alt_text", "text", "texts")
IMAGE_COLUMNS = ("jpg", "image", "png", "webp")
META_COLUMNS = ("key", "width", "height", "status", "error_message")
#: Beam Metrics namespace of the reader's own accounting (not per record).
READ_NAMESPACE = "read"
BATCH_ROWS = 256  # rows decoded at a time; a row group is never held whole


class Rejection(NamedTuple):
    """A record that will not be written, and the first reason why.

    ``image`` is carried only so the audit sampler can draw a thumbnail; the
    sampler keeps a few per reason before any shuffle.
    """

    key: str
    reason: str
    url: str = ""
    alt_text: str = ""
    width: int = 0
    height: int = 0
    format: str = ""
    image: Optional[bytes] = None


def _first_present(names, columns):
    for name in names:
        if name in columns:
            return name
    return None


class _BadCell:
    """A cell pyarrow could not turn into a Python value."""


BAD_CELL = _BadCell()


def image_column_usable(arrow_type) -> bool:
    """Binary bytes, or a struct with a binary ``bytes`` field (Hugging Face ``Image``)."""
    import pyarrow as pa

    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) or pa.types.is_fixed_size_binary(arrow_type):
        return True
    if pa.types.is_struct(arrow_type):
        index = arrow_type.get_field_index("bytes")
        return index >= 0 and image_column_usable(arrow_type.field(index).type)
    return False


def _raw_strings(column):
    """String columns as binary: bytes are decoded per cell, so one bad cell is one row."""
    import pyarrow as pa

    if pa.types.is_string(column.type):
        return column.cast(pa.binary())
    if pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary())
    return column


def column_values(column) -> list:
    """One column of a record batch as Python values; an unconvertible cell is ``BAD_CELL``."""
    column = _raw_strings(column)
    try:
        return column.to_pylist()
    except Exception:  # e.g. invalid UTF-8 nested in a struct: find the bad cells
        values = []
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
            except Exception:
                values.append(BAD_CELL)
        return values


def _text_of(value) -> Optional[str]:
    """A text cell (str or UTF-8 bytes) as str; None if it is anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _shown(value) -> str:
    """A cell as text for the audit, whatever it holds."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or value is BAD_CELL:
        return ""
    return str(value)


def _image_bytes(value):
    """Image cell -> bytes or None (no image). Hugging Face structs carry ``bytes``."""
    if isinstance(value, dict):
        value = value.get("bytes")
    return bytes(value) if value else None


def batch_to_records(path: str, batch, first_row: int, image_ok: bool = True) -> Iterator[object]:
    """Yield one ``Candidate`` or ``Rejection`` per row of a record batch (pure, no Beam).

    ``first_row`` is the 1-based index of the batch's first row in the file:
    rows that have no usable url are keyed by ``path#row``. ``image_ok`` is
    False when the file's image column has a type that cannot hold images.
    """
    names = batch.schema.names
    url_col = _first_present(URL_COLUMNS, names)
    caption_col = _first_present(CAPTION_COLUMNS, names)
    image_col = _first_present(IMAGE_COLUMNS, names)
    missing = [n for n, c in (("url", url_col), ("caption", caption_col), ("image", image_col)) if c is None]
    wanted = [c for c in (url_col, caption_col, image_col) if c] + [c for c in META_COLUMNS if c in names]
    data = {name: column_values(batch.column(names.index(name))) for name in dict.fromkeys(wanted)}
    for i in range(batch.num_rows):
        row = {name: values[i] for name, values in data.items()}
        position = f"{path}#{first_row + i}"
        raw_url = row.get(url_col) if url_col else None
        url = "" if raw_url is None else _text_of(raw_url)
        if missing:
            shown = _shown(raw_url)
            yield Rejection(make_key(shown or position, ""), stages.reason("read", "missing_column"), url=shown)
            continue
        if url is None:  # binary that is not UTF-8, a number, a list, ...: not a URL
            shown = _shown(raw_url)
            yield Rejection(make_key(position, shown), stages.reason("read", "url_not_text"), url=shown)
            continue
        raw_caption = row.get(caption_col)
        if raw_caption is BAD_CELL:
            caption, caption_reason = "", stages.reason("read", "caption_not_text")
        else:
            caption, caption_reason = decode_caption(raw_caption)
        key = make_key(url, caption)
        source = tuple(
            (k, _shown(row[k]) if isinstance(row[k], bytes) else row[k])
            for k in META_COLUMNS
            if k in row and row[k] is not None and row[k] is not BAD_CELL
        )
        image_cell = row.get(image_col)
        status = _shown(row.get("status")) if row.get("status") is not None else None
        if caption_reason:
            image = _image_bytes(image_cell) if image_ok and image_cell is not BAD_CELL else None
            yield Rejection(key, caption_reason, url=url, alt_text=caption, image=image)
        elif status not in (None, "success"):
            yield Rejection(key, stages.reason("read", "bad_status"), url=url, alt_text=caption)
        elif not image_ok or image_cell is BAD_CELL:
            yield Rejection(key, stages.reason("read", "bad_image_column"), url=url, alt_text=caption)
        else:
            image = _image_bytes(image_cell)
            if image is None:
                yield Rejection(key, stages.reason("read", "no_image"), url=url, alt_text=caption)
            else:
                yield Candidate(key=key, url=url, alt_text=caption, image=image, source=source)


def _unreadable_rows(path: str, first_row: int, count: int, error: Exception) -> Iterator[Rejection]:
    note = f"row group unreadable: {error!r}"[:200]
    for row in range(first_row, first_row + count):
        position = f"{path}#{row}"
        yield Rejection(make_key(position, ""), stages.reason("read", "unreadable_row_group"), url=position, alt_text=note)


def parquet_records(path: str, parquet) -> Iterator[object]:
    """Every row of an open ``pyarrow.parquet.ParquetFile``, row group by row group.

    Yields exactly ``parquet.metadata.num_rows`` records: a row group that
    fails to decode, or decodes short, has its missing rows rejected.
    """
    schema = parquet.schema_arrow
    image_col = _first_present(IMAGE_COLUMNS, schema.names)
    image_ok = image_col is None or image_column_usable(schema.field(image_col).type)
    wanted = [c for c in schema.names if c in URL_COLUMNS + CAPTION_COLUMNS + IMAGE_COLUMNS + META_COLUMNS]
    metadata = parquet.metadata
    first_row = 1
    for group in range(metadata.num_row_groups):
        expected = metadata.row_group(group).num_rows
        done = 0
        try:
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=wanted, use_threads=False):
                if done + batch.num_rows > expected:
                    raise ValueError(f"row group {group} holds more rows than its footer's {expected}")
                yield from batch_to_records(path, batch, first_row + done, image_ok)
                done += batch.num_rows
            if done != expected:
                raise ValueError(f"row group {group} decoded {done} of its {expected} rows")
        except Exception as error:  # the rest of this row group, counted from the footer
            yield from _unreadable_rows(path, first_row + done, expected - done, error)
        first_row += expected


def read_parquet_file(path: str) -> Iterator[object]:
    """One file's records; a file without a readable footer is one named rejection."""
    import pyarrow.parquet as pq

    try:
        handle = FileSystems.open(path)
    except Exception as error:
        yield _unreadable_file(path, error)
        return
    with handle:
        try:
            parquet = pq.ParquetFile(handle)
        except Exception as error:
            yield _unreadable_file(path, error)
            return
        yield from parquet_records(path, parquet)


def _unreadable_file(path: str, error: Exception) -> Rejection:
    return Rejection(make_key(path, ""), stages.reason("read", "unreadable_file"), url=path, alt_text=repr(error)[:200])


def expected_records(path: str) -> int:
    """How many records ``read_parquet_file(path)`` must yield: the footer's row count, or 1."""
    import pyarrow.parquet as pq

    try:
        with FileSystems.open(path) as handle:
            return pq.ParquetFile(handle).metadata.num_rows
    except Exception:
        return 1


class _ReadParquetFile(beam.DoFn):
    def __init__(self):
        self.input_records = Metrics.counter(METRICS_NAMESPACE, "input")
        self.parquet_rows = Metrics.counter(READ_NAMESPACE, "parquet_rows")
        self.unreadable_files = Metrics.counter(READ_NAMESPACE, "unreadable_files")

    def process(self, path: str):
        count = 0
        unreadable = False
        for element in read_parquet_file(path):
            count += 1
            self.input_records.inc()
            if isinstance(element, Rejection):
                Metrics.counter(METRICS_NAMESPACE, element.reason).inc()
                unreadable = element.reason == "read/unreadable_file"
            yield element
        if unreadable:
            self.unreadable_files.inc()
        else:
            self.parquet_rows.inc(count)
        expected = expected_records(path)
        if count != expected:
            raise RuntimeError(f"{path}: read {count} records, its footer says {expected} rows")


def is_hidden(relative_path: str) -> bool:
    """Spark/Hadoop bookkeeping inside a dataset directory: ``_SUCCESS``, ``.crc``, ``_temporary/``."""
    return any(part.startswith(("_", ".")) for part in relative_path.replace("\\", "/").split("/") if part)


def directory_members(pattern: str) -> str:
    """The pattern of files inside directories that ``pattern`` matches (``x.parquet/**``)."""
    return pattern.rstrip("/\\") + "/**"


def _matched_directory(path: str, pattern: str) -> str:
    """The part of ``path`` inside the directory ``pattern`` matched (for the hidden-file rule)."""
    import re

    base = re.compile(FileSystem.translate_pattern(pattern.rstrip("/\\"))[:-2])  # drop the \Z
    found = base.match(path)
    return path[found.end():] if found else path


def is_directory(path: str) -> bool:
    """A matched path that is a directory (local) or a directory placeholder object (``gs://.../``)."""
    import os

    return path.endswith("/") or ("://" not in path and os.path.isdir(path))


def list_input_files(pattern: str) -> List[str]:
    """Every file the job will read: matches of ``pattern`` plus the data files of matched directories."""
    files = set()
    for result in FileSystems.match([pattern, directory_members(pattern)]):
        for meta in result.metadata_list:
            if result.pattern == pattern:
                if not is_directory(meta.path):
                    files.add(meta.path)
            elif not is_hidden(_matched_directory(meta.path, pattern)):
                files.add(meta.path)
    return sorted(files)


class ReadCandidates(beam.PTransform):
    """Glob of Parquet files (and Spark-style directories) -> ``Candidate`` | ``Rejection``."""

    def __init__(self, file_pattern: str):
        super().__init__()
        self.file_pattern = file_pattern

    def expand(self, pbegin):
        pattern = self.file_pattern
        files = (
            pbegin
            | "MatchFiles" >> fileio.MatchFiles(pattern, fileio.EmptyMatchTreatment.ALLOW)
            | "SkipDirectories" >> beam.Filter(lambda meta: not is_directory(meta.path))
        )
        members = (
            pbegin
            | "MatchDirectoryMembers" >> fileio.MatchFiles(directory_members(pattern), fileio.EmptyMatchTreatment.ALLOW)
            | "SkipHidden" >> beam.Filter(lambda meta: not is_hidden(_matched_directory(meta.path, pattern)))
        )
        return (
            (files, members)
            | "AllFiles" >> beam.Flatten()
            | "Paths" >> beam.Map(lambda meta: meta.path)
            | "Reshuffle" >> beam.Reshuffle()
            | "ParseRows" >> beam.ParDo(_ReadParquetFile())
        )
