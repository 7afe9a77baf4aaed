"""img2dataset-style Parquet (with or without image bytes), read per row against the footer.

Accounting is per row, against the file's own footer, believed only as far
as the bytes go. Each row group is read on its own, a few rows at a time
(as many as ``--read_max_record_bytes`` holds by the footer's sizes, at
most ``BATCH_ROWS``), and each row becomes exactly one ``Candidate`` or
``Rejection``:

- a bad cell rejects its row with a reason (``read/caption_not_utf8``,
  ``read/url_not_text``, ``read/bad_image_column``, ...), not the file; a
  row whose cells hold more than ``--read_max_record_bytes`` is
  ``read/too_large``;
- a row group whose column chunks lie outside the file, or that cannot be
  decoded, is one ``read/unreadable_row_group`` record standing for the rows
  it did not give (``unread_records``, ``pipeline.readers.losses``), and
  the other row groups are read;
- a count the bytes do not bear out is one ``read/inconsistent_metadata``
  record saying so: a file footer whose row count is not the sum of its row
  groups', a row group whose pages hold fewer rows than it states (a footer
  claiming 100,000 rows over 6 costs one record, not 99,994), or one whose
  column chunks hold more values than it states rows;
- a file whose footer cannot be read (no footer, not Parquet) is one
  ``read/unreadable_file`` rejection that carries the file name.

Rows read plus the markers' ``unread_records`` (less their
``unstated_records``) equal the footer's row count, which
``expected_records`` gives (1 for an unreadable file).

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
from pipeline.readers.losses import marker, too_large
from pipeline.readers.rows import (
    BAD_CELL,
    Columns,
    Rejection,
    Row,
    decided,
    first_present,
    text_of,
    to_record,
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


def wanted_columns(schema_names, columns: Columns):
    return [c for c in schema_names if c in columns.wanted()]


def _chunks(metadata, group: int, wanted_paths):
    row_group = metadata.row_group(group)
    for index in range(row_group.num_columns):
        chunk = row_group.column(index)
        if chunk.path_in_schema.split(".")[0] in wanted_paths:
            yield chunk


def group_problem(metadata, group: int, wanted_paths, file_size: Optional[int]) -> Optional[str]:
    """Why a row group's metadata cannot be believed before reading it, or None."""
    row_group = metadata.row_group(group)
    if row_group.num_rows < 0:
        return f"row group {group} states {row_group.num_rows} rows"
    for chunk in _chunks(metadata, group, wanted_paths):
        offsets = [o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None]
        if not offsets or min(offsets) < 0 or chunk.total_compressed_size < 0 or chunk.total_uncompressed_size < 0:
            return f"row group {group}: column {chunk.path_in_schema} states a negative or missing offset or size"
        start = min(offsets)
        if file_size is not None and start + chunk.total_compressed_size > file_size:
            return (f"row group {group}: column {chunk.path_in_schema} states {chunk.total_compressed_size:,} bytes "
                    f"at byte {start:,}, past the end of the {file_size:,}-byte file")
    return None


