"""img2dataset-style Parquet (with or without image bytes), read per row against the footer.

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
(1 for an unreadable file); ``expected_records`` gives that number.

Image cells are binary (img2dataset's ``jpg``) or Hugging Face's image struct
``{bytes, path}``; a column of any other type rejects each of its rows as
``read/bad_image_column``. A file without any image column is a URL list
(img2dataset's metadata-only Parquet, written beside its WebDataset tars and
``files`` folders): its rows are ``read/not_downloaded`` or, for failed
downloads, ``read/download_failed/...``. String columns are read as raw bytes
and decoded per cell, so one invalid UTF-8 caption costs one row.
"""

from __future__ import annotations

from typing import Iterator, Optional

from apache_beam.io.filesystems import FileSystems

from common.schema import make_key
from filters import stages
from pipeline.readers.rows import (
    BAD_CELL, Columns, Rejection, Row, first_present, to_record,
)

BATCH_ROWS = 256  # rows decoded at a time; a row group is never held whole


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


def batch_rows(path: str, batch, first_row: int, image_ok: bool = True, columns: Columns = Columns()) -> Iterator[Row]:
    """One ``Row`` per row of a record batch; ``first_row`` is the 1-based file row of the first."""
    names = batch.schema.names
    url_col = first_present(columns.url, names)
    caption_col = first_present(columns.caption, names)
    image_col = first_present(columns.image, names)
    missing = tuple(n for n, c in (("url", url_col), ("caption", caption_col)) if c is None)
    wanted = [c for c in (url_col, caption_col, image_col) if c] + [c for c in columns.wanted() if c in names]
    data = {name: column_values(batch.column(names.index(name))) for name in dict.fromkeys(wanted)}
    for i in range(batch.num_rows):
        cells = {name: values[i] for name, values in data.items()}
        yield Row(
            position=f"{path}#{first_row + i}",
            url=cells.get(url_col) if url_col else None,
            caption=cells.get(caption_col) if caption_col else None,
            image=cells.get(image_col) if image_col else None,
            meta=cells,
            missing=missing,
            has_image_column=image_col is not None,
            image_ok=image_ok,
        )


def batch_to_records(path: str, batch, first_row: int, image_ok: bool = True, columns: Columns = Columns()) -> Iterator[object]:
    """Yield one ``Candidate`` or ``Rejection`` per row of a record batch (pure, no Beam)."""
    for row in batch_rows(path, batch, first_row, image_ok, columns):
        yield to_record(row, columns.carry, columns.download)


def _unreadable_rows(path: str, first_row: int, count: int, error: Exception) -> Iterator[Rejection]:
    note = f"row group unreadable: {error!r}"[:200]
    for row in range(first_row, first_row + count):
        position = f"{path}#{row}"
        yield Rejection(make_key(position, ""), stages.reason("read", "unreadable_row_group"), url=position, alt_text=note)


def wanted_columns(schema_names, columns: Columns):
    return [c for c in schema_names if c in columns.wanted()]


def parquet_batches(path: str, parquet, columns: Columns = Columns()) -> Iterator[object]:
    """Every row of an open ``pyarrow.parquet.ParquetFile`` as a ``Row``, or a ``Rejection``
    for rows of a row group that cannot be decoded; exactly ``metadata.num_rows`` items."""
    schema = parquet.schema_arrow
    image_col = first_present(columns.image, schema.names)
    image_ok = image_col is None or image_column_usable(schema.field(image_col).type)
    wanted = wanted_columns(schema.names, columns)
    metadata = parquet.metadata
    first_row = 1
    for group in range(metadata.num_row_groups):
        expected = metadata.row_group(group).num_rows
        done = 0
        try:
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=wanted, use_threads=False):
                if done + batch.num_rows > expected:
                    raise ValueError(f"row group {group} holds more rows than its footer's {expected}")
                yield from batch_rows(path, batch, first_row + done, image_ok, columns)
                done += batch.num_rows
            if done != expected:
                raise ValueError(f"row group {group} decoded {done} of its {expected} rows")
        except Exception as error:  # the rest of this row group, counted from the footer
            yield from _unreadable_rows(path, first_row + done, expected - done, error)
        first_row += expected


def parquet_records(path: str, parquet, columns: Columns = Columns()) -> Iterator[object]:
    """Every row of an open ``pyarrow.parquet.ParquetFile``, row group by row group.

    Yields exactly ``parquet.metadata.num_rows`` records: a row group that
    fails to decode, or decodes short, has its missing rows rejected.
    """
    for item in parquet_batches(path, parquet, columns):
        yield item if isinstance(item, Rejection) else to_record(item, columns.carry, columns.download)


def unreadable_file(path: str, error: Exception) -> Rejection:
    return Rejection(make_key(path, ""), stages.reason("read", "unreadable_file"), url=path, alt_text=repr(error)[:200])


def open_parquet(handle):
    import pyarrow.parquet as pq

    return pq.ParquetFile(handle)


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    """One file's records; a file without a readable footer is one named rejection."""
    try:
        handle = FileSystems.open(path)
    except Exception as error:
        yield unreadable_file(path, error)
        return
    with handle:
        try:
            parquet = open_parquet(handle)
        except Exception as error:
            yield unreadable_file(path, error)
            return
        yield from parquet_records(path, parquet, columns)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """How many records ``read_file(path)`` must yield: the footer's row count, or 1."""
    try:
        with FileSystems.open(path) as handle:
            return open_parquet(handle).metadata.num_rows
    except Exception:
        return 1


def has_image_column(path: str, columns: Columns = Columns()) -> Optional[bool]:
    """Whether the file has an image column; None if it is not readable Parquet."""
    try:
        with FileSystems.open(path) as handle:
            return first_present(columns.image, open_parquet(handle).schema_arrow.names) is not None
    except Exception:
        return None
