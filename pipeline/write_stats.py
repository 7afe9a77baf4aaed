"""``WriteStats``: the funnel, the distributions and the rejected samples into ``<output>/stats/``.

    stats/funnel.json             stage-ordered counts (``pipeline.stats.build_funnel``)
    stats/distributions.json      histograms of the record measures, and the corpus stages' stats
    stats/rejected_samples.jsonl  up to ``SAMPLES_PER_REASON`` rejections per reason, with thumbnails

The files are written once, by one worker, after every count is known
(side inputs of a single trigger element); the samples are chosen by a hash
of the key, so runs agree byte for byte.
"""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from filters import stages
from filters.image import thumbnail_b64
from pipeline import stats as stats_lib
from pipeline.readers.rows import Rejection


def sample_row(rejection: Rejection) -> dict:
    """A rejection as the audit shows it: reason, record fields, a thumbnail."""
    return {
        "reason": rejection.reason,
        "stage": stages.stage_of(rejection.reason),
        "key": rejection.key,
        "url": rejection.url,
        "alt_text": rejection.alt_text[:500],
        "width": rejection.width,
        "height": rejection.height,
        "format": rejection.format,
        "thumbnail": thumbnail_b64(rejection.image),
    }


def _write_stats_files(_, output_dir, input_count, rejected, written, histograms, extra, samples, meta, notes=None):
    # The stages' own notes, made on the workers (e.g. whether NSFW scored), win over the launcher's.
    notes = dict(meta["notes"], **(notes or {}))
    funnel = stats_lib.build_funnel(
        input_count, rejected, written, meta["ran"], notes, meta["dataset"], meta["preset"],
        meta["extras"],
    )
    stats_dir = FileSystems.join(output_dir, "stats")
    stats_lib.write_text(FileSystems.join(stats_dir, "funnel.json"), stats_lib.to_json(funnel))
    distributions = {}
    for name, hist in sorted(histograms.items()):
        distributions[name] = dict(hist, description=stats_lib.HISTOGRAM_DESCRIPTIONS.get(name, ""))
    distributions.update(sorted(extra.items()))
    stats_lib.write_text(FileSystems.join(stats_dir, "distributions.json"), stats_lib.to_json(distributions, sort_keys=True))
    position = {row["stage"]: i for i, row in enumerate(funnel["stages"])}  # extra stages included
    rows = sorted(samples, key=lambda row: (position[row["stage"]], row["reason"], row["rank"]))
    lines = "".join(json.dumps({k: v for k, v in row.items() if k != "rank"}) + "\n" for row in rows)
    stats_lib.write_text(FileSystems.join(stats_dir, "rejected_samples.jsonl"), lines)
    yield funnel


class WriteStats(beam.PTransform):
    """``(input count, rejections, written per split, histograms, extra stats[, stage notes])`` -> the funnel, once written.

    ``stage notes`` (optional) are ``(stage, text)`` made in the job; they
    replace the launcher's note of that stage.

    ``meta``: ``ran`` (the stage names that ran), ``notes`` ({stage: text}),
    ``dataset``, ``preset`` and ``extras`` (the extra stages), as
    ``build_funnel`` takes them.
    """

    def __init__(self, output_dir, meta):
        super().__init__()
        self.output_dir = output_dir
        self.meta = meta

    def expand(self, inputs):
        input_count, rejections, written_counts, histograms, extra = inputs[:5]
        notes = inputs[5] if len(inputs) > 5 else None
        reason_counts = rejections | "ReasonOnly" >> beam.Map(lambda r: r.reason) | "CountReasons" >> beam.combiners.Count.PerElement()
        samples = (
            rejections
            | "ByReason" >> beam.Map(lambda r: (r.reason, (stats_lib.sample_rank(r.key), r.key, r)))
            | "SamplePerReason" >> beam.combiners.Top.SmallestPerKey(stats_lib.SAMPLES_PER_REASON)
            | "SampleRows" >> beam.FlatMap(lambda kv: [dict(sample_row(r), rank=rank) for rank, _, r in kv[1]])
        )
        p = input_count.pipeline
        return (
            p
            | "StatsTrigger" >> beam.Create([None])
            | "WriteStatsFiles" >> beam.FlatMap(
                _write_stats_files,
                self.output_dir,
                beam.pvalue.AsSingleton(input_count),
                beam.pvalue.AsDict(reason_counts),
                beam.pvalue.AsDict(written_counts),
                beam.pvalue.AsDict(histograms),
                beam.pvalue.AsDict(extra),
                beam.pvalue.AsList(samples),
                self.meta,
                beam.pvalue.AsDict(notes) if notes is not None else None,
            )
        )
