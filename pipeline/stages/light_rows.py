"""The rows that cross stages of the build, as named types with compact, deterministic coders.

``Candidate`` (``common.schema``) is the full record, image bytes included;
it never leaves the first pass. What crosses a shuffle is one of these:

- ``LightRow``: one input record as the first pass judged it: its key, url,
  normalised alt-text, hashes, its per-record verdict and where to read it
  again (``source``, ``reader``, ``ordinal``: the record's position in what
  the reader yields for that file). Rejections keep this type with their
  final reason in ``reason``.
- ``HashRow``: one image's hashes, for in-corpus duplicate removal.

What the corpus-wide counts see of a row (``filters.frequency``) is the
plain tuple ``(key, sha256, phash, text)`` (``filters.frequency.pool_row``). Key verdicts stay
Beam key/value pairs ``(key, reason)``; embeddings stay ``(key, vector)``.

Both named rows use Beam's ``RowCoder`` (registered below): deterministic,
compact and schema-checked. Beam's default coder encodes plain tuples of
strings and numbers itself but pickles a NamedTuple, on every stage boundary:
a PCollection of named rows, or a key/value pair holding one, is declared
(``with_output_types``) so that the runner uses the row coder.

No ``from __future__ import annotations`` here: Beam reads the field types
of the NamedTuples to build their schemas.
"""

import json
import math
from typing import NamedTuple, Tuple

import apache_beam as beam


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
    eval_match: str = ""  # ``near_duplicate_eval/<set>`` when it is a near-duplicate of an evaluation image
    detail: str = ""      # JSON object added to its ledger line ("" for none)
    carried: str = ""     # JSON [[column, text], ...] of a downloaded record or a copied one (--reuse; "": read
    #                       again from ``source``)
    stored_width: int = 0   # the picture's size when the shard stores its bytes as read (0: re-encoded)
    stored_height: int = 0
    lowest_ngram_count: int = 0  # a measure row's (``ngram_count_row``): the key's lowest n-gram count; 0 otherwise
    model_score: float = -math.inf  # image-text cosine under the --model_score model (-inf: not scored; not NaN,
    #                                 so that equal rows compare equal)
    nsfw_score: float = -math.inf   # the NSFW scorer's score of the image (-inf: not scored, as model_score)
    stored_at: str = ""             # "<shard>@<offset>": its stored picture, already written by the corpus a
    #                                 selection reads (``pipeline.write.stored_copies``); "": made from the source


# Functions, not methods: a worker process decodes rows into a type Beam
# generates from the schema, with the same fields and none of the methods.


def rejected(row: LightRow, reason: str) -> LightRow:
    """The row with its final reason."""
    return row._replace(reason=reason)


def detail_items(row: LightRow) -> dict:
    return json.loads(row.detail) if row.detail else {}


def verdict_row(key: str, reason: str) -> LightRow:
    """A key stage's ``(key, reason)`` verdict as a light row, so that rows and verdicts share one coder where they meet."""
    return LightRow(key, "", "", reason, False, "", "", 0, 0, "", "", "", -1)


def ngram_count_row(key: str, count: int) -> LightRow:
    """The lowest count among a key's n-grams, as a row that meets the key's rows with the verdicts (the audit's what-if)."""
    return LightRow(key, "", "", "", False, "", "", 0, 0, "", "", "", -1, lowest_ngram_count=count)


class HashRow(NamedTuple):
    """One key's image hashes (``phash``: 16 hex digits, "" if not computed)."""

    key: str
    sha256: str
    phash: str


def row_key(row) -> str:
    """The key of a named row (a picklable ``lambda row: row.key``)."""
    return row.key


def keyed(row: LightRow):
    """``(row.key, row)``: a light row as a Beam key/value pair."""
    return row.key, row


#: The type of ``(key, LightRow)`` pairs, for ``with_output_types``.
KEYED_ROW = Tuple[str, LightRow]


def holding_rows(pcoll):
    """Declares that ``pcoll`` holds light rows, so that the runner encodes them with the row coder.

    For a DoFn's tagged outputs, which ``with_output_types`` does not reach.
    """
    pcoll.element_type = LightRow
    return pcoll

beam.coders.registry.register_coder(LightRow, beam.coders.RowCoder)
beam.coders.registry.register_coder(HashRow, beam.coders.RowCoder)
