"""The rows that cross stages of the build, as named types.

``Candidate`` (``common.schema``) is the full record and ``Rejection``
(``pipeline.readers.rows``) a record that will not be written with its first
reason. The rest are what a stage hands on, so that no stage reads another's
row as ``row[0]..row[3]``:

- ``LightRow``: what the corpus stages see of a record (no image bytes).
- ``HashRow``: one image's hashes, for in-corpus duplicate removal.

Key verdicts stay Beam key/value pairs ``(key, reason)`` (they are grouped
by key); embeddings stay ``(key, vector)`` for the same reason.

``LightRow`` and ``HashRow`` are all strings and use Beam's ``RowCoder``
(registered below): deterministic, compact and schema-checked, where the
default coder would pickle a NamedTuple. ``Rejection`` keeps the default
coder: a read rejection carries whatever image value the input row held,
which a schema coder would refuse.

No ``from __future__ import annotations`` here: Beam reads the field types
of the NamedTuples to build their schemas.
"""

from typing import NamedTuple

import apache_beam as beam

from common.schema import Candidate
from pipeline.readers.rows import Rejection


def rejection(record: Candidate, reason: str) -> Rejection:
    """A record rejected by a stage after reading, with what it had learnt of it."""
    return Rejection(
        record.key, reason, record.url, record.alt_text, record.width, record.height, record.format, record.image
    )


class LightRow(NamedTuple):
    """A record as the corpus stages see it: key, image hashes, normalised alt-text."""

    key: str
    sha256: str
    phash: str
    text: str


def light_row(record: Candidate) -> LightRow:
    return LightRow(record.key, record.sha256, record.phash, record.text)


class HashRow(NamedTuple):
    """One key's image hashes (``phash``: 16 hex digits, "" if not computed)."""

    key: str
    sha256: str
    phash: str


def row_key(row) -> str:
    """The key of a named row (a picklable ``lambda row: row.key``)."""
    return row.key


beam.coders.registry.register_coder(LightRow, beam.coders.RowCoder)
beam.coders.registry.register_coder(HashRow, beam.coders.RowCoder)
