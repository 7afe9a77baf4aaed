"""The stages that judge one record at a time: the record filters and the NSFW scorer.

Each is a composite that declares the stages it ``decides`` (names from
``filters.stages``) and returns ``{"survivors", "rejected", ...}``: the
routing style of every stage of the build (``pipeline.verdicts``).
``ApplyRecordFilters`` rejects whole records (``Rejection`` rows);
``ScorePornography`` sees ``(key, image bytes)`` and rejects keys
(``(key, reason)`` verdicts, applied by ``JoinVerdicts``).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from common.schema import Candidate
from filters import nsfw
from filters.record import counted_row, filter_record
from pipeline.stage_rows import LightRow, rejection
from pipeline.stats import METRICS_NAMESPACE

SURVIVORS, REJECTED, MEASURES = "survivors", "rejected", "measures"
COUNTED = "counted"  # rejected rows that stay in the corpus-wide counting pool


class _FilterRecord(beam.DoFn):
    def __init__(self, preset, extras=()):
        self.preset = preset
        self.extras = tuple(extras)

    def process(self, candidate: Candidate):
        result, reason, measures = filter_record(candidate, self.preset, self.extras)
        for name, value in measures.items():
            yield beam.pvalue.TaggedOutput(MEASURES, (name, value))
        if reason:
            Metrics.counter(METRICS_NAMESPACE, reason).inc()
            yield beam.pvalue.TaggedOutput(REJECTED, rejection(result, reason))
            counted = counted_row(candidate, reason, self.preset)
            if counted is not None:
                yield beam.pvalue.TaggedOutput(COUNTED, LightRow(*counted))
        else:
            yield result


class ApplyRecordFilters(beam.PTransform):
    """Candidates -> ``{"survivors", "rejected": Rejection, "measures": (name, value), "counted": LightRow}``.

    ``filters.record.filter_record`` per record, with the extra stages
    (``filters.extra_stages``) in their places; the measures feed the
    distributions in ``stats/``; ``counted`` are the rejected rows that stay
    in the corpus-wide counting pool (``filters.record.counted_row``).
    """

    BUILT_IN = (
        "image_header", "image_format", "image_size", "image_aspect",
        "text", "text_length", "text_repetition", "image_decode",
    )

    def __init__(self, preset, extras=()):
        super().__init__()
        self.preset = preset
        self.extras = tuple(extras)
        #: The built-in record stages, then the extra ones (``filters.extra_stages``).
        self.decides = self.BUILT_IN + tuple(extra.name for extra in self.extras)

    def expand(self, candidates):
        outputs = candidates | "FilterRecord" >> beam.ParDo(_FilterRecord(self.preset, self.extras)).with_outputs(
            REJECTED, MEASURES, COUNTED, main=SURVIVORS
        )
        return {tag: outputs[tag] for tag in (SURVIVORS, REJECTED, MEASURES, COUNTED)}


class ScorePornography(beam.PTransform):
    """``(key, image bytes)`` -> ``{"survivors": key, "rejected": (key, reason), "notes": ("nsfw", text)}``.

    Applied only when the preset enables the stage (``nsfw.stage_enabled``).
    Whether the scorer is installed is the workers' word: ``notes`` holds
    one note made from what they did (``nsfw.stage_note``; nothing if no
    record reached the stage), and ``unscored="fail"`` (the preset's
    ``nsfw_unscored``) fails the job on a worker without the scorer.
    """

    decides = ("nsfw",)

    def __init__(self, threshold: float, unscored: str = "pass", scorer_name: str = "nudenet"):
        super().__init__()
        self.threshold = threshold
        self.unscored = unscored
        self.scorer_name = scorer_name

    def expand(self, images):
        outputs = images | "Score" >> beam.ParDo(
            nsfw.ScoreNsfw(self.threshold, self.scorer_name, unscored=self.unscored)).with_outputs(
            nsfw.REJECTED_TAG, nsfw.STATUS_TAG, main=SURVIVORS
        )
        threshold, scorer_name = self.threshold, self.scorer_name
        notes = (
            outputs[nsfw.STATUS_TAG]
            | "RecordsPerOutcome" >> beam.CombinePerKey(sum)
            | "Outcomes" >> beam.combiners.ToDict()
            | "Note" >> beam.FlatMap(
                lambda outcomes: [("nsfw", nsfw.stage_note(threshold, scorer_name, outcomes))] if outcomes else [])
        )
        return {SURVIVORS: outputs[SURVIVORS], REJECTED: outputs[nsfw.REJECTED_TAG], "notes": notes}
