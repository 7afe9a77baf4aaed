"""URL lists as JSON Lines: one object per line, ``{"url": ..., "caption": ...}``.

Each line is one record: a line that is not a JSON object (bad JSON, invalid
UTF-8, an array, a bare string, nesting deeper than ``MAX_JSON_DEPTH``) is
``read/malformed_line``; a line longer than ``--read_max_line_bytes`` is
``read/too_large`` (never held whole); an object without the url or caption
field is ``read/missing_column``; a well-formed one has no image bytes and
is ``read/not_downloaded`` (run a downloader such as img2dataset first, or
build with ``--download``). Other fields can be carried to the output
(``--carry_columns``). Blank lines are malformed lines too: they are counted,
not skipped, so the count always equals the file's lines. ``.jsonl.gz`` and
``.jsonl.bz2`` are read as streams; one that is cut short or corrupt ends
with one ``read/truncated_file`` record (how many lines it lost, it cannot
say).
"""

from __future__ import annotations

from typing import Iterator, Optional

from pipeline.readers.limits import TooDeep, TooLong, load_json
from pipeline.readers.losses import too_large
from pipeline.readers.rows import Columns, decided, malformed_line, shown, url_list_record
from pipeline.readers.streams import read_line_list


def line_record(position: str, raw, columns: Columns):
    if isinstance(raw, TooLong):
        return too_large(position, "line", raw.length, columns.limits.max_line_bytes, "--read_max_line_bytes")
    try:
        found = load_json(raw)
    except ValueError as error:  # includes invalid UTF-8 (UnicodeDecodeError) and too deep
        found = error
    if not isinstance(found, dict):
        note = f"not a JSON object ({type(found).__name__}): {shown(raw[:200]).strip()}"
        if isinstance(found, TooDeep):
            note = f"{found}: {shown(raw[:60]).strip()}"
        return malformed_line(position, note)
    return url_list_record(position, found, found, columns)


def read_lines(path: str, raw_lines, columns: Columns = Columns()) -> Iterator[object]:
    """Records from an iterable of raw lines (bytes, or ``TooLong``)."""
    for number, raw in enumerate(raw_lines, start=1):
        position = f"{path}#{number}"
        yield decided(position, lambda: line_record(position, raw, columns))


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    return read_line_list(path, columns, read_lines)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """A line is a record by construction (one yield per line); the file states no count."""
    return None
