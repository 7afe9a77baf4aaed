"""One input row -> one ``Candidate`` or one ``Rejection``: the rule every reader shares.

A reader (Parquet, WebDataset, TSV, JSONL, TFRecord) turns its own unit (a
Parquet row, a tar sample, a line, an Example) into a ``Row``; ``to_record``
decides, in this order:

1. url or caption column missing from the input -> ``read/missing_column``;
2. url not text -> ``read/url_not_text``; caption not text / not UTF-8 /
   null -> ``read/caption_*``, ``read/missing_caption``;
3. the downloader says it failed (img2dataset ``status`` other than
   ``success``) -> ``read/download_failed/<what>``: ``http_404``, ``timeout``,
   ``failed_to_resize``, ... from its ``error_message``, so each kind of failure
   is its own funnel line;
4. no image column at all (a URL list) -> ``read/not_downloaded``, unless
   the build downloads (``--download``, ``Columns.download``): then a
   ``Candidate`` without image bytes, for the download stage
   (``pipeline.download``);
5. an image column of the wrong type -> ``read/bad_image_column``; an empty
   image cell -> ``read/no_image``;
6. a stated source size (``original_width``/``original_height``) that is no
   size at all (infinite, or 2^31 or more) -> ``read/bad_source_size``; one
   that is absent, null, NaN, not a number or not positive is unknown.

What the row says about the source (img2dataset's ``original_width`` /
``original_height``) becomes ``Candidate.source_width/height``; the columns
to carry (``key``, ``sha256`` and the user's ``--carry_columns``) become
``Candidate.carried``.
"""

from __future__ import annotations

import json
import math
import re
from typing import NamedTuple, Optional, Sequence, Tuple

from common.schema import DEFAULT_CARRIED, Candidate, make_key
from filters import stages
from filters.text import decode_caption
from pipeline.readers.limits import ReadLimits

URL_COLUMNS = ("url",)
CAPTION_COLUMNS = ("caption", "alt_text", "text", "texts")
IMAGE_COLUMNS = ("jpg", "image", "png", "webp", "jpeg")
#: Kept in ``Candidate.source`` for the audit.
META_COLUMNS = ("key", "width", "height", "status", "error_message")
SOURCE_SIZE_COLUMNS = ("original_width", "original_height")


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
    #: ``(("name", value), ...)`` added to the record's ledger line (the download's HTTP status and final URL).
    detail: tuple = ()


class Columns(NamedTuple):
    """Which input columns (or JSON fields, Example features) hold what; first present wins."""

    url: Tuple[str, ...] = URL_COLUMNS
    caption: Tuple[str, ...] = CAPTION_COLUMNS
    image: Tuple[str, ...] = IMAGE_COLUMNS
    carry: Tuple[str, ...] = DEFAULT_CARRIED
    #: Headerless TSV: the column names in order (CC12M: url, caption; CC3M: caption, url).
    tsv_columns: Tuple[str, ...] = ("url", "caption")
    #: The build downloads (``--download``): a URL-only row becomes a Candidate without image bytes.
    download: bool = False
    #: What a reader holds of one record (``--read_max_*``).
    limits: ReadLimits = ReadLimits()

    def wanted(self) -> Tuple[str, ...]:
        """Every column a reader should fetch."""
        names = self.url + self.caption + self.image + META_COLUMNS + SOURCE_SIZE_COLUMNS + self.carry
        return tuple(dict.fromkeys(names))


def make_columns(url_col: str = "", caption_col: str = "", image_col: str = "", carry: Sequence[str] = (), tsv_columns: str = "") -> Columns:
    """``Columns`` from command-line values (empty = the defaults)."""
    base = Columns()
    for column in carry:
        if column and not re.fullmatch(r"[A-Za-z0-9_]+", column):
            raise ValueError(f"--carry_columns: {column!r} cannot be a feature name (letters, digits, _ only)")
    return base._replace(
        url=(url_col,) if url_col else base.url,
        caption=(caption_col,) if caption_col else base.caption,
        image=(image_col,) if image_col else base.image,
        carry=tuple(dict.fromkeys(tuple(DEFAULT_CARRIED) + tuple(c for c in carry if c))),
        tsv_columns=tuple(c.strip() for c in tsv_columns.split(",")) if tsv_columns else base.tsv_columns,
    )


