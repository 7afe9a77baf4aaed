"""Build a filtered alt-text corpus: candidates in, TFDS-compatible shards out.

    python -m pipeline.build --input 'data/sample/candidates/*.parquet' \\
        --output out/corpus --preset align [--set NAME=VALUE ...] \\
        [--eval-images NAME=PATH ...] [--runner DataflowRunner ...]

The job reads like its data flow:

    ReadCandidates -> ApplyRecordFilters -> ScorePornography
      -> ApplyCorpusFilters -> RemoveNearDuplicates -> JoinVerdicts
      -> WriteShards, WriteStats

Per-record stages decide on one record; corpus stages (frequency filters,
near-duplicates) see only light rows (key, hashes, text, embedding) and
return verdicts; image bytes travel through exactly one shuffle, the final
``JoinVerdicts``. Every input record ends either in a shard or in the funnel
with its first reason (``filters/stages.py``). Evaluation images are embedded
in the launcher and written to ``<output>/near_duplicates/index/``, where the
workers read them: the job graph carries their path, not their vectors.

Without ``--runner`` the job runs on Beam's FnApiRunner in this process
(add ``--direct_running_mode=multi_processing --direct_num_workers=N`` for
several worker processes); the plain DirectRunner is never chosen because
Beam 2.77 first tries to download a Prism binary.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

from filters import stages
from filters.presets import PresetError, format_preset, get_preset
from filters.record import counted_row, filter_record
from filters.image import thumbnail_b64
from pipeline import near_duplicates as near_dup
from pipeline import stats as stats_lib
from pipeline import write as write_lib
from pipeline.read import ReadCandidates, Rejection
from pipeline.readers.input_notes import input_notes
from pipeline.readers.rows import Columns, make_columns
from pipeline.schema import Candidate

LOCAL_RUNNER = "FnApiRunner"
NS = stats_lib.METRICS_NAMESPACE


class BuildOptions(PipelineOptions):
    """The project's flags; everything else goes to Beam (runner, project, ...)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--input", help="glob of input files or directories (local or gs://); see README 'Input formats'")
        parser.add_argument(
            "--input_format", "--input-format", dest="input_format", default=None,
            help="read every data file as this format instead of by its name: parquet, webdataset, tsv, jsonl, tfrecord",
        )
        parser.add_argument("--url_col", "--url-col", dest="url_col", default="", help="input column/field of the URL (default: url)")
        parser.add_argument(
            "--caption_col", "--caption-col", dest="caption_col", default="",
            help="input column/field of the alt-text (default: first of caption, alt_text, text, texts)",
        )
        parser.add_argument(
            "--image_col", "--image-col", dest="image_col", default="",
            help="input column/field of the image bytes (default: first of jpg, image, png, webp, jpeg)",
        )
        parser.add_argument(
            "--carry_columns", "--carry-columns", dest="carry_columns", default="",
            help="comma-separated input columns written to the shards as source_<column> (key and sha256 always are)",
        )
        parser.add_argument(
            "--tsv_columns", "--tsv-columns", dest="tsv_columns", default="",
            help="column names of a headerless TSV, in order (default url,caption as CC12M; CC3M is caption,url)",
        )
        parser.add_argument(
            "--layout", default="flat", choices=("flat", "tfds"),
            help="flat: the corpus in --output; tfds: in --output/NAME/VERSION/, so tfds.builder(NAME, data_dir=OUTPUT) loads it",
        )
        parser.add_argument("--version", default="1.0.0", help="dataset version (the VERSION directory of --layout tfds)")
        parser.add_argument("--output", help="output directory (local or gs://)")
        parser.add_argument("--preset", default="align", help="filter preset: align or cc12m")
        parser.add_argument("--set", dest="overrides", action="append", default=[], help="NAME=VALUE preset override (repeatable)")
        parser.add_argument("--name", default="alt_text_corpus", help="dataset name used in shard file names")
        parser.add_argument(
            "--eval-images", "--eval_images", dest="eval_images", action="append", default=[],
            help="NAME=PATH evaluation image set to decontaminate against (repeatable)",
        )
        parser.add_argument("--embedder", default="dct", help="image embedder for near-duplicate search")
        parser.add_argument("--overwrite", action="store_true", help="replace an existing output directory")


