"""How the stages of the build hand on their verdicts, and where records meet them.

One routing style for every stage: a stage is a composite ``PTransform``
returning a dict with ``"rejected"`` (and ``"survivors"`` when later stages
read them); splits inside it are tagged outputs. Two kinds of rejections:

- record stages (reading, the record filters) reject whole records:
  ``Rejection`` rows, which already hold what the audit shows;
- key stages (NSFW, the frequency filters, near-duplicates) see light rows
  without image bytes and reject keys: ``(key, reason)`` verdicts. A later key
  stage drops earlier verdicts from its input with ``DropKeys``;
  ``JoinVerdicts`` applies them all to the records in the build's one shuffle
  of image bytes.

Each stage declares the stage names it ``decides`` (``filters.stages``);
``StagesRun`` collects them as the graph is built, so the funnel's "ran"
flags and notes come from the stages that were applied.
"""

from __future__ import annotations

import bisect
import functools
import operator
from typing import Dict, List, Optional, Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from common.schema import Candidate
from filters import stages
from common.hot_keys import JoinDecisions
from pipeline.stage_rows import rejection
from pipeline.stats import METRICS_NAMESPACE, SAMPLES_PER_REASON

SURVIVORS, REJECTED = "survivors", "rejected"


class StagesRun:
    """The stages applied to the graph so far: the names they decide, and their notes.

    ``p | "Label" >> ran(Stage(...))`` applies a stage and records it. A stage
    says what it decides in ``decides`` (names of ``filters.stages``, or of
    extra stages, ``filters.extra_stages``) and may say more for the funnel
    in ``notes`` (``{stage name: text}``).
    """

    def __init__(self, notes: Dict[str, str] = None):
        self.names: List[str] = []
        self.notes: Dict[str, str] = dict(notes or {})

    def __call__(self, stage: beam.PTransform) -> beam.PTransform:
        self.names.extend(stage.decides)
        self.notes.update(getattr(stage, "notes", {}))
        return stage


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


def keep_order(record: Candidate) -> tuple:
    """Which of a key's records is written: the smallest, by content (never arrival order)."""
    # sha256 and the bytes first (as always); every other field after, so that
    # records differing only in metadata are ordered too. key, url and
    # alt_text are the same for all of a key's records.
    return (record.sha256, record.image or b"", record.width, record.height, record.format, record.stored_width,
            record.stored_height, record.text, record.phash, record.source_width, record.source_height,
            repr(record.source), repr(record.carried))


def rejection_order(record: Candidate) -> tuple:
    """How a key's rejections compare (``Rejection`` tuples of one key and reason differ only here)."""
    return record.width, record.height, record.format, record.image or b""


def first_verdict(verdicts, rank=None):
    """The verdict of the earliest stage (also a combiner: any number of verdicts per key).

    ``rank`` (stage name -> run position, ``filters.extra_stages.stage_rank``)
    orders the verdicts when extra stages run; the built-in order otherwise.
    """
    rank = rank or stages.STAGE_INDEX
    return min(verdicts, key=lambda r: rank[stages.stage_of(r)])


def resolve_group(key: str, records: List[Candidate], verdicts: List[str], rank=None):
    """The rule on one key's whole list of records and corpus verdicts: what to write and what to reject.

    A verdict (the first corpus stage that rejected the key) applies to every
    record with the key. Otherwise exactly one record is written (the first
    by ``keep_order``: content, not arrival order, so runs agree); repeats
    of the same (url, alt-text) pair are ``duplicate_pair/repeat``.
    ``JoinVerdicts`` decides the same from a bounded ``RepeatSummary``,
    never from the list.
    """
    ordered = sorted(records, key=keep_order)
    if verdicts:
        first = first_verdict(verdicts, rank)
        return [], [(r, first) for r in ordered]
    return ordered[:1], [(r, REPEAT) for r in ordered[1:]]


