"""Each downloaded image's facts joined back to every row that named its URL, and each row judged.

    (url, UrlRow) + (url, ImageFactsRow) --JoinDecisions--> (UrlRow, facts) --_JudgeRows--> LightRow per row

The join is ``common.hot_keys.JoinDecisions``: a URL on more rows than
its ``max_rows`` (a placeholder image on every page of a site) gets its
facts by side input, so no step holds one URL's rows in one list. Each row
then meets the row part of the per-record rules (``filters.record.judge_row``)
with its image's facts, and the image's NSFW verdict, embedding and
evaluation match apply to it where the row passes every per-record rule,
as in the file path (``pipeline.stages.judge``), and so does the pair
model's score (``--model_score``). The light row is the one a
record read from a file gets: from a staging file (reader ``staging``, its
path and ordinal), with the URL-list row's carried columns plus the HTTP
status and final URL (``LightRow.carried``). A failed download is the
row's ``download/<reason>`` rejection, with the status and final URL in
its ledger line.

An extra per-record stage sees the image bytes: they are read back from
the staging file by offset, only for a row that reaches such a stage.

Outputs as ``pipeline.stages.judge``'s: ``rows`` plus ``measures``, ``pairs``,
``embeddings`` and ``nsfw`` (outcomes counted per row that reached the stage).
"""

from __future__ import annotations

import collections
import json
import math

import apache_beam as beam
from apache_beam.metrics import Metrics

from common.hot_keys import JoinDecisions
from filters.record import judge_row
from pipeline.download import staging
from pipeline.download.image_facts import UrlRow, candidate_of, embedding_of, image_facts
from pipeline.funnel.counts import METRICS_NAMESPACE, NSFW_MEASURE
from pipeline.readers.rows import Rejection
from pipeline.stages import judge as judge_lib
from pipeline.stages.judge import EMBEDDINGS, MEASURES, NSFW_OUTCOMES, PAIRS, ROWS, Histograms
from pipeline.stages.light_rows import holding_rows

#: Rows judged together (one histogram per batch).
BATCH_SIZE = 256


def row_outputs(row: UrlRow, facts, preset, extras=(), max_record_bytes=None):
    """One URL-list row with its image's facts -> ``[(tag, value)]`` as the first pass gives a record (pure).

    A ``ROWS`` light row always; ``EMBEDDINGS``/``PAIRS`` values where the
    row passes; ``("measures", {...})`` (the NSFW score among them, where the
    row reached the stage) and ``("nsfw", (scored, status))`` for the caller to add up.
    """
    if facts is None:  # every distinct URL has facts: a missing one was lost by the runner
        raise RuntimeError(f"no download outcome reached the rows of {row.url!r}")
    if facts.reason:
        detail = (("http_status", facts.http_status), ("final_url", facts.final_url))
        return [(ROWS, judge_lib.rejection_row(Rejection(row.key, facts.reason, row.url, row.alt_text, detail=detail)))]
    carried = (("http_status", str(facts.http_status)), ("final_url", facts.final_url))
    candidate = candidate_of(row, carried, origin=(staging.READER, facts.source, facts.ordinal))
    judgement = judge_row(candidate, image_facts(facts, max_record_bytes), preset, extras)
    light = judge_lib.judged_row(judgement, staging.READER, facts.source, facts.ordinal)
    outputs = [(MEASURES, judgement.measures)]
    if judgement.reason is None:
        if facts.nsfw_status:
            outputs.append((NSFW_OUTCOMES, (facts.nsfw_scored, facts.nsfw_status)))
        if math.isfinite(facts.nsfw_score):
            outputs.append((MEASURES, {NSFW_MEASURE: facts.nsfw_score}))
            light = light._replace(nsfw_score=facts.nsfw_score)
        if facts.nsfw_reason:
            light = light._replace(reason=facts.nsfw_reason, counted=preset.counting_base == "raw")
        else:
            if facts.embedding:
                outputs.append((EMBEDDINGS, (row.key, embedding_of(facts))))
            if facts.eval_match:
                light = light._replace(eval_match=facts.eval_match)
                outputs += [(PAIRS, dict(pair, key=row.key)) for pair in json.loads(facts.pairs or "[]")]
    return outputs + [(ROWS, light)]


