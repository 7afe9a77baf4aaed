"""The candidate table: every input record's light facts and fate, as plain Parquet inside the version.

    VERSION/stats/candidates/part-00000-of-00003.parquet   one file per input file, one row per record
    VERSION/stats/candidates/_summary.json                 its files (rows, bytes), its rows per fate

The first pass measures every candidate (sizes, words, hashes, scores, its
first reason); the corpus stages decide keys; the second pass writes the
kept records. This writes what they found, one row per input record, so
that a subset can be chosen after the build, with any Parquet tool. The columns are documented in
``docs/output.md``.

How the fates meet the rows, without a step that sees the whole table:

- a record the first pass rejected keeps its reason;
- the others meet their key's corpus verdicts and lowest n-gram count in a
  hot-key-safe join (``common.hot_keys.JoinDecisions``): the first verdict
  in run order is the key's reason, as ``JoinVerdicts`` decides it;
- the rows left meet, by source file, what the second pass wrote (split,
  shard, offset) and what it rejected late; a row it did neither with is
  one of its key's repeats (``duplicate_pair/repeat``).

Each input file's rows are one group (as the second pass reads them) and
one table file, written by the worker that holds the group, in row groups
of ``ROW_GROUP`` rows. A row's strings are cut at ``MAX_CHARS`` characters
each, so a row is bounded (see ``ROW_BOUND_BYTES``); the measures were taken
on the whole text. ``_summary.json`` is summed from the files' own reports
and checked by the publication (``pipeline.funnel.candidate_counts``).
"""

from __future__ import annotations

import collections
import json
import math
from typing import Dict, Iterable, NamedTuple, Optional, Tuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from common.files import size_of, write_text
from common.once import once, total
from common.optional_inputs import OptionalInputs
from filters.text import repetition, words
from pipeline.funnel.candidate_counts import FORMAT_VERSION, SUMMARY_FILE, table_file
from pipeline.funnel.accounting import records_of
from pipeline.stages.light_rows import LightRow
from pipeline.stages.verdicts import REPEAT, first_verdict

#: Characters kept of each string column (url, text, source, eval_match); the measures saw the whole text.
MAX_CHARS = 1024
ROW_GROUP = 10_000

SCHEMA = pa.schema([
    ("key", pa.string()),
    ("url", pa.string()),
    ("text", pa.string()),
    ("split", pa.string()),
    ("reason", pa.string()),
    ("words", pa.int32()),
    ("repetition", pa.float64()),
    ("width", pa.int32()),
    ("height", pa.int32()),
    ("format", pa.string()),
    ("sha256", pa.string()),
    ("phash", pa.string()),
    ("nsfw_score", pa.float64()),
    ("model_score", pa.float64()),
    ("lowest_ngram_count", pa.int64()),
    ("eval_match", pa.string()),
    ("counted", pa.bool_()),
    ("stored_width", pa.int32()),
    ("stored_height", pa.int32()),
    ("source", pa.string()),
    ("reader", pa.string()),
    ("ordinal", pa.int64()),
    ("shard", pa.string()),
    ("offset", pa.int64()),
])
#: The most bytes one row holds before compression: four strings at ``MAX_CHARS`` (up to 4 bytes a character in
#: UTF-8), the key (24), sha256 (64), phash (16), format, reader, split, reason and shard (at most 128 each),
#: and 17 numbers and flags of at most 8 bytes.
ROW_BOUND_BYTES = 4 * 4 * MAX_CHARS + 24 + 64 + 16 + 5 * 128 + 17 * 8


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS]


def _score(value: float) -> Optional[float]:
    return None if value is None or math.isinf(value) or math.isnan(value) else float(value)


def table_row(row: LightRow, split: str = "", shard: str = "", offset: int = -1) -> dict:
    """One candidate's row of the table; ``split``/``shard``/``offset`` where it was written (its reason is "")."""
    toks = words(row.text)
    return {
        "key": row.key, "url": _cut(row.url), "text": _cut(row.text),
        "split": split or None, "reason": None if split else row.reason,
        "words": len(toks), "repetition": repetition(toks) if toks else 0.0,
        "width": row.width, "height": row.height, "format": row.format, "sha256": row.sha256, "phash": row.phash,
        "nsfw_score": _score(row.nsfw_score), "model_score": _score(row.model_score),
        "lowest_ngram_count": row.lowest_ngram_count or None, "eval_match": _cut(row.eval_match) or None,
        "counted": bool(row.counted), "stored_width": row.stored_width, "stored_height": row.stored_height,
        "source": _cut(row.source), "reader": row.reader, "ordinal": row.ordinal,
        "shard": shard or None, "offset": offset if shard else None,
    }


