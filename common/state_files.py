"""The project's own JSON and JSONL files, read back bounded and checked: a damaged one is one line.

A build, a publication, a download and a training run write state that a
later command reads back: ``stats/funnel.json`` and the other stats, the
version's ``manifest.json`` and ``_BUILD.json``, the launcher's counters,
the download staging indexes, a run's ``config.json``. Between the write
and the read the file may have been truncated, overwritten or edited, so
it is read the way input is read: never more than ``max_bytes`` of it,
JSON nested no deeper than ``MAX_JSON_DEPTH`` (Python's parser recurses),
and every value the reader relies on checked against the file's schema
(its types, finite numbers, ranges) before anything uses it. The schemas
live beside the code that writes each file; they are plain functions built
from the checks here (``whole``, ``number``, ``text``, ...), which raise
``Problem`` naming where in the document the value is wrong.

What a reader gets for a damaged file is ``DamagedFile``: one line naming
the file, what is wrong and what to do. A JSONL file is read line by line
(``read_jsonl``): a damaged line is skipped and counted, not fatal.
"""

from __future__ import annotations

import json
import math
import re
from typing import Callable, Iterator, List, NamedTuple, Optional, Union

#: JSON nested deeper is refused before it is parsed: Python's parser recurses, and how deep it
#: can go depends on the caller's stack, so a fixed bound keeps a document's fate the same everywhere.
MAX_JSON_DEPTH = 100
#: The most of a JSON state file read (the largest the project writes, a what-if's histograms or a
#: manifest of 100,000 shards, is a few MB).
MAX_STATE_BYTES = 64 << 20
#: The longest line of a JSONL state file (a rejected sample or a near-duplicate pair with its thumbnails).
MAX_LINE_BYTES = 4 << 20
#: Every count the project writes is below this (Beam's counters are 64-bit); a larger one is damage.
MAX_COUNT = 1 << 62


class DamagedFile(Exception):
    """A file is truncated, corrupt or not what its writer wrote; the message names it and what to do, in one line."""


class Problem(ValueError):
    """A value of a document that its schema does not allow; the message says where and what."""


class TooDeep(ValueError):
    """JSON nested past ``MAX_JSON_DEPTH``."""


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(raw: bytes) -> int:
    """How deeply ``raw``'s arrays and objects nest (brackets inside strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return raw.count(b"[") + raw.count(b"{")  # an upper bound, and within the limit
    import numpy as np

    codes = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = (np.isin(codes, (ord("["), ord("{")))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def loads(raw: Union[bytes, str]):
    """``json.loads``; ``ValueError`` for bad JSON, invalid UTF-8 or nesting past ``MAX_JSON_DEPTH`` (``TooDeep``)."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    depth = json_depth(raw)  # bounds the nesting, so the parser's recursion cannot run out
    if depth > MAX_JSON_DEPTH:
        raise TooDeep(f"JSON nested {depth:,} deep, more than {MAX_JSON_DEPTH}")
    return json.loads(raw)


# ---------------------------------------------------------------------------
# Checks: each returns the value it checked, or raises Problem naming ``where``
# ---------------------------------------------------------------------------


def shown(value) -> str:
    """A value as a message quotes it: short, its type for a container."""
    text_ = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text_ if len(text_) <= 40 else text_[:37] + "..."


def _fail(where: str, value, wanted: str):
    raise Problem(f"{where or 'the document'}: {shown(value)}, not {wanted}")


def obj(value, where: str = "") -> dict:
    if not isinstance(value, dict):
        _fail(where, value, "an object")
    return value


def array(value, where: str = "", max_len: Optional[int] = None) -> list:
    if not isinstance(value, list):
        _fail(where, value, "a list")
    if max_len is not None and len(value) > max_len:
        raise Problem(f"{where}: {len(value):,} entries, more than {max_len:,}")
    return value


def text(value, where: str = "") -> str:
    if not isinstance(value, str):
        _fail(where, value, "a string")
    return value


def flag(value, where: str = "") -> bool:
    if not isinstance(value, bool):
        _fail(where, value, "true or false")
    return value