class _JudgeRows(beam.DoFn):
    """A batch of ``(UrlRow, facts)`` -> light rows; the batch's histograms and NSFW outcomes.

    With a pair model (``scorer``), the rows that pass every per-record rule
    and NSFW are scored together at the end of the batch, each image read
    back from its staging file (the score depends on the row's alt-text,
    so it is the row's, not the image's)."""

    def __init__(self, preset, extras=(), max_record_bytes=None, scorer=None):
        self.preset = preset
        self.extras = tuple(extras)
        self.max_record_bytes = max_record_bytes
        self.scorer = scorer
        self.eval_rejected = Metrics.counter("dedup", "near_duplicate_eval/rejected")

    def setup(self):
        if self.scorer is not None:
            self.scorer.check()  # this process's copy of the model (filters.model_score)

    def process(self, batch):
        histograms, outcomes = Histograms(), collections.Counter()
        waiting = []  # (light row, facts): kept rows for the pair model
        for row, facts in batch:
            for tag, value in row_outputs(row, facts, self.preset, self.extras, self.max_record_bytes):
                if tag == MEASURES:
                    histograms.add(value)
                elif tag == NSFW_OUTCOMES:
                    outcomes[value] += 1
                elif tag == ROWS:
                    if self.scorer is not None and not value.reason and not facts.reason:
                        waiting.append((value, facts))
                    else:
                        yield from self._row(value)
                else:
                    yield beam.pvalue.TaggedOutput(tag, value)
        if waiting:
            staged = [(light, image_facts(facts, self.max_record_bytes).read(), light.text)
                      for light, facts in waiting]
            for light in judge_lib.scored_rows(self.scorer, staged, self.preset):
                yield from self._row(light)
        for name, counts in histograms.take():
            yield beam.pvalue.TaggedOutput(MEASURES, (name, counts))
        for outcome, records in sorted(outcomes.items()):
            yield beam.pvalue.TaggedOutput(NSFW_OUTCOMES, (outcome, records))

    def _row(self, light):
        if light.reason:
            Metrics.counter(METRICS_NAMESPACE, light.reason).inc()
        if light.eval_match:
            self.eval_rejected.inc()
        yield light


class JudgeRows(beam.PTransform):
    """``{"rows": UrlRow, "facts": ImageFactsRow}`` -> ``{"rows": LightRow, "measures", "pairs", "embeddings", "nsfw"}``."""

    TAGS = (MEASURES, PAIRS, EMBEDDINGS, NSFW_OUTCOMES)

    def __init__(self, preset, extras=(), max_record_bytes=None, scorer=None):
        super().__init__()
        self.preset = preset
        self.extras = tuple(extras)
        self.max_record_bytes = max_record_bytes
        self.scorer = scorer  # filters.model_score.PairScorer, or None: no model-score stage

    def expand(self, inputs):
        judged = (
            {
                "rows": inputs["rows"] | "RowsByUrl" >> beam.Map(lambda row: (row.url, row)),
                "decisions": inputs["facts"] | "FactsByUrl" >> beam.Map(lambda facts: (facts.url, facts)),
            }
            | "FactsToRows" >> JoinDecisions(combine=_one, label="download_facts")
            | "Batch" >> beam.BatchElements(min_batch_size=BATCH_SIZE, max_batch_size=BATCH_SIZE)
            | "Judge" >> beam.ParDo(_JudgeRows(self.preset, self.extras, self.max_record_bytes, self.scorer))
            .with_outputs(*self.TAGS, main=ROWS)
        )
        return {ROWS: holding_rows(judged[ROWS]), **{tag: judged[tag] for tag in self.TAGS}}


def _one(facts):
    """The facts of one URL (one per distinct URL; ``min`` makes a duplicate harmless and the choice stable)."""
    return min(facts)


def outcome_counts(facts):
    """``("fetched" | "reused" | "failed", 1)`` of one distinct URL, for the download stage's note."""
    if facts.reason:
        return ("failed" if facts.fetched else "reused_failure"), 1
    return ("fetched" if facts.fetched else "reused"), 1


def download_note(settings: str, counts: dict) -> str:
    """The funnel's note on the download stage: its settings, then what happened to the distinct URLs."""
    urls = sum(counts.values())
    reused = counts.get("reused", 0) + counts.get("reused_failure", 0)
    return (f"{settings}; {urls:,} distinct URLs: {counts.get('fetched', 0):,} fetched, {counts.get('failed', 0):,} "
            f"failed, {reused:,} reused from earlier builds' staging files "
            f"({counts.get('reused_failure', 0):,} of them failures that are the URL's own answer)")


class DownloadNote(beam.PTransform):
    """Every distinct URL's facts -> one ``("download", note)`` for the funnel."""

    def __init__(self, settings: str):
        super().__init__()
        self.settings = settings

    def expand(self, facts):
        settings = self.settings
        return (
            facts
            | "Outcome" >> beam.Map(outcome_counts)
            | "UrlsPerOutcome" >> beam.CombinePerKey(sum)
            | "Outcomes" >> beam.combiners.ToDict()
            | "Note" >> beam.Map(lambda counts: ("download", download_note(settings, counts)))
        )