def first_present(names, columns) -> Optional[str]:
    for name in names:
        if name in columns:
            return name
    return None


class _BadCell:
    """A cell the reader could not turn into a Python value."""

    def __repr__(self):
        return "BAD_CELL"


BAD_CELL = _BadCell()


def text_of(value) -> Optional[str]:
    """A text cell (str or UTF-8 bytes) as str; None if it is anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def shown(value) -> str:
    """A cell as text for the audit, whatever it holds."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or value is BAD_CELL:
        return ""
    return str(value)


def carried_text(value) -> Optional[str]:
    """A carried cell as the text written to the shard; None for a null cell."""
    if value is None or value is BAD_CELL:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def image_bytes(value) -> Optional[bytes]:
    """Image cell -> bytes or None (no image). Hugging Face structs carry ``bytes``."""
    if isinstance(value, dict):
        value = value.get("bytes")
    return bytes(value) if value else None


#: Larger than any image side; a stated size beyond it is no size (and would overflow int32/int64 later).
MAX_SOURCE_SIDE = (1 << 31) - 1


def source_side(value) -> Optional[int]:
    """A stated source width or height: the number, 0 when unknown, None when it cannot be a size."""
    if value is None or value is BAD_CELL or isinstance(value, bool):
        return 0
    if isinstance(value, (bytes, str)):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        try:
            value = int(text.strip())
        except ValueError:
            try:
                value = float(text.strip())
            except ValueError:
                return 0
    if isinstance(value, float):
        if math.isnan(value):
            return 0
        if math.isinf(value):
            return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    if number > MAX_SOURCE_SIDE:
        return None
    return number if number > 0 else 0


_HTTP = re.compile(r"HTTP Error (\d{3})")


def download_failure(status: str, error_message: Optional[str]) -> str:
    """img2dataset's status and error message -> a short stable word for the funnel.

    Messages are ``str(exception)`` of urllib and img2dataset's resizer, e.g.
    ``HTTP Error 404: Not Found``, ``<urlopen error timed out>``,
    ``The read operation timed out``, ``Image decoding error``.
    """
    message = (error_message or "").strip()
    lowered = message.lower()
    found = _HTTP.search(message)
    if found:
        return f"http_{found.group(1)}"
    if "timed out" in lowered or "timeout" in lowered:
        return "timeout"
    if status == "failed_to_resize" or "decoding error" in lowered:
        return "failed_to_resize"
    if "refused" in lowered or "urlopen error" in lowered or "name or service" in lowered:
        return "connection_error"
    if "x-robots-tag" in lowered:
        return "disallowed_by_x_robots_tag"
    words = re.findall(r"[a-z0-9]+", lowered)[:5]
    return "_".join(words)[:40] or re.sub(r"[^a-z0-9_]+", "_", (status or "unknown").lower())


def download_reason(status: str, error_message: Optional[str]) -> str:
    return stages.reason("read", "download_failed/" + download_failure(status, error_message))


def is_download_failure(reason: str) -> bool:
    return reason.startswith("read/download_failed/")


class Row(NamedTuple):
    """One input unit as a reader found it; values are raw cells (str, bytes, numbers, ``BAD_CELL``).

    ``url``/``caption`` are None when the cell is null; ``missing`` names
    required columns the input does not have at all; ``has_image_column`` is
    False for URL lists; ``image_ok`` False when the image column's type
    cannot hold images. ``meta`` holds every other column that was read.
    """

    position: str
    url: object
    caption: object
    image: object = None
    meta: dict = {}
    missing: Tuple[str, ...] = ()
    has_image_column: bool = True
    image_ok: bool = True


