"""``WriteStats``: the funnel, the distributions and the rejected samples into ``<output>/stats/``.

    stats/funnel.json             stage-ordered counts (``pipeline.funnel.counts.build_funnel``)
    stats/distributions.json      histograms of the record measures, and the corpus stages' stats
    stats/rejected_samples.jsonl  up to ``SAMPLES_PER_REASON`` rejections per reason, with thumbnails
    stats/nsfw_gallery.jsonl      the highest NSFW scores kept and rejected, with thumbnails (``pipeline.write.nsfw_gallery``)

The schemas a reader checks these files against (``common.state_files``)
are here too, with those of the stats files other parts of the build write
(the near-duplicate pairs, ``concepts.json``) and that the audit reads.

The files are written once, by one worker, after every count is known
(side inputs of a single trigger element). The samples are chosen by a hash
of the key (``ChooseSamples``), so runs agree byte for byte; their
thumbnails are made by the second pass, which reads their files anyway.
"""

from __future__ import annotations

import json
import math
from typing import Dict, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from common import state_files as sf
from common.files import to_json, write_text
from common.optional_inputs import OptionalInputs
from filters import stages
from filters.image import thumbnail_b64
from pipeline.funnel import counts as stats_lib
from pipeline.funnel.accounting import losses_of, records_of
from pipeline.funnel.table import FUNNEL_FILE

DISTRIBUTIONS_FILE = "distributions.json"
SAMPLES_FILE = "rejected_samples.jsonl"
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


def _sum_losses(parts):
    return tuple(map(sum, zip((0, 0, 0), *parts)))


#: Files the funnel's note names, of those that state rows they do not hold (the largest claims first).
CLAIMS_NAMED = 3
_CLAIMED = stages.reason("read", "inconsistent_metadata")


def _claimed_rows(row):
    """``(file, rows)`` of a marker for rows its file states and does not hold (none for any other row)."""
    unread = losses_of(row)[0] if row.reason == _CLAIMED else 0
    if unread > 0:
        yield row.source or row.url.split("#", 1)[0], unread


class _LargestClaims(beam.CombineFn):
    """``(file, rows)`` per file -> ``(files, the CLAIMS_NAMED largest)``."""

    def create_accumulator(self):
        return 0, []

    def add_input(self, accumulator, claim):
        return self.merge_accumulators([accumulator, (1, [claim])])

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        largest = sorted((c for _, claims in accumulators for c in claims), key=lambda c: (-c[1], c[0]))
        return sum(files for files, _ in accumulators), largest[:CLAIMS_NAMED]

    def extract_output(self, accumulator):
        return accumulator


def claims_note(claims) -> str:
    """The read stage's note naming the files that state rows they do not hold ("" for none): the funnel's input
    counts what the files state, so one lying footer (2^40 rows) is the input's bulk, and this says whose it is."""
    files, largest = claims
    if not files:
        return ""
    named = ", ".join(f"{path} ({rows:,})" for path, rows in largest)
    more = f" and {files - len(largest):,} more" if files > len(largest) else ""
    return (f"{files:,} file(s) state rows they do not hold, counted in the input as "
            f"{_CLAIMED}: {named}{more}")


def _write_stats_files(_, output_dir, input_count, rejected, written, histograms, extra, samples, meta, notes=None,
                       losses=(0, 0, 0), claims=(0, [])):
    # The stages' own notes, made on the workers (e.g. whether NSFW scored), win over the launcher's.
    notes = dict(meta["notes"], **(notes or {}))
    claimed = claims_note(claims)
    reused = notes.pop("reuse", None)  # a rebuild's account of the facts it took from a previous build
    if claimed or reused:
        notes["read"] = "; ".join(filter(None, [notes.get("read"), claimed, reused]))
    funnel = stats_lib.build_funnel(
        input_count, {reason: n for reason, n in rejected.items() if n}, written, meta["ran"], notes,
        meta["dataset"], meta["preset"], meta["extras"], dict(zip(("unread", "unknown", "unstated"), losses)),
    )
    stats_dir = FileSystems.join(output_dir, "stats")
    write_text(FileSystems.join(stats_dir, FUNNEL_FILE), to_json(funnel))
    distributions = {}
    for name, hist in sorted(histograms.items()):
        distributions[name] = dict(hist, description=stats_lib.HISTOGRAM_DESCRIPTIONS.get(name, ""))
    distributions.update(sorted(extra.items()))
    write_text(FileSystems.join(stats_dir, DISTRIBUTIONS_FILE), to_json(distributions, sort_keys=True))
    position = {row["stage"]: i for i, row in enumerate(funnel["stages"])}  # extra stages included
    rows = sorted(samples, key=lambda row: (position[row["stage"]], row["reason"], row["rank"], row["key"]))
    lines = "".join(json.dumps({k: v for k, v in row.items() if k != "rank"}) + "\n" for row in rows)
    write_text(FileSystems.join(stats_dir, SAMPLES_FILE), lines)
    yield funnel


