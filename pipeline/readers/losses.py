"""What a reader could not read: one marker record each, carrying how many records it stands for.

A file that loses its framing (a truncated TFRecord or tar, a corrupt gzip
stream), a row group that cannot be decoded, or a count the file states
that its bytes do not hold, is one rejection whose ledger line says how
many records it stands for: ``unread_records`` (the file states them, they
were not read; ``"unknown"`` where the format states no count) and
``unstated_records`` (read, but beyond what the file states). A file's
count is then reconciled as::

    stated + unstated == records read (markers excluded) + unread

never by making up one record per claimed row: a footer that claims 2^40
rows costs one record, not 2^40. The funnel counts that record as the rows
it stands for (``pipeline.funnel.accounting.stands_for``), so its input is
what the files state.
"""

from __future__ import annotations

from typing import Optional, Union

from common.schema import make_key
from filters import stages
from pipeline.funnel.accounting import UNKNOWN, UNREAD, UNSTATED, stands_for
from pipeline.readers.rows import Rejection


def marker(where: str, detail: str, note: str, unread: Optional[int] = None, unstated: int = 0) -> Rejection:
    """One record for what could not be read at ``where`` (``None``: how many is unknown)."""
    counts = ((UNREAD, UNKNOWN if unread is None else int(unread)),)
    if unstated:
        counts += ((UNSTATED, int(unstated)),)
    return Rejection(make_key(where, ""), stages.reason("read", detail), url=where, alt_text=note[:300], detail=counts)


def is_marker(record) -> bool:
    return isinstance(record, Rejection) and any(name == UNREAD for name, _ in record.detail)


def unread_of(record) -> Union[int, str]:
    """A marker's ``unread_records``: a count, or ``"unknown"``."""
    return dict(record.detail)[UNREAD]


def unstated_of(record) -> int:
    return int(dict(record.detail).get(UNSTATED, 0))


def records_of(record) -> int:
    """The input records a reader's record counts as: a marker its unread rows, any other record one."""
    return stands_for(dict(record.detail)) if isinstance(record, Rejection) and record.detail else 1


def too_large(position: str, what: str, size: Union[int, str], cap: int, flag: str, url: str = "", key: str = "") -> Rejection:
    """One record (or member, line) over its cap: rejected whole, never held."""
    note = f"{what} of {size:,} bytes, over {flag} {cap:,}" if isinstance(size, int) else f"{what} over {flag} {cap:,}"
    return Rejection(key or make_key(position, ""), stages.reason("read", "too_large"), url=url or position, alt_text=note)


def malformed(position: str, note: str, detail: str = "malformed_record") -> Rejection:
    """A record whose bytes are not what its format says (a bad Example, a bad sample member)."""
    return Rejection(make_key(position, ""), stages.reason("read", detail), url=position, alt_text=note[:300])