# ---------------------------------------------------------------------------
# Per-record stages
# ---------------------------------------------------------------------------


def _rejection(candidate: Candidate, reason: str) -> Rejection:
    return Rejection(
        candidate.key, reason, candidate.url, candidate.alt_text,
        candidate.width, candidate.height, candidate.format, candidate.image,
    )


class _FilterRecord(beam.DoFn):
    REJECTED = "rejected"
    MEASURES = "measures"
    COUNTED = "counted"  # rejected rows that stay in the corpus-wide counting pool

    def __init__(self, preset):
        self.preset = preset

    def process(self, candidate: Candidate):
        result, reason, measures = filter_record(candidate, self.preset)
        for name, value in measures.items():
            yield beam.pvalue.TaggedOutput(self.MEASURES, (name, value))
        if reason:
            Metrics.counter(NS, reason).inc()
            yield beam.pvalue.TaggedOutput(self.REJECTED, _rejection(result, reason))
            counted = counted_row(candidate, reason, self.preset)
            if counted is not None:
                yield beam.pvalue.TaggedOutput(self.COUNTED, counted)
        else:
            yield result


class ApplyRecordFilters(beam.PTransform):
    """Candidates -> survivors, plus tagged ``rejected`` and ``measures``."""

    def __init__(self, preset):
        super().__init__()
        self.preset = preset

    def expand(self, candidates):
        return candidates | "FilterRecord" >> beam.ParDo(_FilterRecord(self.preset)).with_outputs(
            _FilterRecord.REJECTED, _FilterRecord.MEASURES, _FilterRecord.COUNTED, main="survivors"
        )


# ---------------------------------------------------------------------------
# The final join: records meet their verdicts
# ---------------------------------------------------------------------------


def resolve_group(key: str, records: List[Candidate], verdicts: List[str]):
    """One key's records and corpus verdicts -> what to write and what to reject.

    A verdict (the first corpus stage that rejected the key) applies to every
    record with the key. Otherwise exactly one record is written; repeats of
    the same (url, alt-text) pair are ``duplicate_pair/repeat``. The kept one
    is chosen by content, not arrival order, so runs agree.
    """
    ordered = sorted(records, key=lambda r: (r.sha256, r.image))
    if verdicts:
        first = min(verdicts, key=lambda r: stages.STAGE_INDEX[stages.stage_of(r)])
        return [], [(r, first) for r in ordered]
    repeat = stages.reason("duplicate_pair", "repeat")
    return ordered[:1], [(r, repeat) for r in ordered[1:]]


class _ResolveVerdicts(beam.DoFn):
    def process(self, element):
        key, grouped = element
        keep, reject = resolve_group(key, list(grouped["records"]), list(grouped["verdicts"]))
        yield from keep
        for record, reason in reject:
            Metrics.counter(NS, reason).inc()
            yield beam.pvalue.TaggedOutput("rejected", _rejection(record, reason))


class JoinVerdicts(beam.PTransform):
    """(survivors, (key, reason) verdicts) -> records to write + rejections."""

    def expand(self, inputs):
        survivors, verdicts = inputs
        keyed = survivors | "KeyRecords" >> beam.Map(lambda r: (r.key, r))
        return (
            {"records": keyed, "verdicts": verdicts}
            | "GroupByPairKey" >> beam.CoGroupByKey()
            | "Resolve" >> beam.ParDo(_ResolveVerdicts()).with_outputs("rejected", main="written")
        )


# ---------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------


def _sample_row(rejection: Rejection) -> dict:
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


