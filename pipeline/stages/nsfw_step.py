"""The NSFW step of the first pass (``--nsfw_accelerator``): RunInference on accelerator workers, then the verdicts.

    pending --RunInference(KeyedModelHandler(NsfwModelHandler)), on the accelerator--> (Pending, PredictionResult)
            --Batch--> --ApplyNsfwVerdicts--> {"rows", "measures", "pairs", "embeddings", "nsfw"[, "reuse"]}

What crosses, and why this order: ``pipeline.stages.nsfw_inference``.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference

from pipeline.funnel import progress
from pipeline.stages import judge as judge_lib
from pipeline.stages.light_rows import holding_rows
from pipeline.stages.nsfw_inference import NsfwModelHandler


class _ApplyVerdicts(beam.DoFn):
    """A batch of ``(Pending, PredictionResult)`` -> the rest of the first pass's outputs for their records."""

    def __init__(self, judge):
        self.judge = judge

    def setup(self):
        self.judge.setup(part="after")

    def process(self, batch):
        outputs = self.judge.judge_scored(batch) + self.judge.finish()
        progress.tally("judge", kept=sum(1 for tag, row in outputs if tag == judge_lib.ROWS and not row.reason))
        for tag, value in outputs:
            yield value if tag == judge_lib.ROWS else beam.pvalue.TaggedOutput(tag, value)
        for name, counts in self.judge.measures():
            yield beam.pvalue.TaggedOutput(judge_lib.MEASURES, (name, counts))
        for outcome, records in self.judge.nsfw_outcomes():
            yield beam.pvalue.TaggedOutput(judge_lib.NSFW_OUTCOMES, (outcome, records))
        if self.judge.previous is not None:
            for outcome, records in self.judge.reuse_outcomes():
                yield beam.pvalue.TaggedOutput(judge_lib.REUSE_OUTCOMES, (outcome, records))


class ScoreNsfw(beam.PTransform):
    """The judge's pending records -> ``{"rows", "measures", "pairs", "embeddings", "nsfw"[, "reuse"]}``."""

    def __init__(self, judge, accelerator: str):
        super().__init__()
        self.judge, self.accelerator = judge, accelerator

    def expand(self, pending):
        judge = self.judge
        previous = judge.previous.nsfw_scorers if judge.previous is not None else ()
        handler = KeyedModelHandler(NsfwModelHandler(judge.preset, judge.nsfw_factory, previous, large_model=True))
        tags = (judge_lib.MEASURES, judge_lib.PAIRS, judge_lib.EMBEDDINGS, judge_lib.NSFW_OUTCOMES) + (
            (judge_lib.REUSE_OUTCOMES,) if judge.previous is not None else ())
        outputs = (
            pending
            | "RunInference" >> RunInference(handler).with_resource_hints(accelerator=self.accelerator)
            | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=judge_lib.BATCH_SIZE)
            | "ApplyNsfwVerdicts" >> beam.ParDo(_ApplyVerdicts(judge)).with_outputs(*tags, main=judge_lib.ROWS)
        )
        return {judge_lib.ROWS: holding_rows(outputs[judge_lib.ROWS]), **{tag: outputs[tag] for tag in tags}}
