"""The rows that cross stages of the build, as named types with compact, deterministic coders.

``Candidate`` (``common.schema``) is the full record, image bytes included;
it never leaves the first pass. What crosses a shuffle is one of these:

- ``LightRow``: one input record as the first pass judged it: its key, url,
  normalised alt-text, hashes, its per-record verdict and where to read it
  again (``source``, ``reader``, ``ordinal``: the record's position in what
  the reader yields for that file). Rejections keep this type with their
  final reason in ``reason``.
- ``PoolRow``: what the corpus-wide counts see of a row (``filters.frequency``).
- ``HashRow``: one image's hashes, for in-corpus duplicate removal.

Key verdicts stay Beam key/value pairs ``(key, reason)`` (they are grouped
by key); embeddings stay ``(key, vector)`` for the same reason.

All three use Beam's ``RowCoder`` (registered below): deterministic, compact
and schema-checked, where the default coder would pickle a NamedTuple.

No ``from __future__ import annotations`` here: Beam reads the field types
of the NamedTuples to build their schemas.
"""

import json
from typing import NamedTuple

import apache_beam as beam

SURVIVORS, REJECTED = "survivors", "rejected"


class LightRow(NamedTuple):
    """One input record after the first pass: everything the corpus stages, the ledger and the writer need."""

    key: str
    url: str
    text: str        # normalised alt-text (for a read rejection: what the reader could say of the row)
    reason: str      # first reason it is rejected for, "" while it is kept
    counted: bool    # in the corpus-wide counting pool (``filters.frequency``)
    sha256: str
    phash: str
    width: int       # of the source image, after EXIF orientation (0: unknown)
    height: int
    format: str
    source: str      # the file to read it again from ("": it cannot be read again)
    reader: str      # that file's reader (``pipeline.readers.FORMATS``, or "staging")
    ordinal: int     # its position in what the reader yields for that file
    eval_match: str  # ``near_duplicate_eval/<set>`` when it is a near-duplicate of an evaluation image
    detail: str      # JSON object added to its ledger line ("" for none)
    carried: str     # JSON [[column, text], ...] of a downloaded record ("": read again from ``source``)

    def rejected(self, reason: str) -> "LightRow":
        return self._replace(reason=reason)

    def detail_items(self) -> dict:
        return json.loads(self.detail) if self.detail else {}


class PoolRow(NamedTuple):
    """A row of the corpus-wide counting pool: key, image hashes, normalised alt-text."""

    key: str
    sha256: str
    phash: str
    text: str


def pool_row(row: LightRow) -> PoolRow:
    return PoolRow(row.key, row.sha256, row.phash, row.text)


class HashRow(NamedTuple):
    """One key's image hashes (``phash``: 16 hex digits, "" if not computed)."""

    key: str
    sha256: str
    phash: str


def row_key(row) -> str:
    """The key of a named row (a picklable ``lambda row: row.key``)."""
    return row.key


def keyed(row):
    """``(row.key, row)``: a named row as a Beam key/value pair."""
    return row.key, row


beam.coders.registry.register_coder(LightRow, beam.coders.RowCoder)
beam.coders.registry.register_coder(PoolRow, beam.coders.RowCoder)
beam.coders.registry.register_coder(HashRow, beam.coders.RowCoder)