class WriteStats(OptionalInputs):
    """``(input count, rejections, written per split, histograms, extra stats, samples[, stage notes])`` -> the funnel, once written.

    ``samples`` are ``sample_row`` dicts (``ChooseSamples``, then the second pass).

    ``histograms``, ``extra stats`` and ``stage notes`` may be None (a job
    that measured nothing, e.g. a selection). ``stage notes`` are ``(stage,
    text)`` made in the job; they replace the launcher's note of that stage.

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
        # A reader's marker counts as the rows it stands for (pipeline.funnel.accounting).
        reason_counts = (rejections | "ReasonAndRecords" >> beam.Map(lambda r: (r.reason, records_of(r)))
                         | "CountReasons" >> beam.CombinePerKey(sum))
        # Each total is read as a singleton that says what nothing sums to: Beam's default for an empty input is
        # five more transforms per combine.
        losses = (rejections | "ReaderLosses" >> beam.Map(losses_of)
                  | "SumLosses" >> beam.CombineGlobally(_sum_losses).without_defaults())
        claims = (rejections | "ClaimedRows" >> beam.FlatMap(_claimed_rows)
                  | "ClaimedPerFile" >> beam.CombinePerKey(sum)
                  | "LargestClaims" >> beam.CombineGlobally(_LargestClaims()).without_defaults())
        p = input_count.pipeline
        return (
            p
            | "StatsTrigger" >> beam.Impulse()  # one element that starts the step (Create's is four transforms)
            | "WriteStatsFiles" >> beam.FlatMap(
                _write_stats_files,
                self.output_dir,
                beam.pvalue.AsSingleton(input_count, default_value=0),
                beam.pvalue.AsDict(reason_counts),
                beam.pvalue.AsDict(written_counts),
                beam.pvalue.AsDict(histograms) if histograms is not None else {},
                beam.pvalue.AsDict(extra) if extra is not None else {},
                beam.pvalue.AsList(samples),
                self.meta,
                beam.pvalue.AsDict(notes) if notes is not None else None,
                beam.pvalue.AsSingleton(losses, default_value=_sum_losses([])),
                beam.pvalue.AsSingleton(claims, default_value=_LargestClaims().apply([])),
            )
        )


# ---------------------------------------------------------------------------
# What a reader of these files relies on (common.state_files)
# ---------------------------------------------------------------------------

#: The most bins a histogram of the build has (the count of counts is a table, not bins).
MAX_BINS = 100_000


def _histogram(entry: dict, where: str) -> None:
    edges = sf.array(sf.field(entry, "edges", where), f"{where}.edges", MAX_BINS)
    counts = sf.array(sf.field(entry, "counts", where), f"{where}.counts", MAX_BINS)
    for i, edge in enumerate(edges):
        sf.number(edge, f"{where}.edges[{i}]")
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise sf.Problem(f"{where}.edges: not increasing")
    for i, count in enumerate(counts):
        sf.whole(count, f"{where}.counts[{i}]")
    if len(counts) not in (len(edges), len(edges) - 1):
        raise sf.Problem(f"{where}: {len(counts)} counts for {len(edges)} edges")
    sf.optional(entry, "log", sf.flag, where)
    sf.optional(entry, "cut", sf.number, where)
    for name in ("keep", "description", "model"):
        sf.optional(entry, name, sf.text, where)


def _count_of_counts(entry: dict, where: str) -> None:
    table = sf.mapping(entry.get("counts", {}), f"{where}.counts", sf.whole, MAX_BINS)
    for count in table:
        if not count.isdigit():
            raise sf.Problem(f"{where}.counts: key {count[:20]!r} is not a count")
    for name in ("cut_count", "vocab_size", "num_ngrams", "num_occurrences", "vocab_size_limit", "min_ngram_count"):
        sf.optional(entry, name, sf.whole, where)


def _model_score(entry: dict, where: str) -> None:
    _histogram(entry, where)
    for name in ("scored", "rejected_also_elsewhere"):
        sf.optional(entry, name, sf.whole, where)
    for name in ("threshold", "fraction_cut"):
        sf.optional(entry, name, sf.number, where)

    def other(row, at):
        sf.obj(row, at)
        for name in ("rejected", "also_cut_by_score"):
            sf.optional(row, name, sf.whole, at)
        for i, count in enumerate(sf.array(row.get("counts", []), f"{at}.counts", MAX_BINS)):
            sf.whole(count, f"{at}.counts[{i}]")

    sf.optional(entry, "other_stages", lambda value, at: sf.mapping(value, at, other))


def distribution_schema(name: str, entry) -> None:
    """One entry of ``distributions.json``; ``Problem`` where a reader could not draw it.

    Checked one by one: a damaged entry is left out of the report (which
    says so), the others are shown.
    """
    sf.obj(entry, name)
    if name == "count_of_counts":
        _count_of_counts(entry, name)
    elif name == "model_score":
        _model_score(entry, name)
    elif "edges" in entry or "counts" in entry:
        _histogram(entry, name)


def distributions_schema(doc) -> Tuple[dict, Dict[str, str]]:
    """``(the entries that pass, {name: what is wrong})`` of a parsed ``distributions.json``."""
    good, damaged = {}, {}
    for name, entry in sf.obj(doc).items():
        try:
            distribution_schema(name, entry)
        except sf.Problem as problem:
            damaged[name] = str(problem)
            continue
        good[name] = entry
    return good, damaged


def sample_schema(row: dict, where: str) -> None:
    """One line of ``rejected_samples.jsonl`` (``sample_row``)."""
    sf.text(sf.field(row, "reason", where), f"{where}.reason")
    for name in ("stage", "key", "url", "alt_text", "format", "thumbnail"):
        sf.optional(row, name, sf.text, where)
    for name in ("width", "height"):
        sf.optional(row, name, sf.whole, where)
    sf.optional(row, "model_score", lambda v, w: sf.number(v, w, -1.01, 1.01), where)
    sf.optional(row, "nsfw_score", lambda v, w: sf.number(v, w, 0.0, 1.0), where)


def gallery_schema(row: dict, where: str) -> None:
    """One line of ``nsfw_gallery.jsonl`` (``pipeline.write.nsfw_gallery.entry``)."""
    sf.text(sf.field(row, "side", where), f"{where}.side")
    sf.number(sf.field(row, "nsfw_score", where), f"{where}.nsfw_score", 0.0, 1.0)
    for name in ("reason", "key", "url", "alt_text", "format", "sha256", "thumbnail"):
        sf.optional(row, name, sf.text, where)
    for name in ("width", "height"):
        sf.optional(row, name, sf.whole, where)


def pair_schema(row: dict, where: str) -> None:
    """One line of a near-duplicate pairs file (``pipeline.stages.near_duplicates.WritePairsReport``)."""
    for name in ("key", "index_set", "index_key"):
        sf.text(sf.field(row, name, where), f"{where}.{name}")
    sf.number(sf.field(row, "cosine", where), f"{where}.cosine", -1.01, 1.01)
    for name in ("variant", "thumbnail", "index_thumbnail"):
        sf.optional(row, name, sf.text, where)


def concepts_schema(doc) -> dict:
    """``stats/concepts.json`` (``pipeline.write.concept_tags.WriteConceptStats``), as the console and the audit read it."""
    sf.obj(doc)
    for name in ("ontology", "root", "evidence"):
        sf.optional(doc, name, sf.text)
    for i, name in enumerate(sf.array(sf.field(doc, "classes"), "classes", max_len=1_000_000)):
        sf.text(name, f"classes[{i}]")

    def split(entry, where):
        sf.obj(entry, where)
        for name in ("pairs", "tagged"):
            sf.whole(sf.field(entry, name, where), f"{where}.{name}")
        sf.mapping(sf.field(entry, "per_class", where), f"{where}.per_class", sf.whole)

    sf.mapping(sf.field(doc, "splits"), "splits", split)
    return doc
