"""A previous build's facts, read back from its candidate table for a rebuild that reuses them (``--reuse OLD``).

A committed corpus's candidate table (``pipeline.write.candidate_table``)
holds, for every input record it read, what the first pass measured at a
cost: the image's sha256 and the reduced decode's pHash, its NSFW score,
whether it matched the evaluation index, and where its stored picture was
written. A rebuild over the same input files reads the table file of each
input file it judges (one small Parquet file per input file) and takes a
record's facts from its row instead of deriving them again, when, and only
when, the record is the one the old build read there: same file, same
position, same key and the same image bytes (the sha256 of the bytes read
now is the row's). A fact the old build never measured (a record a rule
rejected before the decode) or a record whose bytes changed is judged as in
any build. What a fact may be reused for is decided once, in the launcher
(``pipeline.build.reuse``), and travels as ``PreviousBuild``.
"""

from __future__ import annotations

import math
from typing import Dict, NamedTuple, Optional, Tuple

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

#: What a build's facts mean: bumped when the decode, the pHash, the stored picture or the table's meaning
#: changes, so that a build never reuses what an older version of the code found. A build records it in its
#: ``_BUILD.json`` (``facts``); ``pipeline.build.reuse`` refuses an old corpus that recorded another.
FACTS_VERSION = 1

#: Outcomes per record, for the funnel's note: its facts came from the old table, were derived again (the
#: bytes changed, or the old build never measured what this one needs), or the old build never read it.
REUSED, RECOMPUTED, NEW = "reused", "recomputed", "new"

_COLUMNS = ("key", "sha256", "phash", "nsfw_score", "reason", "eval_match", "shard", "offset", "ordinal", "source")


class PreviousBuild(NamedTuple):
    """What a rebuild may take from a previous committed version (resolved by ``pipeline.build.reuse``)."""

    version_dir: str                   # the old committed version
    tables: Tuple[Tuple[str, str], ...]  # (source file, its table file) of every input file the old build read
    nsfw_scorers: Tuple[str, ...]      # the scorer labels the old build's NSFW note names (its scores are reused
    #                                    where this worker's scorer is one of them); () reuses no score
    eval_matches: bool                 # the evaluation index is the old build's: a searched row's match is reused
    stored_pictures: bool              # the stored picture options are the old build's: written pictures copied
    first_pass_stages: Tuple[str, ...]  # stages the old first pass decided before the evaluation search


class KnownFacts(NamedTuple):
    """One old table row: what a record's image was found to be."""

    key: str
    sha256: str
    phash: str                   # "" when the old build never decoded it (or the decode failed)
    nsfw_score: Optional[float]  # None when the old build never scored it
    searched: bool               # the old build searched the evaluation index for it
    eval_match: str              # and what it found ("" none)
    stored_at: str               # "<shard path>@<offset>" of its stored picture ("" not written)


def _number(value) -> Optional[float]:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def read_facts(previous: PreviousBuild, table_file: str) -> Dict[Tuple[str, int], KnownFacts]:
    """``{(source, ordinal): KnownFacts}`` of one old table file; ``{}`` when it cannot be read (its records are
    then judged as new: a damaged table never answers for a record)."""
    try:
        with FileSystems.open(table_file) as handle:
            table = pq.read_table(pa.BufferReader(handle.read()), columns=list(_COLUMNS))
    except Exception:  # truncated or removed since the launcher checked it
        return {}
    columns = {name: table.column(name).to_pylist() for name in _COLUMNS}
    facts = {}
    for i in range(table.num_rows):
        ordinal, source = columns["ordinal"][i], columns["source"][i]
        if ordinal is None or ordinal < 0 or not source:
            continue
        reason = columns["reason"][i] or ""
        stage = reason.split("/", 1)[0]
        shard = columns["shard"][i]
        facts[(source, int(ordinal))] = KnownFacts(
            key=columns["key"][i] or "", sha256=columns["sha256"][i] or "", phash=columns["phash"][i] or "",
            nsfw_score=_number(columns["nsfw_score"][i]),
            searched=stage not in previous.first_pass_stages,
            eval_match=columns["eval_match"][i] or "",
            stored_at=f"{FileSystems.join(previous.version_dir, shard)}@{int(columns['offset'][i])}"
            if shard and previous.stored_pictures else "",
        )
    return facts


def reuse_note(said: str, outcomes: Dict[str, int]) -> str:
    """The funnel's note of a rebuild: ``said`` (which facts it takes), and its records per outcome."""
    counts = (f"{outcomes.get(REUSED, 0):,} records' facts reused, {outcomes.get(RECOMPUTED, 0):,} derived again "
              f"(bytes changed, or not measured before), {outcomes.get(NEW, 0):,} new")
    return f"{said}: {counts}" if said else counts


class FactsOfFiles:
    """The old facts of the input file being judged, read when its first record asks (one table file at a time)."""

    def __init__(self, previous: PreviousBuild):
        self.previous = previous
        self.tables = dict(previous.tables)
        self.source: Optional[str] = None
        self.facts: Dict[Tuple[str, int], KnownFacts] = {}

    def get(self, source: str, ordinal: int) -> Optional[KnownFacts]:
        if source != self.source:
            self.source = source
            table_file = self.tables.get(source)
            self.facts = read_facts(self.previous, table_file) if table_file else {}
        return self.facts.get((source, ordinal))