def _write_stats_files(_, output_dir, input_count, rejected, written, histograms, extra, samples, meta):
    funnel = stats_lib.build_funnel(
        input_count, rejected, written, meta["ran"], meta["notes"], meta["dataset"], meta["preset"]
    )
    stats_dir = FileSystems.join(output_dir, "stats")
    stats_lib.write_text(FileSystems.join(stats_dir, "funnel.json"), stats_lib.to_json(funnel))
    distributions = {}
    for name, hist in sorted(histograms.items()):
        distributions[name] = dict(hist, description=stats_lib.HISTOGRAM_DESCRIPTIONS.get(name, ""))
    distributions.update(sorted(extra.items()))
    stats_lib.write_text(FileSystems.join(stats_dir, "distributions.json"), stats_lib.to_json(distributions, sort_keys=True))
    rows = sorted(samples, key=lambda row: (stages.STAGE_INDEX[row["stage"]], row["reason"], row["rank"]))
    lines = "".join(json.dumps({k: v for k, v in row.items() if k != "rank"}) + "\n" for row in rows)
    stats_lib.write_text(FileSystems.join(stats_dir, "rejected_samples.jsonl"), lines)
    yield funnel


class WriteStats(beam.PTransform):
    """Funnel, distributions and rejected samples into ``<output>/stats/``."""

    def __init__(self, output_dir, meta):
        super().__init__()
        self.output_dir = output_dir
        self.meta = meta

    def expand(self, inputs):
        input_count, rejections, written_counts, histograms, extra = inputs
        reason_counts = rejections | "ReasonOnly" >> beam.Map(lambda r: r.reason) | "CountReasons" >> beam.combiners.Count.PerElement()
        samples = (
            rejections
            | "ByReason" >> beam.Map(lambda r: (r.reason, (stats_lib.sample_rank(r.key), r.key, r)))
            | "SamplePerReason" >> beam.combiners.Top.SmallestPerKey(stats_lib.SAMPLES_PER_REASON)
            | "SampleRows" >> beam.FlatMap(lambda kv: [dict(_sample_row(r), rank=rank) for rank, _, r in kv[1]])
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
            )
        )


# ---------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------


class DropKeys(beam.PTransform):
    """Light rows ``(key, ...)`` minus the keys in a ``(key, reason)`` PCollection."""

    def expand(self, inputs):
        rows, rejected = inputs
        return (
            {"row": rows | "KeyRows" >> beam.Map(lambda row: (row[0], row)), "rejected": rejected}
            | "GroupRowsAndRejects" >> beam.CoGroupByKey()
            | "KeepUnrejected" >> beam.FlatMap(lambda kv: [] if kv[1]["rejected"] else kv[1]["row"])
        )