def to_record(row: Row, carry: Sequence[str] = DEFAULT_CARRIED, download: bool = False):
    """The ``Candidate`` or ``Rejection`` for one row (pure); ``download``: see step 4 above."""
    url = "" if row.url is None else text_of(row.url)
    if row.missing:
        seen = shown(row.url)
        return Rejection(make_key(seen or row.position, ""), stages.reason("read", "missing_column"), url=seen)
    if url is None:  # binary that is not UTF-8, a number, a list, ...: not a URL
        seen = shown(row.url)
        return Rejection(make_key(row.position, seen), stages.reason("read", "url_not_text"), url=seen)
    if row.caption is BAD_CELL:
        caption, caption_reason = "", stages.reason("read", "caption_not_text")
    else:
        caption, caption_reason = decode_caption(row.caption)
    key = make_key(url, caption)
    meta = row.meta
    status = shown(meta.get("status")) if meta.get("status") not in (None, BAD_CELL) else None
    image_usable = row.has_image_column and row.image_ok and row.image is not BAD_CELL
    if caption_reason:
        return Rejection(key, caption_reason, url=url, alt_text=caption, image=image_bytes(row.image) if image_usable else None)
    if status not in (None, "success"):
        return Rejection(key, download_reason(status, text_of(meta.get("error_message"))), url=url, alt_text=caption)
    if not row.has_image_column and not download:
        return Rejection(key, stages.reason("read", "not_downloaded"), url=url, alt_text=caption)
    image = None  # a URL-only row when downloading: the download stage fetches it
    if row.has_image_column:
        if not image_usable:
            return Rejection(key, stages.reason("read", "bad_image_column"), url=url, alt_text=caption)
        image = image_bytes(row.image)
        if image is None:
            return Rejection(key, stages.reason("read", "no_image"), url=url, alt_text=caption)
    sides = [source_side(meta.get(name)) for name in SOURCE_SIZE_COLUMNS]
    if None in sides:
        stated = ", ".join(f"{name}={shown(meta.get(name))[:40]}" for name in SOURCE_SIZE_COLUMNS)
        return Rejection(key, stages.reason("read", "bad_source_size"), url=url, alt_text=caption,
                         detail=(("stated_size", stated),))
    source = tuple(
        (name, shown(meta[name]) if isinstance(meta[name], bytes) else meta[name])
        for name in META_COLUMNS
        if meta.get(name) is not None and meta.get(name) is not BAD_CELL
    )
    carried = tuple(
        (name, text) for name in carry if (text := carried_text(meta.get(name))) is not None
    )
    return Candidate(
        key=key, url=url, alt_text=caption, image=image, source=source,
        source_width=sides[0],
        source_height=sides[1],
        carried=carried,
    )


def malformed_line(position: str, note: str) -> Rejection:
    """A line of a URL list that is not a row at all (wrong field count, not JSON)."""
    return Rejection(make_key(position, ""), stages.reason("read", "malformed_line"), url=position, alt_text=note)


def url_list_record(position: str, cells: dict, names, columns: "Columns"):
    """The record of one well-formed URL-list row (TSV line, JSON object): no image column.

    ``names`` are the columns the row has; url and caption are looked up by
    ``columns``' names, and every cell is kept as metadata to carry.
    """
    url_col = first_present(columns.url, names)
    caption_col = first_present(columns.caption, names)
    missing = tuple(n for n, c in (("url", url_col), ("caption", caption_col)) if c is None)
    return to_record(
        Row(position, cells.get(url_col) if url_col else None, cells.get(caption_col) if caption_col else None,
            meta=cells, missing=missing, has_image_column=False),
        columns.carry, columns.download,
    )


def decided(position: str, decide) -> object:
    """``decide()``'s record, or one ``read/malformed_record`` if deciding it raises.

    Whatever one record's bytes provoke stays with that record: the next one
    is still read. ``MemoryError`` is not the record's doing, and a
    ``NameError``/``ImportError`` is the reader's own bug: those are raised.
    """
    try:
        return decide()
    except (MemoryError, NameError, ImportError):
        raise
    except Exception as error:
        return Rejection(make_key(position, ""), stages.reason("read", "malformed_record"), url=position,
                         alt_text=f"{type(error).__name__}: {error}"[:300])
