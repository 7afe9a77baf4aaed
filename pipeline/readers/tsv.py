"""URL lists as TSV: CC3M/CC12M's ``url<TAB>caption`` files, img2dataset's ``--input_format tsv``.

A first line that names the url column (``url`` or ``--url_col``) is a
header; otherwise the columns are ``--tsv_columns`` (default ``url,caption``,
CC12M's order; CC3M's is ``caption,url``). Each following line is one record:

- a line with another number of fields than the header -> ``read/malformed_line``;
- fields are decoded one by one, so invalid UTF-8 in a caption is
  ``read/caption_not_utf8`` and in a url ``read/url_not_text``;
- a well-formed line has no image bytes: ``read/not_downloaded`` until the
  images are downloaded (run img2dataset on the file and build from its output).

Lines are split on tabs without quoting (as the CC3M/CC12M files are).
Compressed files (``.tsv.gz``) are read through ``FileSystems``.
"""

from __future__ import annotations

from typing import Iterator, List, Optional

from apache_beam.io.filesystems import FileSystems

from pipeline.readers.rows import Columns, first_present, malformed_line, shown, url_list_record


def _fields(line: bytes) -> List[bytes]:
    return line.rstrip(b"\r\n").split(b"\t")


def _is_header(fields: List[bytes], columns: Columns) -> bool:
    names = [f.decode("utf-8", "replace").strip() for f in fields]
    return first_present(columns.url, names) is not None


def read_lines(path: str, lines, columns: Columns = Columns()) -> Iterator[object]:
    """Records from an iterable of raw lines (bytes with their newline)."""
    header: Optional[List[str]] = None
    number = 0
    for raw in lines:
        number += 1
        fields = _fields(raw)
        if number == 1 and _is_header(fields, columns):
            header = [f.decode("utf-8", "replace").strip() for f in fields]
            continue
        if header is None:
            header = list(columns.tsv_columns)
        position = f"{path}#{number}"
        if len(fields) != len(header):
            note = f"{len(fields)} fields, expected {len(header)}: {shown(raw[:200])}"
            yield malformed_line(position, note)
            continue
        yield url_list_record(position, dict(zip(header, fields)), header, columns)

def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    with FileSystems.open(path) as handle:
        yield from read_lines(path, handle, columns)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """A line is a record by construction (one yield per line); the file states no count."""
    return None