def build_pipeline(p: beam.Pipeline, opts: BuildOptions, preset, notes: dict, eval_index=None) -> None:
    """Adds the whole build to ``p``; ``eval_index`` is a loaded ``EvalIndex`` or None."""
    from filters import nsfw
    from filters.frequency import ApplyCorpusFilters
    from filters.frequency import stages_run as corpus_stages_run

    read = p | "ReadCandidates" >> ReadCandidates(opts.input, opts.input_format, input_columns(opts))
    input_count = read | "CountInput" >> beam.combiners.Count.Globally()
    parsed = read | "SplitReadRejects" >> beam.Partition(lambda x, _: int(isinstance(x, Rejection)), 2)
    candidates, read_rejects = parsed[0], parsed[1]

    filtered = candidates | "ApplyRecordFilters" >> ApplyRecordFilters(preset)
    survivors = filtered.survivors
    ran = [name for name, _ in stages.STAGES[:9]] + ["duplicate_pair"]
    verdicts = []

    light = survivors | "LightRows" >> beam.Map(lambda r: (r.key, r.sha256, r.phash, r.text))
    # The raw counting pool holds the rows NSFW rejects too: they are judged
    # by the corpus stages as well, and their NSFW verdict, earlier in the
    # stage order, wins in JoinVerdicts.
    judged = light
    keyed_images = survivors | "KeyImages" >> beam.Map(lambda r: (r.key, r.image))
    if nsfw.stage_enabled(preset.nsfw_threshold):
        scored = (
            keyed_images
            | "ScorePornography" >> beam.ParDo(nsfw.ScoreNsfw(preset.nsfw_threshold)).with_outputs(
                nsfw.REJECTED_TAG, main="kept")
        )
        verdicts.append(scored.rejected)
        light = (light, scored.rejected) | "DropPornographic" >> DropKeys()
        ran.append("nsfw")

    if preset.counting_base == "survivors":
        judged = light
    corpus = {"survivors": judged, "counted_only": filtered.counted} | "ApplyCorpusFilters" >> ApplyCorpusFilters(preset)
    verdicts.append(corpus["rejected"])
    ran += corpus_stages_run(preset)
    extra = [corpus["stats"]]

    pairs = embedded = None
    if eval_index is not None or preset.dedup_in_corpus:
        embedded = keyed_images | "EmbedImages" >> near_dup.EmbedImages(opts.embedder)
    if eval_index is not None:
        from dedup.transforms import RemoveNearDuplicates

        earlier = verdicts | "EarlierVerdicts" >> beam.Flatten()
        candidates_for_eval = (embedded, earlier) | "DropEarlierRejects" >> DropKeys()
        # The index is read from files on a worker: in the graph it would be
        # its whole size (Dataflow rejects graphs over 10 MB).
        index_rows = p | "ReadEvalIndex" >> near_dup.ReadIndexRows(eval_index.directory)
        found = candidates_for_eval | "RemoveNearDuplicates" >> RemoveNearDuplicates(
            index_rows, threshold=eval_index.threshold, search=preset.near_duplicate_search, **search_options(preset)
        )
        verdicts.append(found["rejected"])
        pairs = found["pairs"]
        ran.append("near_duplicate_eval")
    if preset.dedup_in_corpus:
        from dedup.corpus_dedup import RemoveCorpusDuplicates

        earlier = verdicts | "VerdictsBeforeCorpusDedup" >> beam.Flatten()
        hashes = (
            light
            | "HashesPerKey" >> beam.Map(lambda row: (row[0], (row[1], row[2])))
            | "OneHashPerKey" >> beam.CombinePerKey(min)  # repeats of a pair share a key
            | "HashRows" >> beam.Map(lambda kv: (kv[0], kv[1][0], kv[1][1]))
        )
        hashes = (hashes, earlier) | "DropRejectedHashes" >> DropKeys()
        vectors = (embedded, earlier) | "DropRejectedEmbeddings" >> DropKeys()
        threshold = (
            eval_index.threshold if eval_index is not None
            else near_dup.resolve_threshold(preset, _embedder(opts.embedder))
        )
        # Always a bucket self-join (dedup.corpus_dedup): near_duplicate_search
        # applies to the evaluation index only.
        verdicts.append(
            hashes | "RemoveCorpusDuplicates" >> RemoveCorpusDuplicates(vectors, threshold, **search_options(preset))
        )
        ran.append("near_duplicate_corpus")
        notes["near_duplicate_corpus"] = (
            f"same sha256, same pHash, or embedding cosine > {threshold} "
            f"(embedder {opts.embedder}; k-means buckets C({preset.nearest_clusters},{preset.bucket_size}))"
        )

    all_verdicts = verdicts | "FlattenVerdicts" >> beam.Flatten()
    written_records, joined_rejects = (survivors, all_verdicts) | "JoinVerdicts" >> JoinVerdicts()
    if pairs is not None:
        near_dup_rejects = (
            joined_rejects
            | "NearDuplicateRejects" >> beam.Filter(lambda r: stages.stage_of(r.reason) == "near_duplicate_eval")
            | "KeyNearDuplicateRejects" >> beam.Map(lambda r: (r.key, r))
        )
        _ = (
            {"pair": pairs | "KeyPairs" >> beam.Map(lambda d: (d["key"], d)), "rejection": near_dup_rejects}
            | "GroupPairs" >> beam.CoGroupByKey()
            | "PairRows" >> beam.FlatMap(near_dup.pair_rows)
            | "IndexThumbnails" >> near_dup.AddIndexThumbnails(eval_index.directory)
            | "CollectPairs" >> beam.combiners.ToList()
            | "WritePairs" >> beam.Map(_write_pairs, opts.output)
        )
    all_rejections = (read_rejects, filtered.rejected, joined_rejects) | "FlattenRejections" >> beam.Flatten()

    shard_lengths = written_records | "WriteShards" >> write_lib.WriteShards(opts.output, opts.name, preset, input_columns(opts).carry)
    written_counts = shard_lengths | "WrittenPerSplit" >> beam.FlatMap(lambda d: [(s, sum(c)) for s, c in d.items()])
    _ = shard_lengths | "WriteShardList" >> beam.Map(
        lambda d: stats_lib.write_text(FileSystems.join(opts.output, write_lib.SHARDS_FILE), json.dumps(d, sort_keys=True))
    )
    _ = (all_rejections, input_count) | "WriteRejectionLedger" >> write_lib.WriteRejectionLedger(opts.output)
    histograms = filtered.measures | "Distributions" >> stats_lib.HistogramPerKey()
    extra_stats = extra | "FlattenExtraStats" >> beam.Flatten()
    meta = {"ran": ran, "notes": notes, "dataset": opts.name, "preset": preset}
    _ = (input_count, all_rejections, written_counts, histograms, extra_stats) | "WriteStats" >> WriteStats(opts.output, meta)


