"""How the stages of the build hand on their verdicts, and where records meet them.

One routing style for every stage: a stage is a composite ``PTransform``
returning a dict with ``"rejected"`` (and ``"survivors"`` when later stages
read them); splits inside it are tagged outputs. Two kinds of rejections:

- the first pass (``pipeline.stages.judge``) rejects records: a light row carries
  its first per-record reason (reading, the record filters, NSFW);
- key stages (the frequency filters, near-duplicates) see light rows of the
  records still in the running and reject keys: ``(key, reason)``
  verdicts. A later key stage drops earlier verdicts from its input with
  ``DropKeys``; ``JoinVerdicts`` applies them all to the light rows.

Each stage declares the stage names it ``decides`` (``filters.stages``);
``StagesRun`` collects them from the stages a job applies, so the funnel's
"ran" flags and notes come from the stages that were applied.
"""

from __future__ import annotations

import operator
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from common.hot_keys import JoinDecisions
from filters import stages
from filters.stages import REJECTED, SURVIVORS
from pipeline.funnel.accounting import VERDICTS_NAMESPACE
from pipeline.funnel.counts import METRICS_NAMESPACE
from pipeline.stages.light_rows import (
    KEYED_ROW,
    LightRow,
    holding_rows,
    keyed,
    ngram_count_row,
    rejected,
    verdict_row,
)


class StagesRun(NamedTuple):
    """The stages a job applies: the names they decide, in the order they run, and their notes for the funnel.

    A stage says what it decides in ``decides`` (names of ``filters.stages``,
    or of extra stages, ``filters.extra_stages``) and may say more in
    ``notes`` (``{stage name: text}``); both are known once it is made, before
    the graph is built. ``StagesRun.of(stages, notes)`` collects them: the
    launcher's ``notes`` first, a stage's own note of the same name wins.
    """

    names: List[str]
    notes: Dict[str, str]

    @classmethod
    def of(cls, applied: Sequence[beam.PTransform], notes: Optional[Dict[str, str]] = None) -> "StagesRun":
        names, merged = [], dict(notes or {})
        for stage in applied:
            names.extend(stage.decides)
            merged.update(getattr(stage, "notes", {}))
        return cls(names, merged)


class DropKeys(beam.PTransform):
    """``(rows, (key, reason) verdicts)`` -> the rows whose key has no verdict.

    ``key_of(row)`` names a row's key: ``row_key`` for named rows, the
    default (first item) for ``(key, value)`` pairs. A key repeated on many
    rows (one (url, alt-text) pair on every page of a site) is never one
    list (``common.hot_keys.JoinDecisions``).
    """

    def __init__(self, key_of=operator.itemgetter(0)):
        super().__init__()
        self.key_of = key_of

    def expand(self, inputs):
        rows, rejected = inputs
        key_of = self.key_of
        return (
            {"rows": rows | "KeyRows" >> beam.Map(lambda row: (key_of(row), row)), "decisions": rejected}
            | "GroupRowsAndRejects" >> JoinDecisions(label="drop_keys")
            | "KeepUnrejected" >> beam.FlatMap(lambda row_reason: [] if row_reason[1] is not None else [row_reason[0]])
        )


REPEAT = stages.reason("duplicate_pair", "repeat")


def keep_order(row: LightRow) -> tuple:
    """Which of a key's rows is written: the smallest by image, then by where it was read (never arrival order)."""
    # key, url and text are the same for all of a key's rows.
    return row.sha256, row.phash, row.width, row.height, row.format, row.source, row.ordinal


def first_verdict(verdicts, rank=None):
    """The verdict of the earliest stage, then the first by name (also a combiner: any number of verdicts per key).

    ``rank`` (stage name -> run position, ``filters.extra_stages.stage_rank``)
    orders the verdicts when extra stages run; the built-in order otherwise.
    """
    rank = rank or stages.STAGE_INDEX
    return min(verdicts, key=lambda r: (rank[stages.stage_of(r)], r))


def resolve_group(key: str, rows: List[LightRow], verdicts: List[str], rank=None):
    """The rule on one key's whole list of rows and corpus verdicts: what to write and what to reject.

    A verdict (the first corpus stage that rejected the key) applies to every
    row with the key. Otherwise exactly one row is written (the first by
    ``keep_order``: content and place, not arrival order, so runs agree);
    repeats of the same (url, alt-text) pair are ``duplicate_pair/repeat``.
    ``JoinVerdicts`` decides the same from a bounded ``RepeatSummary``,
    never from the list.
    """
    ordered = sorted(rows, key=keep_order)
    if verdicts:
        first = first_verdict(verdicts, rank)
        return [], [(r, first) for r in ordered]
    return ordered[:1], [(r, REPEAT) for r in ordered[1:]]


