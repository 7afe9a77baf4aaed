"""``WriteStats``: the funnel, the distributions and the rejected samples into ``<output>/stats/``.

    stats/funnel.json             stage-ordered counts (``pipeline.funnel.counts.build_funnel``)
    stats/distributions.json      histograms of the record measures, and the corpus stages' stats
    stats/rejected_samples.jsonl  up to ``SAMPLES_PER_REASON`` rejections per reason, with thumbnails
    stats/nsfw_gallery.jsonl      the highest NSFW scores kept and rejected, with thumbnails (``pipeline.write.nsfw_gallery``)

The files are written once, by one worker, after every count is known
(side inputs of a single trigger element). The samples are chosen by a hash
of the key (``ChooseSamples``), so runs agree byte for byte; their
thumbnails are made by the second pass, which reads their files anyway.
"""

from __future__ import annotations

import json
import math

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from common.files import to_json, write_text
from filters import stages
from filters.image import thumbnail_b64
from pipeline.funnel import counts as stats_lib
from pipeline.funnel.table import FUNNEL_FILE

#: Written by ``pipeline.write.nsfw_gallery`` when the NSFW stage runs; read by the audit.
NSFW_GALLERY_FILE = "nsfw_gallery.jsonl"


def sample_row(row, image=None, alt_text=None) -> dict:
    """A rejected light row (``pipeline.stages.light_rows.LightRow``) as the audit shows it: reason, record fields, a thumbnail of ``image`` (read again),
    and its scores (``scored``)."""
    return {
        **scored(row),
        "reason": row.reason,
        "stage": stages.stage_of(row.reason),
        "key": row.key,
        "url": row.url,
        "alt_text": (row.text if alt_text is None else alt_text)[:500],
        "width": row.width,
        "height": row.height,
        "format": row.format,
        "thumbnail": thumbnail_b64(image),
        "rank": stats_lib.sample_rank(row.key),
    }


def scored(row) -> dict:
    """The row's scores, rounded (a report, not a computation): ``"nsfw_score"`` where the NSFW stage scored its
    image, ``"model_score"`` (the cosine) where the pair model scored the pair; ``{}`` for neither."""
    scores = {"nsfw_score": row.nsfw_score, "model_score": row.model_score}
    return {name: round(float(score), 6) for name, score in scores.items() if math.isfinite(score)}


class ChooseSamples(beam.PTransform):
    """Rejected light rows -> up to ``SAMPLES_PER_REASON`` of each reason, the smallest by key hash."""

    def expand(self, rejections):
        return (
            rejections
            | "ByReason" >> beam.Map(lambda r: (r.reason, (stats_lib.sample_rank(r.key), r.key, r)))
            | "SamplePerReason" >> beam.combiners.Top.SmallestPerKey(stats_lib.SAMPLES_PER_REASON)
            | "SampledRows" >> beam.FlatMap(lambda kv: [row for _, _, row in kv[1]])
        )


def _write_stats_files(_, output_dir, input_count, rejected, written, histograms, extra, samples, meta, notes=None):
    # The stages' own notes, made on the workers (e.g. whether NSFW scored), win over the launcher's.
    notes = dict(meta["notes"], **(notes or {}))
    funnel = stats_lib.build_funnel(
        input_count, rejected, written, meta["ran"], notes, meta["dataset"], meta["preset"],
        meta["extras"],
    )
    stats_dir = FileSystems.join(output_dir, "stats")
    write_text(FileSystems.join(stats_dir, FUNNEL_FILE), to_json(funnel))
    distributions = {}
    for name, hist in sorted(histograms.items()):
        distributions[name] = dict(hist, description=stats_lib.HISTOGRAM_DESCRIPTIONS.get(name, ""))
    distributions.update(sorted(extra.items()))
    write_text(FileSystems.join(stats_dir, "distributions.json"), to_json(distributions, sort_keys=True))
    position = {row["stage"]: i for i, row in enumerate(funnel["stages"])}  # extra stages included
    rows = sorted(samples, key=lambda row: (position[row["stage"]], row["reason"], row["rank"], row["key"]))
    lines = "".join(json.dumps({k: v for k, v in row.items() if k != "rank"}) + "\n" for row in rows)
    write_text(FileSystems.join(stats_dir, "rejected_samples.jsonl"), lines)
    yield funnel


class WriteStats(beam.PTransform):
    """``(input count, rejections, written per split, histograms, extra stats, samples[, stage notes])`` -> the funnel, once written.

    ``samples`` are ``sample_row`` dicts (``ChooseSamples``, then the second pass).

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
        input_count, rejections, written_counts, histograms, extra, samples = inputs[:6]
        notes = inputs[6] if len(inputs) > 6 else None
        reason_counts = rejections | "ReasonOnly" >> beam.Map(lambda r: r.reason) | "CountReasons" >> beam.combiners.Count.PerElement()
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