def fate_of(entry: dict) -> str:
    return entry["split"] or entry["reason"]


class _KeyDecision:
    """Combines a key's ``(first verdict, lowest n-gram count)`` pairs: the run order's first reason, the lowest count."""

    def __init__(self, rank=None):
        self.rank = rank

    def __call__(self, decisions: Iterable[Tuple[str, int]]) -> Tuple[str, int]:
        reasons, lowest = [], 0
        for reason, count in decisions:
            if reason:
                reasons.append(reason)
            if count and (not lowest or count < lowest):
                lowest = count
        return (first_verdict(reasons, self.rank) if reasons else ""), lowest


def _decided(row_decision) -> LightRow:
    row, decision = row_decision
    if decision is None:
        return row
    reason, lowest = decision
    return row._replace(reason=reason, lowest_ngram_count=lowest)


def _entries(rows: Iterable[LightRow], written: Iterable[tuple], late: Iterable[tuple]):
    """One file's rows with what the second pass did with them -> ``(its table row, the input records it stands
    for)``, in ordinal order (a reader's marker of unreadable rows stands for the rows its file states, as in the
    funnel)."""
    # By ordinal and key: with --download, the rows that name one URL share its staged body (one ordinal).
    placed = {(ordinal, key): (split, shard, offset) for key, ordinal, split, shard, offset in written}
    dropped = {(ordinal, key): reason for ordinal, key, reason in late}
    for row in sorted(rows, key=lambda r: (r.ordinal, r.key)):
        if row.reason:
            yield table_row(row), records_of(row)
        elif (row.ordinal, row.key) in placed:  # taken once: an identical row after it is a repeat
            yield table_row(row, *placed.pop((row.ordinal, row.key))), 1
        else:
            yield table_row(row._replace(reason=dropped.get((row.ordinal, row.key), REPEAT))), 1