class _CountVerdict(beam.DoFn):
    def __init__(self, stage: str):
        self.emitted = Metrics.counter(VERDICTS_NAMESPACE, f"emitted/{stage}")

    def process(self, verdict):
        self.emitted.inc()
        yield verdict


class CountVerdicts(beam.PTransform):
    """``(key, reason)`` verdicts, unchanged, counted as ``verdicts/emitted/<stage>``."""

    def __init__(self, stage: str):
        super().__init__()
        self.stage = stage

    def expand(self, verdicts):
        return verdicts | "Count" >> beam.ParDo(_CountVerdict(self.stage))


class KeyFate(beam.CombineFn):
    """A key's light rows and verdict rows -> ``(count, smallest, second smallest, verdicts, verdicts folded,
    verdict stages, lowest n-gram count)``.

    Rows are the records still in the running (reason ""), ordered by
    ``keep_order``: the smallest is the row ``resolve_group`` would write, a
    rejection of the key is shown by the smallest row it rejects. Verdict rows
    (``stage_rows.verdict_row``) carry a key stage's reason; ``verdicts`` is
    every distinct one, "|"-joined in run order, so the first is the key's
    reason (``first_of``) and the rest say which later stages rejected it too
    (the audit's "what the score alone would have caught"); how many verdict
    rows were folded in is counted (``verdicts/received``). A combine, so a
    pair repeated on every page of a site is reduced where it was read; the
    accumulator is two rows, at most one reason per stage and four integers,
    whatever the count, with a compact coder (``accumulator_coder``).

    The last two fields are for the audit's what-if (``pipeline.what_if.collect``):
    a bit per stage (``rank``) that gave the key a verdict, and the lowest
    count among its n-grams (``stage_rows.ngram_count_row``; 0: none came).
    """

    def __init__(self, rank=None):
        self.rank = rank

    def create_accumulator(self):
        return 0, None, None, "", 0, 0, 0

    def _add(self, acc, count, rows, verdicts, folded_here=0, mask=0, lowest=0):
        n, first, second, known, folded, stages_mask, lowest_so_far = acc
        for row in rows:
            if row is None:
                continue
            if first is None or keep_order(row) < keep_order(first):
                first, second = row, first
            elif second is None or keep_order(row) < keep_order(second):
                second = row
        if verdicts and verdicts != known:
            known = merge_verdicts(known, verdicts, self.rank)
        if lowest and (not lowest_so_far or lowest < lowest_so_far):
            lowest_so_far = lowest
        return n + count, first, second, known, folded + folded_here, stages_mask | mask, lowest_so_far

    def add_input(self, acc, row):
        if row.lowest_ngram_count:
            return self._add(acc, 0, (), "", lowest=row.lowest_ngram_count)
        if row.reason:
            rank = self.rank or stages.STAGE_INDEX
            return self._add(acc, 0, (), row.reason, 1, 1 << rank[stages.stage_of(row.reason)])
        return self._add(acc, 1, (row,), "")

    def merge_accumulators(self, accs):
        merged = self.create_accumulator()
        for n, first, second, verdicts, folded, mask, lowest in accs:
            merged = self._add(merged, n, (first, second), verdicts, folded, mask, lowest)
        return merged

    def extract_output(self, acc):
        return acc

    def get_accumulator_coder(self):
        return accumulator_coder()


def merge_verdicts(known: str, verdicts: str, rank=None) -> str:
    """Two "|"-joined sets of reasons -> one, in run order (then by name: runs agree whatever the arrival order)."""
    rank = rank or stages.STAGE_INDEX
    reasons = set(known.split("|")) if known else set()
    reasons.update(verdicts.split("|"))
    return "|".join(sorted(reasons, key=lambda r: (rank[stages.stage_of(r)], r)))


def first_of(verdicts: str) -> str:
    """The key's reason: the first of its "|"-joined verdicts ("" for none)."""
    return verdicts.split("|", 1)[0]