def input_columns(opts) -> Columns:
    """Which input columns hold what, and which are carried to the shards (``--*_col``, ``--carry_columns``)."""
    return make_columns(
        getattr(opts, "url_col", ""), getattr(opts, "caption_col", ""), getattr(opts, "image_col", ""),
        [c.strip() for c in (getattr(opts, "carry_columns", "") or "").split(",")],
        getattr(opts, "tsv_columns", ""),
    )


def corpus_directory(output: str, layout: str, name: str, version: str) -> str:
    """Where the corpus goes: ``output`` (flat) or ``output/NAME/VERSION`` (TFDS's by-name layout)."""
    if layout == "tfds":
        return FileSystems.join(output, name, version)
    return output


def _write_pairs(rows, output_dir) -> None:
    rows = sorted(rows, key=lambda r: (r["key"], r["index_set"], r["index_key"]))
    text = "".join(json.dumps(r) + "\n" for r in rows)
    stats_lib.write_text(FileSystems.join(output_dir, "stats", "near_duplicates.jsonl"), text)


def search_options(preset) -> dict:
    """``dedup.transforms.SearchOptions`` from the preset, but ``search`` (eval and in-corpus differ)."""
    return dict(
        num_clusters=preset.num_clusters,
        nearest_clusters=preset.nearest_clusters,
        bucket_size=preset.bucket_size,
        sample_size=preset.kmeans_sample_size,
        centroid_merge_cosine=preset.centroid_merge_cosine,
    )


def _embedder(name):
    from dedup import embedders

    return embedders.get(name)


class EvalIndex:
    """The evaluation index as the job sees it: the directory of its files, the threshold, a note."""

    def __init__(self, directory: str, threshold: float, note: str):
        self.directory = directory
        self.threshold = threshold
        self.note = note


def load_eval_index(specs, embedder_name, preset, output_dir) -> EvalIndex:
    """Read and embed the evaluation sets in the launcher, write them under ``output_dir``.

    Called after ``_prepare_output`` (which empties ``output_dir``); the
    workers read the files (``pipeline.near_duplicates``).
    """
    from dedup.index_sets import load_index_sets

    embedder = _embedder(embedder_name)
    index = load_index_sets(specs, embedder)
    threshold = near_dup.resolve_threshold(preset, embedder)
    directory = near_dup.index_directory(output_dir)
    near_dup.write_index(index, directory, near_dup.index_thumbnails(index))
    note = (
        f"{index.num_images} evaluation images ({len(index)} rows with variants) "
        f"from {', '.join(specs)}; embedder {embedder_name}, cosine > {threshold}, "
        f"{preset.near_duplicate_search} search"
    )
    return EvalIndex(directory, threshold, note)


