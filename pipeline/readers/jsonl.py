"""URL lists as JSON Lines: one object per line, ``{"url": ..., "caption": ...}``.

Each line is one record: a line that is not a JSON object (bad JSON, invalid
UTF-8, an array, a bare string) is ``read/malformed_line``; an object
without the url or caption field is ``read/missing_column``; a well-formed
one has no image bytes and is ``read/not_downloaded`` (run a downloader such
as img2dataset first). Other fields can be carried to the output
(``--carry_columns``). Blank lines are malformed lines too: they are counted,
not skipped, so the count always equals the file's lines.
"""

from __future__ import annotations

import json
from typing import Iterator, Optional

from apache_beam.io.filesystems import FileSystems

from pipeline.readers.rows import Columns, malformed_line, shown, url_list_record


def read_lines(path: str, lines, columns: Columns = Columns()) -> Iterator[object]:
    for number, raw in enumerate(lines, start=1):
        position = f"{path}#{number}"
        try:
            found = json.loads(raw)
        except ValueError as error:  # includes invalid UTF-8 (UnicodeDecodeError)
            found = error
        if not isinstance(found, dict):
            note = f"not a JSON object ({type(found).__name__}): {shown(raw[:200]).strip()}"
            yield malformed_line(position, note)
            continue
        yield url_list_record(position, found, found, columns)


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    with FileSystems.open(path) as handle:
        yield from read_lines(path, handle, columns)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """A line is a record by construction (one yield per line); the file states no count."""
    return None