def accumulator_coder():
    row = beam.coders.registry.get_coder(LightRow)
    return beam.coders.TupleCoder([beam.coders.VarIntCoder(), beam.coders.NullableCoder(row),
                                   beam.coders.NullableCoder(row), beam.coders.StrUtf8Coder(),
                                   beam.coders.VarIntCoder(), beam.coders.VarIntCoder(), beam.coders.VarIntCoder()])


def fate_rejections(fate) -> Tuple[Optional[LightRow], List[Tuple[LightRow, str, int]]]:
    """A key's ``KeyFate`` -> (row to write or None, [(row shown, reason, times)]).

    The rejections of ``resolve_group`` as far as any output can tell: the
    same number per reason and the same ledger line (key, reason, url, the
    same for all of a key's rows); the audit shows the smallest row rejected.
    """
    count, first, second, verdicts = fate[:4]
    if count == 0:
        return None, []  # a verdict for a key whose rows were rejected before
    if verdicts:
        return None, [(first, first_of(verdicts), count)]
    if count == 1:
        return first, []
    return first, [(second, REPEAT, count - 1)]


#: ``JoinVerdicts``' output of the keys more than one stage rejected:
#: ``(first reason, (the later stages' reasons, ...), the pair's model score, rows)``.
OVERLAPS = "overlaps"


class _ResolveVerdicts(beam.DoFn):
    def __init__(self, overlaps: bool = False):
        self.overlaps = overlaps
        self.received = Metrics.counter(VERDICTS_NAMESPACE, "received")

    def process(self, element):
        fate = element[1]
        self.received.inc(fate[4])
        kept, rejections = fate_rejections(fate)
        if kept is not None:
            yield kept
        for row, reason, times in rejections:
            Metrics.counter(METRICS_NAMESPACE, reason).inc(times)
            rejection = rejected(row, reason)
            for _ in range(times):
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
        if self.overlaps and fate[0] and "|" in fate[3]:
            first, *others = fate[3].split("|")
            yield beam.pvalue.TaggedOutput(OVERLAPS, (first, tuple(others), float(fate[1].model_score), fate[0]))


class JoinVerdicts(beam.PTransform):
    """``(light rows, (key, reason) verdicts[, (key, lowest n-gram count)])`` -> ``{"survivors": rows to write,
    "rejected": rows with their reason, "fates": (key, KeyFate accumulator)}``.

    Decides ``duplicate_pair`` on the way: of the rows left with one key,
    one is written. Rows and verdicts meet in one combine per key
    (``KeyFate``), so a key's repeats are reduced before the shuffle, however
    often a pair repeats; ``resolve_group`` is the same rule on a whole list.
    Verdicts may repeat (a key rejected by several stages): every distinct
    one is kept, the earliest stage's first; the others, the verdict stages
    and the n-gram counts are in the fates for the audit's what-if
    (``pipeline.what_if.collect``). With ``overlaps``, also ``"overlaps"``:
    one ``OVERLAPS`` tuple per key that more than one stage rejected.
    """

    decides = ("duplicate_pair",)

    def __init__(self, rank=None, overlaps: bool = False):
        super().__init__()
        self.rank = rank
        self.overlaps = overlaps

    def expand(self, inputs):
        rows, verdicts = inputs[:2]
        keyed_rows = rows | "KeyRows" >> beam.Map(keyed).with_output_types(KEYED_ROW)
        keyed_verdicts = verdicts | "VerdictRows" >> beam.MapTuple(
            lambda key, reason: (key, verdict_row(key, reason))).with_output_types(KEYED_ROW)
        parts = [keyed_rows, keyed_verdicts]
        if len(inputs) > 2:
            parts.append(inputs[2] | "NgramCountRows" >> beam.MapTuple(
                lambda key, count: (key, ngram_count_row(key, count))).with_output_types(KEYED_ROW))
        fates = (
            parts
            | "RowsAndVerdicts" >> beam.Flatten()
            | "FatePerKey" >> beam.CombinePerKey(KeyFate(self.rank))
        )
        outputs = fates | "Resolve" >> beam.ParDo(_ResolveVerdicts(self.overlaps)).with_outputs(
            REJECTED, OVERLAPS, main=SURVIVORS)
        return {SURVIVORS: holding_rows(outputs[SURVIVORS]), REJECTED: holding_rows(outputs[REJECTED]),
                OVERLAPS: outputs[OVERLAPS], "fates": fates}