def stage_notes(preset) -> dict:
    """What the funnel should say about stages that run degraded or not at all.

    Judged from the launcher's environment without loading any model; on a
    remote runner the ``nsfw/scorer_unavailable`` counter is the worker's word.
    """
    import importlib.util

    from filters import nsfw

    notes = {}
    if not nsfw.stage_enabled(preset.nsfw_threshold):
        notes["nsfw"] = "disabled: nsfw_threshold >= 1.0"
    elif importlib.util.find_spec("nudenet") is None:
        notes["nsfw"] = f"records passed UNSCORED: {nsfw.NUDENET_MISSING}"
    else:
        notes["nsfw"] = f"scored by nudenet, rejected if score >= {preset.nsfw_threshold}"
    return notes


def _prepare_output(output: str, overwrite: bool) -> None:
    """Shards of an earlier run would mix with this one's: start empty."""
    if not FileSystems.exists(output):
        return
    if not overwrite:
        raise SystemExit(f"{output} exists; pass --overwrite to replace it")
    FileSystems.delete([output])


def _finalize(output: str, name: str, preset, carried=(), version: str = "1.0.0") -> dict:
    with FileSystems.open(FileSystems.join(output, write_lib.SHARDS_FILE)) as handle:
        shard_lengths = json.loads(handle.read())
    description = f"Alt-text corpus built with preset {preset.name!r} by pipeline.build"
    write_lib.write_tfds_metadata(output, name, shard_lengths, description, carried, version)
    with FileSystems.open(FileSystems.join(output, "stats", "funnel.json")) as handle:
        funnel = json.loads(handle.read())
    stats_lib.write_text(FileSystems.join(output, "COMPLETED"), "")
    return funnel


def counters(result) -> Optional[dict]:
    """The ``funnel`` Beam Metrics counters by name, or None if the runner has none."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(NS))["counters"]
    except Exception:  # runners without metrics support (e.g. Dask)
        return None
    return {c.key.metric.name: c.committed for c in queried}


def _resolve_preset(name, overrides):
    """The preset, or a one-line exit naming the bad parameter and its range (before any work)."""
    try:
        return get_preset(name, overrides)
    except PresetError as error:
        raise SystemExit(f"pipeline.build: error: {error}") from None


def run(argv: Optional[List[str]] = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--print-preset" in argv:
        parser = argparse.ArgumentParser()
        BuildOptions._add_argparse_args(parser)
        known, _ = parser.parse_known_args([a for a in argv if a != "--print-preset"])
        print(format_preset(_resolve_preset(known.preset, known.overrides)))
        return {}
    options = PipelineOptions(argv)
    opts = options.view_as(BuildOptions)
    if not opts.input or not opts.output:
        raise SystemExit("--input and --output are required")
    preset = _resolve_preset(opts.preset, opts.overrides)
    opts.output = corpus_directory(opts.output, opts.layout, opts.name, opts.version)
    if options.view_as(StandardOptions).runner is None:
        options.view_as(StandardOptions).runner = LOCAL_RUNNER
    options.view_as(SetupOptions).save_main_session = False
    _prepare_output(opts.output, opts.overwrite)
    notes = stage_notes(preset)
    for stage, note in input_notes(opts.input, opts.input_format, input_columns(opts)).items():
        notes[stage] = f"{notes[stage]}; {note}" if stage in notes else note
    eval_index = load_eval_index(opts.eval_images, opts.embedder, preset, opts.output) if opts.eval_images else None
    if eval_index is not None:
        notes["near_duplicate_eval"] = eval_index.note
    p = beam.Pipeline(options=options)
    build_pipeline(p, opts, preset, notes, eval_index)
    result = p.run()
    result.wait_until_finish()
    funnel = _finalize(opts.output, opts.name, preset, input_columns(opts).carry, opts.version)
    funnel_counters = counters(result)
    if funnel_counters is not None:
        stats_lib.write_text(
            FileSystems.join(opts.output, "stats", "metrics.json"), stats_lib.to_json(funnel_counters, sort_keys=True)
        )
    try:
        from pipeline.audit import format_funnel
    except ImportError:  # the audit module is optional at this layer
        format_funnel = stats_lib.to_json
    print(format_funnel(funnel))
    return funnel


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    funnel = run()
    if funnel and not funnel.get("conserved", False):
        sys.exit("conservation law violated: input != written + rejected")


if __name__ == "__main__":
    main()
