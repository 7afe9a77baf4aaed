"""The model-score stage on light rows: its corpus-wide cut, its verdicts, and what the audit shows of the scores.

    rows still in the running, each with its model_score from the first pass
      --ModelScoreVerdicts--> (key, "model_score/<detail>") verdicts, the cut, the scores' histogram
    the cut, the histogram, every rejection, JoinVerdicts' overlaps
      --ScoreStats--> ("model_score", distribution) for stats/distributions.json, ("model_score", note) for the funnel

The first pass (``pipeline.stages.judge``) scores every pair the per-record rules
and NSFW kept (``filters.model_score``) and records the cosine in its light
row; this stage decides on those rows (``filters.score_cut``: the absolute
threshold, and the top fraction found digit by digit from merged histograms
of at most 2^16 counts, never a list of pairs). Its verdicts are key
verdicts, applied with the others by ``pipeline.stages.verdicts.JoinVerdicts``.

What the audit gets: the histogram of every scored pair with both cuts,
and, for each other stage, the scores of the pairs it rejected and how many
of them the score's cut also rejects (what the score alone would have
caught: the keys more than one stage rejected, ``JoinVerdicts``'
``overlaps``). Pairs a per-record rule rejected were never scored.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import apache_beam as beam

from common.histogram import HistogramFn, bin_index
from filters import stages
from filters.score_cut import DIGITS, Cut, choose_digit, cut_values, digit, order_key, score_of, start

STAGE = "model_score"
#: Histogram edges of the scores (cosines): bins of 0.05, the last from 0.95 up.
SCORE_EDGES = [round(-1.0 + 0.05 * i, 2) for i in range(40)]
DESCRIPTION = "image-text cosine of each pair that reached model_score, under the --model_score model"


class SparseCountFn(beam.CombineFn):
    """Values -> ``{value: count}``; a digit histogram has at most 2^16 entries, whatever the corpus."""

    def create_accumulator(self):
        return {}

    def add_input(self, counts, value):
        counts[value] = counts.get(value, 0) + 1
        return counts

    def merge_accumulators(self, accumulators):
        merged: Dict[int, int] = {}
        for counts in accumulators:
            for value, count in counts.items():
                merged[value] = merged.get(value, 0) + count
        return merged

    def extract_output(self, counts):
        return counts


def _next_digit(order: int, search):
    if search.wants(order):
        yield digit(order, search.level)


class TopFractionCut(beam.PTransform):
    """Order keys (``filters.score_cut.order_key``) -> the one order key the fraction keeps from (a singleton)."""

    def __init__(self, fraction: float):
        super().__init__()
        self.fraction = fraction

    def expand(self, orders):
        fraction = self.fraction
        search = (orders | "CountScored" >> beam.combiners.Count.Globally()
                  | "Start" >> beam.Map(lambda scored: start(scored, fraction)))
        for level in range(DIGITS):
            counts = (orders | f"Digit{level}" >> beam.FlatMap(_next_digit, beam.pvalue.AsSingleton(search))
                      | f"CountDigit{level}" >> beam.CombineGlobally(SparseCountFn()))
            search = search | f"Choose{level}" >> beam.Map(choose_digit, beam.pvalue.AsSingleton(counts))
        return search | "OrderCut" >> beam.Map(lambda found: found.cut)


def _verdict(row, cut: Cut):
    reason = cut.reason(row.model_score, row.key)
    if reason:
        yield row.key, reason


class ModelScoreVerdicts(beam.PTransform):
    """Rows still in the running -> ``{"rejected": (key, reason), "cut": Cut, "histogram": scores' histogram}``."""

    decides = (STAGE,)

    def __init__(self, preset):
        super().__init__()
        self.threshold, self.fraction = cut_values(preset)

    def expand(self, rows):
        threshold = self.threshold
        if self.fraction is None:
            cut = rows.pipeline | "ThresholdOnly" >> beam.Create([Cut(threshold)])
        else:
            cut = (rows
                   | "OrderKeys" >> beam.Map(lambda row: order_key(row.model_score, row.key))
                   | "TopFractionCut" >> TopFractionCut(self.fraction)
                   | "Cut" >> beam.Map(lambda order: Cut(threshold, order)))
        verdicts = rows | "Verdicts" >> beam.FlatMap(_verdict, beam.pvalue.AsSingleton(cut))
        histogram = (rows
                     | "Scores" >> beam.Map(lambda row: row.model_score)
                     | "ScoreHistogram" >> beam.CombineGlobally(HistogramFn(SCORE_EDGES)))
        return {"rejected": verdicts, "cut": cut, "histogram": histogram}


# ---------------------------------------------------------------------------
# What the audit shows
# ---------------------------------------------------------------------------


class StageScoresFn(beam.CombineFn):
    """``(score, the score's cut rejects it too)`` of one stage's rejected pairs -> their histogram and counts."""

    def create_accumulator(self):
        return [0] * len(SCORE_EDGES), 0, 0

    def add_input(self, acc, value):
        counts, rejected, below = acc
        score, cut_too = value
        counts[bin_index(SCORE_EDGES, score)] += 1
        return counts, rejected + 1, below + int(cut_too)

    def merge_accumulators(self, accumulators):
        merged = self.create_accumulator()
        for counts, rejected, below in accumulators:
            merged = [a + b for a, b in zip(merged[0], counts)], merged[1] + rejected, merged[2] + below
        return merged

    def extract_output(self, acc):
        counts, rejected, below = acc
        return {"counts": list(counts), "rejected": rejected, "also_cut_by_score": below}


def _rejected_scores(row):
    """A rejected row of another stage that was scored: ``(stage, (score, False))`` (its first reason is not the score's)."""
    stage = stages.stage_of(row.reason)
    if stage != STAGE and math.isfinite(row.model_score):
        yield stage, (row.model_score, False)


def _overlap_scores(overlap):
    """A key several stages rejected: each later stage's ``(stage, (score, the score rejected it first))``."""
    first, others, score, times = overlap
    cut_first = stages.stage_of(first) == STAGE
    if not math.isfinite(score):
        return
    for other in others:
        stage = stages.stage_of(other)
        if stage != STAGE:
            for _ in range(times):
                yield stage, (score, cut_first)


def _also_elsewhere(overlap):
    first, others, _, times = overlap
    if stages.stage_of(first) == STAGE and any(stages.stage_of(o) != STAGE for o in others):
        yield times


def distribution(cut: Cut, histogram: dict, per_stage: dict, also_elsewhere: int, model: str) -> dict:
    """The ``model_score`` entry of ``stats/distributions.json``."""
    lowest = cut.lowest_kept()
    entry = dict(histogram, description=DESCRIPTION, model=model, scored=sum(histogram["counts"]),
                 threshold=cut.threshold, fraction_cut=score_of(cut.order) if cut.order else None,
                 other_stages={stage: per_stage[stage] for stage in sorted(per_stage)},
                 rejected_also_elsewhere=also_elsewhere)
    if lowest is not None:
        entry.update(cut=lowest, keep=">=")
    return entry


def note(entry: dict, fraction: Optional[float]) -> str:
    """The funnel's line about the stage: the model, the cuts, how many pairs it scored."""
    cuts = []
    if entry["threshold"] is not None:
        cuts.append(f"cosine >= {entry['threshold']:g}")
    if fraction is not None:
        cut = entry["fraction_cut"]
        cuts.append(f"the top {fraction:.4g} of the scored pairs"
                    + (f" (cosine >= {cut:.4f})" if cut is not None and 0 < fraction < 1 else ""))
    kept = "kept " + " and ".join(cuts) if cuts else "no cut (model_score_threshold and model_score_top_fraction off)"
    return f"scored by {entry['model']}, {entry['scored']:,} pairs; {kept}"


class ScoreStats(beam.PTransform):
    """``(cut, histogram, every rejection, JoinVerdicts' overlaps)`` -> ``{"distribution", "note"}``, each one ``("model_score", value)``."""

    def __init__(self, model: str, preset):
        super().__init__()
        self.model = model
        self.fraction = cut_values(preset)[1]

    def expand(self, inputs):
        cut, histogram, rejections, overlaps = inputs
        per_stage = (
            (rejections | "RejectedScores" >> beam.FlatMap(_rejected_scores),
             overlaps | "OverlapScores" >> beam.FlatMap(_overlap_scores))
            | "ScoresOfOtherStages" >> beam.Flatten()
            | "PerStage" >> beam.CombinePerKey(StageScoresFn())
        )
        also = overlaps | "AlsoElsewhere" >> beam.FlatMap(_also_elsewhere) | "SumAlso" >> beam.CombineGlobally(sum)
        model, fraction = self.model, self.fraction
        entry = (
            cut.pipeline
            | "Trigger" >> beam.Create([None])
            | "Distribution" >> beam.Map(
                lambda _, c, h, s, a: distribution(c, h, s, a, model), beam.pvalue.AsSingleton(cut),
                beam.pvalue.AsSingleton(histogram), beam.pvalue.AsDict(per_stage), beam.pvalue.AsSingleton(also))
        )
        return {
            "distribution": entry | "Named" >> beam.Map(lambda e: (STAGE, e)),
            "note": entry | "Note" >> beam.Map(lambda e: (STAGE, note(e, fraction))),
        }
