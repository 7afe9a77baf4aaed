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

import operator
from typing import Dict, List

import apache_beam as beam
from apache_beam.metrics import Metrics

from common.schema import Candidate
from filters import stages
from pipeline.stage_rows import rejection
from pipeline.stats import METRICS_NAMESPACE

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
    default (first item) for ``(key, value)`` pairs.
    """

    def __init__(self, key_of=operator.itemgetter(0)):
        super().__init__()
        self.key_of = key_of

    def expand(self, inputs):
        rows, rejected = inputs
        key_of = self.key_of
        return (
            {"row": rows | "KeyRows" >> beam.Map(lambda row: (key_of(row), row)), "rejected": rejected}
            | "GroupRowsAndRejects" >> beam.CoGroupByKey()
            | "KeepUnrejected" >> beam.FlatMap(lambda kv: [] if kv[1]["rejected"] else kv[1]["row"])
        )


def resolve_group(key: str, records: List[Candidate], verdicts: List[str], rank=None):
    """One key's records and corpus verdicts -> what to write and what to reject.

    A verdict (the first corpus stage that rejected the key) applies to every
    record with the key. Otherwise exactly one record is written; repeats of
    the same (url, alt-text) pair are ``duplicate_pair/repeat``. The kept one
    is chosen by content, not arrival order, so runs agree. ``rank`` (stage
    name -> run position, ``filters.extra_stages.stage_rank``) orders the
    verdicts when extra stages run; the built-in order otherwise.
    """
    rank = rank or stages.STAGE_INDEX
    ordered = sorted(records, key=lambda r: (r.sha256, r.image))
    if verdicts:
        first = min(verdicts, key=lambda r: rank[stages.stage_of(r)])
        return [], [(r, first) for r in ordered]
    repeat = stages.reason("duplicate_pair", "repeat")
    return ordered[:1], [(r, repeat) for r in ordered[1:]]


class _ResolveVerdicts(beam.DoFn):
    def __init__(self, rank=None):
        self.rank = rank

    def process(self, element):
        key, grouped = element
        keep, reject = resolve_group(key, list(grouped["records"]), list(grouped["verdicts"]), self.rank)
        yield from keep
        for record, reason in reject:
            Metrics.counter(METRICS_NAMESPACE, reason).inc()
            yield beam.pvalue.TaggedOutput(REJECTED, rejection(record, reason))


class JoinVerdicts(beam.PTransform):
    """``(records, (key, reason) verdicts)`` -> ``{"survivors": records to write, "rejected": Rejection}``.

    Decides ``duplicate_pair`` on the way: of the records left with one key,
    one is written.
    """

    decides = ("duplicate_pair",)

    def __init__(self, rank=None):
        super().__init__()
        self.rank = rank

    def expand(self, inputs):
        records, verdicts = inputs
        keyed = records | "KeyRecords" >> beam.Map(lambda r: (r.key, r))
        outputs = (
            {"records": keyed, "verdicts": verdicts}
            | "GroupByPairKey" >> beam.CoGroupByKey()
            | "Resolve" >> beam.ParDo(_ResolveVerdicts(self.rank)).with_outputs(REJECTED, main=SURVIVORS)
        )
        return {SURVIVORS: outputs[SURVIVORS], REJECTED: outputs[REJECTED]}