def whole(value, where: str = "", low: int = 0, high: int = MAX_COUNT) -> int:
    """An integer in ``[low, high]`` (a float such as 3.0, a bool or a huge number is not)."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        _fail(where, value, f"a whole number >= {low:,}" if high == MAX_COUNT else f"a whole number in [{low:,}, {high:,}]")
    return value


def number(value, where: str = "", low: float = -math.inf, high: float = math.inf) -> float:
    """A finite number (integer or float) in ``[low, high]``."""
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or not low <= value <= high):
        bounds = "" if (low, high) == (-math.inf, math.inf) else f" in [{low:g}, {high:g}]"
        _fail(where, value, f"a finite number{bounds}")
    return value


def field(doc: dict, name: str, where: str = ""):
    """``doc[name]``; ``Problem`` if it is absent."""
    if name not in doc:
        raise Problem(f"{where + '.' if where else ''}{name}: missing")
    return doc[name]


def optional(doc: dict, name: str, check: Callable, where: str = ""):
    """``check(doc[name], path)`` when present (and not null); None otherwise."""
    value = doc.get(name)
    return None if value is None else check(value, f"{where + '.' if where else ''}{name}")


def mapping(value, where: str, check_value: Callable, max_len: Optional[int] = None) -> dict:
    """An object of string keys whose every value passes ``check_value(value, where.key)``."""
    obj(value, where)
    if max_len is not None and len(value) > max_len:
        raise Problem(f"{where}: {len(value):,} entries, more than {max_len:,}")
    for key, item in value.items():
        check_value(item, f"{where}.{key}" if where else key)
    return value


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def _files():
    # common.files loads Beam's file systems: the trainer imports this module (through common.corpus_dir)
    # and reads its own state without paying for Beam until a file is read.
    from common import files

    return files


def read_bounded(path: str, max_bytes: int) -> Optional[bytes]:
    """The file's bytes (None if it does not exist); ``DamagedFile`` past ``max_bytes``."""
    files = _files()
    if not files.exists(path):
        return None
    with files.open_raw(path) as handle:
        data = files.read_at_most(handle, max_bytes + 1)
    if len(data) > max_bytes:
        raise DamagedFile(f"{path}: larger than the {max_bytes:,} bytes such a file can be: not the file its "
                          "writer wrote")
    return data


def parse(data: Union[bytes, str], path: str, check: Optional[Callable] = None, remedy: str = ""):
    """``data`` parsed (``loads``) and checked (``check(doc)``), or ``DamagedFile`` naming ``path``."""
    tail = f"; {remedy}" if remedy else ""
    try:
        doc = loads(data)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, TooDeep
        what = error if isinstance(error, TooDeep) else f"not valid JSON ({error})"
        raise DamagedFile(f"{path}: {what}: the file is truncated or corrupt{tail}") from None
    if check is not None:
        try:
            check(doc)
        except (Problem, KeyError, IndexError, TypeError, ValueError, OverflowError) as error:
            raise DamagedFile(f"{path}: {_reason(error)}: not what its writer wrote{tail}") from None
    return doc


def _reason(error: Exception) -> str:
    text_ = " ".join(str(error).split())
    if isinstance(error, KeyError):
        return f"{text_}: missing"
    return text_[:300] or type(error).__name__


def read_json(path: str, check: Optional[Callable] = None, remedy: str = "", max_bytes: int = MAX_STATE_BYTES):
    """The checked document of a JSON state file, None if the file does not exist; ``DamagedFile`` if damaged."""
    data = read_bounded(path, max_bytes)
    return None if data is None else parse(data, path, check, remedy)


class Lines(NamedTuple):
    """A JSONL file as read: the rows that passed, how many lines did not, and the first line's problem."""

    rows: List[dict]
    skipped: int
    first_problem: str


def jsonl_rows(handle, check_row: Optional[Callable] = None,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Union[dict, Problem]]:
    """Each non-blank line of a stream as its checked row (an object), or the ``Problem`` that skips it."""
    files = _files()
    for number_, raw in enumerate(files.lines(handle, max_line_bytes), start=1):
        if isinstance(raw, files.TooLong):
            yield Problem(f"line {number_}: {raw.length:,} bytes, longer than {max_line_bytes:,}")
            continue
        if not raw.strip():
            continue
        try:
            row = obj(loads(raw), f"line {number_}")
            if check_row is not None:
                check_row(row, f"line {number_}")
        except Problem as problem:
            yield problem
            continue
        except (ValueError, TypeError, KeyError) as error:
            yield Problem(f"line {number_}: {_reason(error)}")
            continue
        yield row


def read_jsonl(path: str, check_row: Optional[Callable] = None, max_line_bytes: int = MAX_LINE_BYTES,
               keep: Optional[Callable[[List[dict], dict], None]] = None) -> Optional[Lines]:
    """A JSONL state file's rows (None if it does not exist); a damaged line is counted, not fatal.

    ``keep(rows, row)`` decides what is held of each good row (default: every
    row is appended), so a reader can bound what it keeps of a long file.
    """
    files = _files()
    if not files.exists(path):
        return None
    rows: List[dict] = []
    skipped, first = 0, ""
    with files.open_raw(path) as handle:
        for row in jsonl_rows(handle, check_row, max_line_bytes):
            if isinstance(row, Problem):
                skipped += 1
                first = first or str(row)
            elif keep is None:
                rows.append(row)
            else:
                keep(rows, row)
    return Lines(rows, skipped, first)