def batch_size(metadata, group: int, wanted_paths, max_batch_bytes: int) -> int:
    """Rows per batch: what ``max_batch_bytes`` holds by the footer's uncompressed sizes (1 to ``BATCH_ROWS``)."""
    row_group = metadata.row_group(group)
    size = sum(max(chunk.total_uncompressed_size, 0) for chunk in _chunks(metadata, group, wanted_paths))
    per_row = size / max(row_group.num_rows, 1)
    return int(max(1, min(BATCH_ROWS, max_batch_bytes // max(per_row, 1))))


def _flat_values(parquet, group: int, wanted_paths) -> Optional[int]:
    """The most values a flat (non-repeated) wanted column chunk of the row group states, or None."""
    row_group = parquet.metadata.row_group(group)
    counts = [
        row_group.column(i).num_values
        for i in range(row_group.num_columns)
        if row_group.column(i).path_in_schema in wanted_paths and parquet.schema.column(i).max_repetition_level == 0
    ]
    return max(counts) if counts else None


def parquet_batches(path: str, parquet, columns: Columns = Columns(), file_size: Optional[int] = None) -> Iterator[object]:
    """Every row of an open ``pyarrow.parquet.ParquetFile`` as a ``Row``, plus marker ``Rejection``s
    (``pipeline.readers.losses``) for what the footer states but the bytes do not give."""
    schema = parquet.schema_arrow
    image_col = first_present(columns.image, schema.names)
    image_ok = image_col is None or image_column_usable(schema.field(image_col).type)
    wanted = wanted_columns(schema.names, columns)
    metadata = parquet.metadata
    claims = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    groups_total = sum(max(c, 0) for c in claims)
    if metadata.num_rows != groups_total:
        stated = metadata.num_rows
        yield marker(f"{path}#footer", "inconsistent_metadata",
                     f"the file footer states {stated:,} rows, its {len(claims):,} row groups {groups_total:,}",
                     unread=max(stated - groups_total, 0), unstated=max(groups_total - stated, 0))
    first_row = 1
    for group, claim in enumerate(claims):
        yield from _row_group(path, parquet, group, claim, first_row, wanted, image_ok, columns, file_size)
        first_row += max(claim, 0)


def _row_group(path, parquet, group, claim, first_row, wanted, image_ok, columns, file_size) -> Iterator[object]:
    """One row group's rows, and a marker for what it states but does not give."""
    where = f"{path}#row-group-{group}"
    wanted_paths = set(wanted)
    done = 0
    try:
        problem = group_problem(parquet.metadata, group, wanted_paths, file_size)
        if problem:
            yield marker(where, "unreadable_row_group", problem, unread=max(claim, 0))
            return
        rows = batch_size(parquet.metadata, group, wanted_paths, columns.limits.max_record_bytes)
        for batch in parquet.iter_batches(batch_size=rows, row_groups=[group], columns=wanted, use_threads=False):
            take = min(batch.num_rows, claim - done)  # never more than stated: the rest is counted below
            yield from batch_rows(path, batch.slice(0, take), first_row + done, image_ok, columns)
            done += take
        values = _flat_values(parquet, group, wanted_paths)
    except Exception as error:  # the rest of this row group: one record, counted from the footer
        yield marker(where, "unreadable_row_group",
                     f"row group {group} unreadable after {done:,} of its {claim:,} rows: {error!r}", unread=claim - done)
        return
    if done < claim:
        yield marker(where, "inconsistent_metadata", f"row group {group} states {claim:,} rows, its pages hold {done:,}",
                     unread=claim - done)
    if values is not None and values > claim:
        yield marker(where, "inconsistent_metadata",
                     f"row group {group} states {claim:,} rows, its column chunks {values:,} values: "
                     f"the rows past {claim:,} cannot be read", unread=0)


def row_bytes(row: Row) -> int:
    """The bytes a row's cells hold (text, binary, an image struct's bytes)."""
    total = 0
    for value in row.meta.values():
        if isinstance(value, dict):
            value = value.get("bytes")
        if isinstance(value, (bytes, str)):
            total += len(value)
    return total


def row_record(row: Row, columns: Columns):
    """One row's ``Candidate`` or ``Rejection``, ``read/too_large`` over the record cap."""
    size = row_bytes(row)
    if size > columns.limits.max_record_bytes:
        url = text_of(row.url) or ""
        return too_large(row.position, "row", size, columns.limits.max_record_bytes, "--read_max_record_bytes",
                         url=url, key=make_key(url or row.position, ""))
    return to_record(row, columns.carry, columns.download)


def parquet_records(path: str, parquet, columns: Columns = Columns(), file_size: Optional[int] = None) -> Iterator[object]:
    """Every row of an open ``pyarrow.parquet.ParquetFile``, row group by row group, and the markers."""
    for item in parquet_batches(path, parquet, columns, file_size):
        yield item if isinstance(item, Rejection) else decided(item.position, lambda: row_record(item, columns))


def unreadable_file(path: str, error: Exception) -> Rejection:
    return Rejection(make_key(path, ""), stages.reason("read", "unreadable_file"), url=path, alt_text=repr(error)[:200])


#: Column chunks are read through a buffer of this size, page by page, not whole.
READ_BUFFER_BYTES = 1 << 20


def open_parquet(handle):
    import pyarrow.parquet as pq

    return pq.ParquetFile(handle, buffer_size=READ_BUFFER_BYTES)


def size_of(handle) -> Optional[int]:
    try:
        return handle.seek(0, 2)
    except Exception:
        return None


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    """One file's records; a file without a readable footer is one named rejection."""
    try:
        handle = FileSystems.open(path)
    except Exception as error:
        yield unreadable_file(path, error)
        return
    with handle:
        try:
            file_size = size_of(handle)
            parquet = open_parquet(handle)
        except Exception as error:
            yield unreadable_file(path, error)
            return
        yield from parquet_records(path, parquet, columns, file_size)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """The row count the file footer states (the markers of ``read_file`` reconcile it), or 1 unreadable."""
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