class _WriteFileTable(beam.DoFn):
    """``(source file, {"rows", "written", "late"})`` -> its table file; yields the file's report."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.index: Optional[Dict[str, int]] = None

    def process(self, element, sources):
        source, grouped = element
        if self.index is None:  # the side input is the same for the whole job: sorted once per DoFn, not per file
            self.index = {name: i for i, name in enumerate(sorted(sources))}
        index = self.index
        relative = table_file(index[source], len(index))
        path = FileSystems.join(self.output_dir, relative)
        fates: Dict[str, int] = collections.Counter()
        count, records, batch = 0, 0, []
        handle = FileSystems.create(path)
        writer = pq.ParquetWriter(pa.PythonFile(handle, mode="w"), SCHEMA, compression="zstd")
        try:
            for entry, stands_for in _entries(grouped["rows"], grouped["written"], grouped["late"]):
                fates[fate_of(entry)] += stands_for
                count += 1
                records += stands_for
                batch.append(entry)
                if len(batch) >= ROW_GROUP:
                    writer.write_table(pa.Table.from_pylist(batch, schema=SCHEMA))
                    batch = []
            if batch or not count:
                writer.write_table(pa.Table.from_pylist(batch, schema=SCHEMA))
        finally:
            writer.close()
            handle.close()
        size = size_of(path)
        yield {"files": {relative: {"rows": count, "bytes": size}}, "rows": count, "records": records,
               "fates": dict(fates)}


def merge_summaries(parts: Iterable[dict]) -> dict:
    """The files' reports -> ``_summary.json``'s document (also a combiner: partial sums merge)."""
    files, fates, rows, records = {}, collections.Counter(), 0, 0
    for part in parts:
        files.update(part.get("files") or {})
        fates.update(part.get("fates") or {})
        rows += int(part.get("rows", 0))
        records += int(part.get("records", 0))
    table_bytes = sum(int(entry["bytes"]) for entry in files.values())
    return {"format_version": FORMAT_VERSION, "files": files, "rows": rows, "records": records,
            "fates": dict(sorted(fates.items())),
            "bytes": table_bytes, "row_bound_bytes": ROW_BOUND_BYTES, "max_chars": MAX_CHARS}


def _by_source(row: LightRow):
    return row.source, row


class TableInputs(NamedTuple):
    """What the candidate table is made of.

    ``rows``: every input record's first-pass row; ``placements``: the
    second pass's ``(key, source, ordinal, split, shard, offset)`` of each
    record written; ``late_rejections``: the rows it could not write;
    ``key_verdicts``: every corpus stage's ``(key, reason)`` and
    ``lowest_ngram_counts``: ``(key, count)``, None where no corpus stage
    ran (a selection: its rows carry their fates already).
    """

    rows: beam.PCollection
    placements: beam.PCollection
    late_rejections: beam.PCollection
    key_verdicts: Optional[beam.PCollection] = None
    lowest_ngram_counts: Optional[beam.PCollection] = None


class WriteCandidateTable(OptionalInputs):
    """``TableInputs`` -> the table files and summary. ``rank``: the stage order
    (``filters.extra_stages.stage_rank``)."""

    def __init__(self, output_dir: str, rank=None):
        super().__init__()
        self.output_dir, self.rank = output_dir, rank

    def expand(self, inputs):
        from common.hot_keys import JoinDecisions

        output_dir = self.output_dir
        rows = inputs.rows
        rejected = rows | "FirstPassRejections" >> beam.Filter(lambda row: bool(row.reason))
        decided = running = rows | "InTheRunning" >> beam.Filter(lambda row: not row.reason)
        if inputs.key_verdicts is not None:
            decisions = (
                (inputs.key_verdicts | "VerdictDecisions" >> beam.MapTuple(lambda key, reason: (key, (reason, 0))),
                 inputs.lowest_ngram_counts | "NgramDecisions" >> beam.MapTuple(lambda key, n: (key, ("", int(n)))))
                | "AllKeyDecisions" >> beam.Flatten()
            )
            decided = (
                {"rows": running | "KeyRows" >> beam.Map(lambda row: (row.key, row)), "decisions": decisions}
                | "JoinKeyDecisions" >> JoinDecisions(combine=_KeyDecision(self.rank), label="candidate_table")
                | "ApplyKeyDecisions" >> beam.Map(_decided)
            )
        all_rows = (rejected, decided) | "AllCandidates" >> beam.Flatten()
        sources = (
            all_rows
            | "Sources" >> beam.Map(lambda row: row.source)
            | "DistinctSources" >> beam.Distinct()
        )
        grouped = {
            "rows": all_rows | "RowsBySource" >> beam.Map(_by_source),
            "written": inputs.placements | "WrittenBySource" >> beam.Map(
                lambda w: (w[1], (w[0], w[2], w[3], w[4], w[5]))),
            "late": inputs.late_rejections | "LateBySource" >> beam.Map(
                lambda row: (row.source, (row.ordinal, row.key, row.reason))),
        } | "GroupBySource" >> beam.CoGroupByKey()
        reports = grouped | "WriteTableFiles" >> beam.ParDo(
            _WriteFileTable(output_dir), beam.pvalue.AsList(sources))
        return once(reports.pipeline, "WriteSummary", _write_summary, total(reports, "SumReports", merge_summaries),
                    output_dir)


def _write_summary(summary: dict, output_dir: str) -> None:
    if not summary["files"]:
        # No input file had a row (nothing read, or a selection of nothing): one file of the schema and no rows,
        # so that the directory still reads as the table, with its columns.
        relative = table_file(0, 1)
        path = FileSystems.join(output_dir, relative)
        handle = FileSystems.create(path)
        try:
            pq.write_table(SCHEMA.empty_table(), pa.PythonFile(handle, mode="w"), compression="zstd")
        finally:
            handle.close()
        summary = merge_summaries([summary, {"files": {relative: {"rows": 0, "bytes": size_of(path)}}}])
    write_text(FileSystems.join(output_dir, SUMMARY_FILE), json.dumps(summary, sort_keys=True))


def read_table(version_dir: str) -> "pa.Table":
    """The whole table of a version, in file order."""
    with FileSystems.open(FileSystems.join(version_dir, SUMMARY_FILE)) as handle:
        summary = json.loads(handle.read())
    parts = []
    for relative in sorted(summary["files"]):
        with FileSystems.open(FileSystems.join(version_dir, relative)) as handle:
            parts.append(pq.read_table(pa.BufferReader(handle.read())))
    return pa.concat_tables(parts) if parts else SCHEMA.empty_table()


def fates(table: "pa.Table") -> Dict[str, int]:
    counts: Dict[str, int] = collections.Counter()
    for split, reason in zip(table.column("split").to_pylist(), table.column("reason").to_pylist()):
        counts[split or reason] += 1
    return dict(counts)