class RepeatSummary(beam.CombineFn):
    """A key's records -> ``(count, kept, smallest)``: at most ``sample + 2`` records, whatever the count.

    ``kept`` is the record ``resolve_group`` would write; ``smallest`` the
    ``sample + 1`` smallest by ``rejection_order`` (sorted): all that the
    audit's sampled rejections (``stats.SAMPLES_PER_REASON`` per reason, the
    smallest by key rank, then ``Rejection``) can show of this key. A
    combine, so repeats are reduced on the worker that read them, before
    their image bytes cross the shuffle.
    """

    def __init__(self, sample: int = SAMPLES_PER_REASON):
        self.size = sample + 1

    def create_accumulator(self):
        return 0, None, []

    def _add(self, acc, count, kept, smallest):
        n, best, pool = acc
        if kept is not None and (best is None or keep_order(kept) < keep_order(best)):
            best = kept
        pool = list(pool)
        orders = [rejection_order(r) for r in pool]
        for record in smallest:
            order = rejection_order(record)
            if len(pool) < self.size or order < orders[-1]:
                at = bisect.bisect_right(orders, order)
                orders.insert(at, order)
                pool.insert(at, record)
                del orders[self.size:], pool[self.size:]
        return n + count, best, pool

    def add_input(self, acc, record):
        return self._add(acc, 1, record, [record])

    def merge_accumulators(self, accs):
        merged = self.create_accumulator()
        for n, best, pool in accs:
            merged = self._add(merged, n, best, pool)
        return merged

    def extract_output(self, acc):
        return acc


def summary_rejections(summary, verdict: Optional[str]) -> Tuple[Optional[Candidate], List[Tuple[Candidate, str, int]]]:
    """A key's ``RepeatSummary`` and verdict -> (record to write or None, [(record, reason, times)]).

    The rejections of ``resolve_group`` as far as any output can tell: the
    same number per reason, the same smallest ones (the audit's samples),
    every record beyond those stood in for by the largest of them
    (``times`` copies). The ledger line (key, reason, url) is the same for
    all of a key's records.
    """
    count, kept, smallest = summary
    if verdict is not None:
        reason, total, rejected = verdict, count, list(smallest)
    else:
        reason, total = REPEAT, count - 1
        # Records equal in content are interchangeable: drop one occurrence of the kept one.
        rejected = list(smallest)
        at = next((i for i, r in enumerate(rejected) if r == kept), None)
        if at is not None:
            del rejected[at]
        rejected = rejected[:total]
    out = [(record, reason, 1) for record in rejected]
    if total > len(rejected) and rejected:
        out.append((rejected[-1], reason, total - len(rejected)))
    return (kept if verdict is None else None), out


class _ResolveVerdicts(beam.DoFn):
    def process(self, element):
        _, grouped = element
        summaries = grouped["records"]
        if not summaries:
            return  # a verdict for a key whose records were rejected before
        verdict = next(iter(grouped["verdicts"]), None)
        kept, rejections = summary_rejections(summaries[0], verdict)
        if kept is not None:
            yield kept
        for record, reason, times in rejections:
            Metrics.counter(METRICS_NAMESPACE, reason).inc(times)
            row = rejection(record, reason)
            for _ in range(times):
                yield beam.pvalue.TaggedOutput(REJECTED, row)


class JoinVerdicts(beam.PTransform):
    """``(records, (key, reason) verdicts)`` -> ``{"survivors": records to write, "rejected": Rejection}``.

    Decides ``duplicate_pair`` on the way: of the records left with one key,
    one is written. A key's repeats are reduced by a combine
    (``RepeatSummary``) before the shuffle and its verdicts to the first,
    so the join meets one summary and one verdict per key, however often a
    pair repeats; ``resolve_group`` is the same rule on a whole list.
    """

    decides = ("duplicate_pair",)

    def __init__(self, rank=None):
        super().__init__()
        self.rank = rank

    def expand(self, inputs):
        records, verdicts = inputs
        summaries = (
            records
            | "KeyRecords" >> beam.Map(lambda r: (r.key, r))
            | "SummarisePerKey" >> beam.CombinePerKey(RepeatSummary())
        )
        first = verdicts | "FirstVerdictPerKey" >> beam.CombinePerKey(functools.partial(first_verdict, rank=self.rank))
        outputs = (
            {"records": summaries, "verdicts": first}
            | "GroupByPairKey" >> beam.CoGroupByKey()
            | "Resolve" >> beam.ParDo(_ResolveVerdicts()).with_outputs(REJECTED, main=SURVIVORS)
        )
        return {SURVIVORS: outputs[SURVIVORS], REJECTED: outputs[REJECTED]}
