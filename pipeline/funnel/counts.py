"""Filter statistics: the funnel, distributions and the rejected-record sample.

Everything here is computed inside the pipeline (runner independent: Dataflow,
the local runner and a Dask cluster give the same files) and mirrored as Beam
Metrics counters with the same names, which is what a Dataflow user sees in
the console.

Metrics namespaces: ``funnel`` counts each input record once: ``input``,
one counter per rejection reason (first reason only) and ``written/<split>``,
so ``input == sum(reasons) + sum(written)`` holds for the counters too. The
stages keep their own namespaces for internal work (``filters``: per-key
frequency verdicts and distributions; ``dedup``: embedded images, candidate
pairs; ``nsfw``: images scored); those are not per record and are not summed
into the funnel.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional

import apache_beam as beam

from common.schema import key_fraction
from filters import stages

METRICS_NAMESPACE = "funnel"

# Histogram edges per measure; the last bin also holds everything above it.
HISTOGRAM_EDGES = {
    "shorter_side": [0, 50, 100, 150, 200, 201, 250, 300, 400, 401, 500, 750, 1000, 2000, 5000],
    "aspect_ratio": [1.0, 1.25, 1.5, 2.0, 2.5, 2.75, 3.0, 4.0, 6.0, 10.0],
    "words_per_text": [0, 1, 2, 3, 5, 10, 15, 20, 21, 30, 50, 100, 257],
    # Fine where photographs without pornography score (open_nsfw: mostly below 0.1), an edge at each cut a
    # user is likely to try (Yahoo's 0.2 and 0.8, COYO-700M's 0.5).
    "nsfw_score": [0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99],
}
#: The histogram of the NSFW scorer's scores (``pipeline.stages.judge`` counts each record it scored).
NSFW_MEASURE = "nsfw_score"
HISTOGRAM_DESCRIPTIONS = {
    "shorter_side": "shorter image side in pixels (after EXIF orientation), images whose header parsed",
    "aspect_ratio": "longer/shorter side, images whose header parsed",
    "words_per_text": "unigrams per normalised alt-text, records that reached the text rules",
    "nsfw_score": "pornographic-content score (the preset's nsfw_model) of each record the NSFW stage scored",
}
SAMPLES_PER_REASON = 20


def _sum_counts(partials):
    total = None
    for counts in partials:
        total = list(counts) if total is None else [a + b for a, b in zip(total, counts)]
    return total


class SumHistograms(beam.PTransform):
    """``(measure name, partial counts over HISTOGRAM_EDGES[name])`` -> ``(measure name, histogram dict)``.

    The first pass counts each file's (or batch's) values into the edges
    where it reads them; only the partial counts travel.
    """

    def expand(self, partials):
        return (
            partials
            | "SumPartials" >> beam.CombinePerKey(_sum_counts)
            | "Histogram" >> beam.MapTuple(lambda name, counts: (name, {"edges": HISTOGRAM_EDGES[name], "counts": counts}))
        )


def build_funnel(
    input_count: int,
    rejected: Dict[str, int],
    written: Dict[str, int],
    ran: Iterable[str],
    notes: Optional[Dict[str, str]] = None,
    dataset: str = "",
    preset=None,
    extra_stages=(),
) -> dict:
    """Stage-ordered funnel; ``conserved`` is the law in == written + rejected.

    ``extra_stages`` (``filters.extra_stages.RecordStage``) are listed after
    the stage they follow, marked ``"extra"`` with where they came from.
    """
    from filters import extra_stages as extras_lib

    ran = set(ran)
    notes = notes or {}
    stage_list = extras_lib.stage_list(extra_stages)
    names = {name for name, _ in stage_list}
    sources = {e.name: e.source or e.name for e in extra_stages}
    unknown = sorted(r for r in rejected if stages.stage_of(r) not in names)
    if unknown:
        raise ValueError(f"reasons outside the stage list: {unknown}")
    remaining = input_count
    rows = []
    for name, description in stage_list:
        reasons = {r: c for r, c in sorted(rejected.items()) if stages.stage_of(r) == name}
        if name in stages.OPTIONAL_STAGES and name not in ran and not reasons:
            continue
        out = remaining - sum(reasons.values())
        row = {
            "stage": name,
            "description": description,
            "ran": name in ran or bool(reasons),
            "in": remaining,
            "rejected": reasons,
            "out": out,
        }
        if name in sources:
            row["extra"] = sources[name]
        if name in notes:
            row["note"] = notes[name]
        rows.append(row)
        remaining = out
    rejected_total = sum(rejected.values())
    return {
        "dataset": dataset,
        "preset_name": getattr(preset, "name", ""),
        "preset": preset.as_dict() if preset is not None else {},
        # What was set on top of the named preset (--set), so the funnel says
        # "align with ...", not "align".
        "preset_overrides": dict(getattr(preset, "overrides", ())),
        "input": input_count,
        "stages": rows,
        "written": dict(sorted(written.items())),
        "rejected_total": rejected_total,
        "conserved": input_count == sum(written.values()) + rejected_total,
    }


def sample_rank(key: str) -> float:
    """Deterministic order for choosing the rejected sample of each reason."""
    return key_fraction(key, salt="audit-sample")
