"""URL lists as TSV: CC3M/CC12M's ``url<TAB>caption`` files, img2dataset's ``--input_format tsv``.

A first line that names the url column (``url`` or ``--url_col``) is a
header; otherwise the columns are ``--tsv_columns`` (default ``url,caption``,
CC12M's order; CC3M's is ``caption,url``). Each following line is one record:

- a line with another number of fields than the header -> ``read/malformed_line``;
- a line longer than ``--read_max_line_bytes`` -> ``read/too_large`` (never held whole);
- fields are decoded one by one, so invalid UTF-8 in a caption is
  ``read/caption_not_utf8`` and in a url ``read/url_not_text``;
- a well-formed line has no image bytes: ``read/not_downloaded`` until the
  images are downloaded (run img2dataset on the file and build from its
  output, or build with ``--download``).

Lines are split on tabs without quoting (as the CC3M/CC12M files are).
``.tsv.gz`` and ``.tsv.bz2`` are read as streams (``pipeline.readers.streams``);
one that is cut short or corrupt ends with one ``read/truncated_file``
record (how many lines it lost, it cannot say).
"""

from __future__ import annotations

from typing import Iterator, List, Optional

from pipeline.readers.limits import TooLong
from pipeline.readers.losses import too_large
from pipeline.readers.rows import Columns, decided, first_present, malformed_line, shown, url_list_record
from pipeline.readers.streams import read_line_list


def _fields(line: bytes) -> List[bytes]:
    return line.rstrip(b"\r\n").split(b"\t")


def _is_header(fields: List[bytes], columns: Columns) -> bool:
    names = [f.decode("utf-8", "replace").strip() for f in fields]
    return first_present(columns.url, names) is not None


def line_record(position: str, raw, header: List[str], columns: Columns):
    if isinstance(raw, TooLong):
        return too_large(position, "line", raw.length, columns.limits.max_line_bytes, "--read_max_line_bytes")
    fields = _fields(raw)
    if len(fields) != len(header):
        return malformed_line(position, f"{len(fields)} fields, expected {len(header)}: {shown(raw[:200])}")
    return url_list_record(position, dict(zip(header, fields)), header, columns)


def read_lines(path: str, raw_lines, columns: Columns = Columns()) -> Iterator[object]:
    """Records from an iterable of raw lines (bytes with their newline, or ``TooLong``)."""
    header: Optional[List[str]] = None
    for number, raw in enumerate(raw_lines, start=1):
        if number == 1 and not isinstance(raw, TooLong) and _is_header(_fields(raw), columns):
            header = [f.decode("utf-8", "replace").strip() for f in _fields(raw)]
            continue
        if header is None:
            header = list(columns.tsv_columns)
        position = f"{path}#{number}"
        yield decided(position, lambda: line_record(position, raw, header, columns))


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    return read_line_list(path, columns, read_lines)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """A line is a record by construction (one yield per line); the file states no count."""
    return None
