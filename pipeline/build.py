"""Build a filtered alt-text corpus: candidates in, TFDS-compatible shards out.

    python -m pipeline.build --input 'data/sample/candidates/*.parquet' \\
        --output out/corpus --preset align [--set NAME=VALUE ...] \\
        [--eval-images NAME=PATH ...] [--runner DataflowRunner ...]

The job reads like its data flow:

    ReadCandidates -> [DownloadImages] -> ApplyRecordFilters -> ScorePornography
      -> ApplyCorpusFilters -> RemoveNearDuplicates -> JoinVerdicts
      -> WriteShards, WriteStats

Each stage is a named composite that declares the stages it decides and
returns its verdicts (``pipeline.verdicts``): record stages reject records;
key stages (NSFW, frequency filters, near-duplicates) see only light rows
(``pipeline.stage_rows``: key, hashes, text; image bytes or embeddings where they
need them) and reject keys; image bytes travel through exactly one shuffle,
the final ``JoinVerdicts``. Every input record ends either in a shard or in
the funnel with its first reason (``filters/stages.py``); the funnel's list
of stages that ran is the list of stages applied. Evaluation images are
embedded in the launcher and written to ``<output>/near_duplicates/index/``
(``pipeline.eval_index``), where the workers read them: the job graph
carries their path, not their vectors.

This module is the graph and the launcher (``run``); the stages live in
``pipeline.read``, ``pipeline.record_stages``, ``filters.frequency``,
``pipeline.near_duplicates``, ``pipeline.verdicts``, ``pipeline.write`` and
``pipeline.write_stats``.

Over 500 lines because the launcher shares the file with the graph, as
``run(argv)`` does in Beam's examples: argument checks, the output contract
(lock, staging, publish) and the accounting around one job are ~300 of its
lines; the graph itself is ``build_pipeline``, about 60.

Without ``--runner`` the job runs on Beam's FnApiRunner in this process
(add ``--direct_running_mode=multi_processing --direct_num_workers=N`` for
several worker processes); the plain DirectRunner is never chosen because
Beam 2.77 first tries to download a Prism binary.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # ``python -m pipeline.build`` runs this file as ``__main__``. Run the
    # module imported by its real name instead, before this copy defines
    # anything: whatever the job pickles must refer to ``pipeline.build``
    # (with ``--pickle_library=dill`` a ``__main__`` class or function is a
    # NameError on a worker), and Beam allows one ``BuildOptions`` class.
    from pipeline.build import main

    sys.exit(main())

import argparse
import json
import logging
import re
from typing import List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

from filters import extra_stages, nsfw
from filters.frequency import ApplyCorpusFilters
from filters.presets import PresetError, format_preset, get_preset
from pipeline import concepts as concepts_lib
from pipeline import stats as stats_lib
from pipeline.download import stage as download_stage
from pipeline import write as write_lib
from pipeline.eval_index import EvalIndex, embed_eval_sets, write_eval_index
from pipeline.funnel_table import format_funnel
from pipeline.near_duplicates import PAIRS, RemoveNearDuplicates, WritePairsReport
from pipeline.read import ReadCandidates
from pipeline.readers import limits as read_limits
from pipeline.readers.input_notes import input_notes
from pipeline.readers.rows import Columns, make_columns
from pipeline.record_stages import COUNTED, MEASURES, ApplyRecordFilters, ScorePornography
from pipeline.stage_rows import light_row, row_key
from pipeline.verdicts import REJECTED, SURVIVORS, DropKeys, JoinVerdicts, StagesRun
from pipeline.write_stats import WriteStats

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
        parser.add_argument("--output", help="directory to write, a literal path (local or gs://); see --layout")
        parser.add_argument("--preset", default="align", help="filter preset: align (default) or cc12m")
        parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                            help="override one preset threshold (repeatable; names and ranges: --print-preset)")
        parser.add_argument(
            "--stage", dest="extra_stages", action="append", default=[], metavar="MODULE:ATTRIBUTE",
            help="an extra stage, per-record or corpus (filters.extra_stages), e.g. filters.language:ENGLISH (repeatable)")
        parser.add_argument("--name", default="alt_text_corpus",
                            help="dataset name, the start of every shard file name (letters, digits, '_')")
        parser.add_argument(
            "--eval-images", "--eval_images", dest="eval_images", action="append", default=[], metavar="NAME=PATH",
            help="evaluation image set whose near-duplicates are removed: a folder of images, TFDS shards "
                 "or Parquet (repeatable)",
        )
        parser.add_argument("--embedder", default="dct",
                            help="image embedder for near-duplicate search: dct (default, no model) or checkpoint")
        parser.add_argument(
            "--embedder-arg", "--embedder_arg", dest="embedder_args", action="append", default=[], metavar="KEY=VALUE",
            help="constructor argument of the embedder (JSON values; repeatable), e.g. workdir=gs://b/run for "
                 "checkpoint, whose workers need the 'train' extra (README 'Dataflow')")
        parser.add_argument(
            "--concepts", default="", metavar="ONTOLOGY",
            help="TOnICS: tag written pairs with the classes their alt-text names: 'default' (built-in English "
                 "ontology) or a JSON ontology file; writes the concepts feature and concepts/ index (README 'TOnICS')")
        parser.add_argument(
            "--concept_labels_column", "--concept-labels-column", dest="concept_labels_column", default="",
            help="with --concepts: a carried column of detector labels per image; a class is tagged only if "
                 "the text names it and the labels contain it")
        parser.add_argument("--overwrite", action="store_true",
                            help="replace the corpus a previous build wrote in --output (deletes only its files)")
        download_stage.add_arguments(parser)
        read_limits.add_arguments(parser)


# ---------------------------------------------------------------------------
# The job graph
# ---------------------------------------------------------------------------


def build_pipeline(
    p: beam.Pipeline, opts: BuildOptions, preset, notes: dict, eval_index: Optional[EvalIndex] = None, extras=(),
    ontology=None,
) -> StagesRun:
    """Adds the whole build to ``p``; returns the stages applied.

    ``notes`` ({stage: text}, the launcher's) go to the funnel with the
    stages' own notes; ``extras`` are extra stages (``filters.extra_stages``):
    per-record ones run with the record filters, corpus ones with the
    corpus filters.
    ``ontology`` (``common.ontology``) turns on the TOnICS tagging (``pipeline.concepts``).
    """
    ran = StagesRun(notes)
    verdicts = []  # (key, reason) of the key stages, in stage order

    columns = input_columns(opts)
    read = p | "ReadCandidates" >> ran(ReadCandidates(opts.input, opts.input_format, columns))
    input_count = (read[SURVIVORS], read[REJECTED]) | "InputRows" >> beam.Flatten() | "CountInput" >> beam.combiners.Count.Globally()
    candidates, early_rejections = read[SURVIVORS], [read[REJECTED]]
    if columns.download:
        fetched = candidates | "DownloadImages" >> ran(download_stage.DownloadImages(download_stage.from_args(opts)))
        candidates = fetched[SURVIVORS]
        early_rejections.append(fetched[REJECTED])

    records = candidates | "ApplyRecordFilters" >> ran(
        ApplyRecordFilters(preset, extra_stages.record_stages(extras)))
    survivors = records[SURVIVORS]
    light = survivors | "LightRows" >> beam.Map(light_row)
    # The raw counting pool holds the rows NSFW rejects too: they are judged
    # by the corpus stages as well, and their NSFW verdict, earlier in the
    # stage order, wins in JoinVerdicts.
    judged = light
    images = survivors | "KeyImages" >> beam.Map(lambda r: (r.key, r.image))

    job_notes = []  # (stage, text) made on the workers
    if nsfw.stage_enabled(preset.nsfw_threshold):
        scored = images | "ScorePornography" >> ran(ScorePornography(preset.nsfw_threshold, preset.nsfw_unscored))
        verdicts.append(scored[REJECTED])
        job_notes.append(scored["notes"])
        light = (light, scored[REJECTED]) | "DropPornographic" >> DropKeys(row_key)

    if preset.counting_base == "survivors":
        judged = light
    corpus = {"survivors": judged, "counted_only": records[COUNTED]} | "ApplyCorpusFilters" >> ran(
        ApplyCorpusFilters(preset, extras=extras))
    verdicts.append(corpus[REJECTED])

    pairs = None
    if eval_index is not None or preset.dedup_in_corpus:
        earlier = verdicts | "EarlierVerdicts" >> beam.Flatten()
        near_dups = {"images": images, "light": light, "earlier": earlier} | "RemoveNearDuplicates" >> ran(
            RemoveNearDuplicates(opts.embedder, preset, eval_index, embedder_args(opts)))
        verdicts.append(near_dups[REJECTED])
        pairs = near_dups.get(PAIRS)

    all_verdicts = verdicts | "FlattenVerdicts" >> beam.Flatten()
    joined = (survivors, all_verdicts) | "JoinVerdicts" >> ran(JoinVerdicts(extra_stages.stage_rank(extras)))
    rejections = (*early_rejections, records[REJECTED], joined[REJECTED]) | "FlattenRejections" >> beam.Flatten()

    to_write = joined[SURVIVORS]
    if ontology is not None:  # TOnICS tagging (optional): adds the concepts feature, rejects nothing
        labels_column = getattr(opts, "concept_labels_column", "")
        to_write = to_write | "TagConcepts" >> ran(concepts_lib.TagConcepts(ontology, labels_column))
        _ = to_write | "ConceptStats" >> concepts_lib.WriteConceptStats(
            opts.output, ontology, preset.validation_fraction, labels_column)
    shard_lengths = to_write | "WriteShards" >> write_lib.WriteShards(opts.output, opts.name, preset, columns.carry)
    _ = (rejections, input_count) | "WriteRejectionLedger" >> write_lib.WriteRejectionLedger(opts.output)
    if pairs is not None:
        _ = (pairs, joined[REJECTED]) | "WritePairsReport" >> WritePairsReport(eval_index.directory, opts.output)
    written_counts = shard_lengths | "WrittenPerSplit" >> beam.FlatMap(lambda d: [(s, sum(c)) for s, c in d.items()])
    histograms = records[MEASURES] | "Distributions" >> stats_lib.HistogramPerKey()
    meta = {"ran": ran.names, "notes": ran.notes, "dataset": opts.name, "preset": preset, "extras": tuple(extras)}
    worker_notes = job_notes | "StageNotes" >> beam.Flatten(pipeline=p)
    _ = (input_count, rejections, written_counts, histograms, corpus["stats"], worker_notes) | "WriteStats" >> WriteStats(
        opts.output, meta)
    return ran


# ---------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------


def input_columns(opts) -> Columns:
    """Which input columns hold what, and which are carried to the shards (``--*_col``, ``--carry_columns``).

    With ``--download`` the download's HTTP status and final URL are carried too.
    """
    download = bool(getattr(opts, "download", False))
    carry = [c.strip() for c in (getattr(opts, "carry_columns", "") or "").split(",")]
    columns = make_columns(
        getattr(opts, "url_col", ""), getattr(opts, "caption_col", ""), getattr(opts, "image_col", ""),
        carry + list(download_stage.CARRIED if download else ()), getattr(opts, "tsv_columns", ""),
    )
    return columns._replace(download=download, limits=read_limits.from_options(opts))


def embedder_args(opts) -> tuple:
    """``--embedder-arg KEY=VALUE`` as sorted ``(key, value)`` pairs (picklable, part of the graph)."""
    from dedup import embedders

    return tuple(sorted(embedders.parse_args(getattr(opts, "embedder_args", []) or []).items()))


def corpus_directory(output: str, layout: str, name: str, version: str) -> str:
    """Where the corpus goes: ``output`` (flat) or ``output/NAME/VERSION`` (TFDS's by-name layout)."""
    if layout == "tfds":
        return FileSystems.join(output, name, version)
    return output


def stage_notes(preset) -> dict:
    """What the funnel should say about stages that run degraded or not at all, before the job.

    No environment is judged here: whether NSFW scored is the workers' word
    (``ScorePornography``'s note replaces this one as soon as a record
    reached the stage; ``nsfw/scorer_unavailable`` counts the unscored).
    """
    from filters import nsfw

    notes = {}
    if not nsfw.stage_enabled(preset.nsfw_threshold):
        notes["nsfw"] = "disabled: nsfw_threshold >= 1.0"
    else:
        notes["nsfw"] = f"no record reached the stage (rejected if score >= {preset.nsfw_threshold})"
    return notes


EXIT_BUILT, EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED = 0, 1, 2, 3

EPILOG = """\
Every other --flag goes to Apache Beam (--runner, --project, --region,
--temp_location, --setup_file, --direct_running_mode, --direct_num_workers, ...).

Output contract: --output is a literal directory (glob characters are
characters). It must not equal, contain or lie inside an input location. An
existing non-empty output is refused unless --overwrite is given, and then only
if it is a corpus a previous build wrote: only that build's files are deleted,
anything else makes the build refuse. A lock file (_BUILD_LOCK) makes a second
build into the same output fail at once. Shards and stats get their final names
only after the job succeeded; COMPLETED is written last.

Exit codes: 0 built (also when no record was written: an empty corpus),
1 the job failed or its counts do not reconcile (no COMPLETED),
2 invalid arguments or unsafe output (nothing was touched),
3 another build holds the output's lock."""


class UsageError(Exception):
    """An invalid argument: reported in one line with the usage; nothing was touched."""


class AccountingError(Exception):
    """The job ran but its counts do not add up; COMPLETED is not written."""


SHORT_USAGE = ("usage: python -m pipeline.build --input GLOB --output DIR [--preset align|cc12m] "
               "[--set NAME=VALUE ...] [--overwrite] (--help lists every option)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.build",
        description="Build a filtered alt-text corpus: img2dataset-style Parquet in, TFDS-compatible shards out.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    BuildOptions._add_argparse_args(parser)
    parser.add_argument("--print-preset", action="store_true",
                        help="print every threshold of the preset (after --set) with its meaning, and exit")
    parser.add_argument("--log-file", default=None,
                        help="where library logging goes (default: $ALT_TEXT_CORPUS_LOG_DIR/build.log or a temp dir)")
    return parser


def beam_options(beam_args: List[str]) -> PipelineOptions:
    """Beam's options from the remaining flags; an unknown flag is an error, not a warning."""
    from apache_beam.options import pipeline_options as po

    class Parser(po._BeamArgumentParser):  # Beam's own parser: value-provider arguments
        def error(self, message):
            raise UsageError(message)

    parser = Parser(allow_abbrev=False)
    seen = {}
    for cls in PipelineOptions.__subclasses__():
        if cls is not BuildOptions:
            seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(beam_args)
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
    options = PipelineOptions(beam_args)
    if options.view_as(StandardOptions).runner is None:
        options.view_as(StandardOptions).runner = LOCAL_RUNNER
    runner = options.view_as(StandardOptions).runner
    if isinstance(runner, str):
        from apache_beam.runners.runner import create_runner

        try:
            create_runner(runner)  # an unknown name fails here, before the output is touched
        except ValueError:
            raise UsageError(f"--runner {runner}: unknown runner (e.g. FnApiRunner, DataflowRunner)") from None
    options.view_as(SetupOptions).save_main_session = False
    return options


def load_extra_stages(specs) -> tuple:
    """The extra stages named by the preset and ``--stage`` (``UsageError`` before any work)."""
    try:
        return extra_stages.load_all(specs)
    except ValueError as error:
        raise UsageError(str(error)) from None


def load_ontology(spec: str):
    """The TOnICS ontology of ``--concepts`` (``UsageError`` before any work)."""
    from common.ontology import OntologyError, load

    try:
        return load(spec)
    except OntologyError as error:
        raise UsageError(f"--concepts: {error}") from None


def validate(args) -> tuple:
    """Every check that needs no output: returns ``(preset, input files)`` or raises ``UsageError``."""
    from pipeline import output as output_lib
    from pipeline.read import list_input_files

    if not args.input or not args.output:
        raise UsageError("--input and --output are required")
    problem = output_lib.valid_dataset_name(args.name)
    if problem:
        raise UsageError(problem)
    try:
        preset = get_preset(args.preset, args.overrides)
    except PresetError as error:
        raise UsageError(str(error)) from None
    from dedup import embedders
    from pipeline import readers

    if args.input_format and args.input_format not in readers.FORMATS:
        raise UsageError(f"--input_format {args.input_format!r}: one of {', '.join(readers.FORMATS)}")
    if not re.match(r"^\d+\.\d+\.\d+$", args.version or ""):
        raise UsageError(f"--version {args.version!r}: expected MAJOR.MINOR.PATCH, e.g. 1.0.0")
    try:
        input_columns(args)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.download:
        try:
            download_stage.from_args(args)
        except ValueError as error:
            raise UsageError(str(error)) from None
    if args.concept_labels_column and not args.concepts:
        raise UsageError("--concept_labels_column needs --concepts")
    if args.concept_labels_column and args.concept_labels_column not in input_columns(args).carry:
        raise UsageError(f"--concept_labels_column {args.concept_labels_column!r}: also name it in --carry_columns")
    if args.embedder not in embedders.names():
        raise UsageError(f"--embedder {args.embedder!r}: known embedders are {', '.join(embedders.names())}")
    try:
        embedders.get(args.embedder, **dict(embedder_args(args)))  # e.g. checkpoint without workdir=
    except (TypeError, ValueError) as error:
        raise UsageError(f"--embedder {args.embedder}: {error}") from None
    eval_paths = []
    for spec in args.eval_images:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--eval-images {spec!r}: expected NAME=PATH")
        if not FileSystems.exists(path):
            raise UsageError(f"--eval-images {spec!r}: {path} does not exist")
        eval_paths.append(path)
    files = list_input_files(args.input)
    if not files:
        raise UsageError(f"--input {args.input} matches no files")
    try:
        output_lib.check_location(args.output, [output_lib.input_location(args.input)] + eval_paths)
    except output_lib.OutputRefused as error:
        raise UsageError(str(error)) from None
    return preset, files


def say(message: str) -> None:
    """Progress for the person at the terminal (library logging goes to the log file)."""
    print(message, flush=True)


def _finalize(output: str, name: str, preset, carried=(), version: str = "1.0.0", concepts: bool = False) -> dict:
    """TFDS metadata for the published shards; returns the funnel."""
    with FileSystems.open(FileSystems.join(output, write_lib.SHARDS_FILE)) as handle:
        shard_lengths = json.loads(handle.read())
    description = f"Alt-text corpus built with preset {preset.name!r} by pipeline.build"
    write_lib.write_tfds_metadata(output, name, shard_lengths, description, carried, version, concepts)
    with FileSystems.open(FileSystems.join(output, "stats", "funnel.json")) as handle:
        funnel = json.loads(handle.read())
    return funnel


def accounting_problems(funnel: dict, read_counts: Optional[dict]) -> List[str]:
    """Why the funnel cannot be trusted: conservation, and input vs what the files state.

    ``read_counts`` are the reader's counters (``pipeline.read``): rows per
    file as its metadata states them (``parquet_rows``, ``<format>_records``)
    and one per unreadable file.
    """
    problems = []
    if not funnel.get("conserved", False):
        problems.append("conservation law violated: input != written + rejected")
    if read_counts is not None:
        rows = sum(v for k, v in read_counts.items() if k == "parquet_rows" or k.endswith("_records"))
        unreadable = read_counts.get("unreadable_files", 0)
        if funnel["input"] != rows + unreadable:
            problems.append(
                f"input count {funnel['input']:,} differs from the files' metadata: {rows:,} rows "
                f"+ {unreadable:,} unreadable files"
            )
    return problems


def counters(result, namespace: str = NS) -> Optional[dict]:
    """Beam Metrics counters of ``namespace`` by name, or None if the runner has none."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    except Exception:  # runners without metrics support (e.g. Dask)
        return None
    return {c.key.metric.name: c.committed for c in queried}


def run(argv: Optional[List[str]] = None) -> dict:
    """The build. Raises ``UsageError``/``OutputRefused`` (nothing touched), ``OutputLocked``,
    ``AccountingError`` (funnel written, no COMPLETED) or the job's own error."""
    import uuid

    from pipeline import output as output_lib
    from pipeline.read import READ_NAMESPACE

    parser = build_parser()
    args, beam_args = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if args.print_preset:
        try:
            print(format_preset(get_preset(args.preset, args.overrides)))
        except PresetError as error:
            raise UsageError(str(error)) from None
        return {}
    options = beam_options(beam_args)
    preset, files = validate(args)
    extras = load_extra_stages(tuple(preset.extra_stages) + tuple(args.extra_stages))
    ontology = load_ontology(args.concepts) if args.concepts else None
    args.output = corpus_directory(args.output, args.layout, args.name, args.version)
    plan = output_lib.plan_output(args.output, args.overwrite)
    run_id = uuid.uuid4().hex[:12]
    lock = output_lib.Lock(args.output, run_id)
    lock.ensure_free()
    say(f"input: {len(files):,} file(s) matching {args.input}")
    notes = stage_notes(preset)
    notes.update({e.name: f"extra stage {e.source}: {e.description}" for e in extras})
    for stage, note in input_notes(args.input, args.input_format, input_columns(args)).items():
        notes[stage] = f"{notes[stage]}; {note}" if stage in notes else note
    loaded = None
    if args.eval_images:
        say(f"embedding evaluation images: {', '.join(args.eval_images)}")
        loaded = embed_eval_sets(args.eval_images, args.embedder, preset, embedder_args(args))
    # Everything is checked: from here on the output is touched.
    lock.acquire()
    try:
        if plan.to_delete:
            say(f"output: deleting the previous build in {args.output} ({len(plan.to_delete):,} files)")
            output_lib.delete_planned(plan)
        output_lib.write_marker(args.output, args.name)
        eval_index = write_eval_index(loaded, args.output) if loaded is not None else None
        staging = output_lib.staging_dir(args.output, run_id)
        job_args = argparse.Namespace(**dict(vars(args), output=staging))
        p = beam.Pipeline(options=options)
        build_pipeline(p, job_args, preset, notes, eval_index, extras, ontology)
        say(f"running the job on {options.view_as(StandardOptions).runner}")
        result = p.run()
        result.wait_until_finish()
        lock.check()
        output_lib.publish(staging, args.output)
        funnel = _finalize(args.output, args.name, preset, input_columns(args).carry, args.version,
                           concepts=ontology is not None)
        funnel_counters = counters(result)
        if funnel_counters is not None:
            stats_lib.write_text(
                FileSystems.join(args.output, "stats", "metrics.json"), stats_lib.to_json(funnel_counters, sort_keys=True)
            )
        say(format_funnel(funnel))
        if ontology is not None:
            say(concepts_lib.summary_line(args.output))
        problems = accounting_problems(funnel, counters(result, READ_NAMESPACE))
        if problems:
            raise AccountingError("; ".join(problems))
        lock.check()
        stats_lib.write_text(FileSystems.join(args.output, output_lib.COMPLETED), "")
    finally:
        lock.release()
    total = sum(funnel["written"].values())
    if total == 0:
        say(f"no record was written: every input record was rejected (see the funnel). "
            f"{args.output} is an empty corpus (0 examples per split).")
    say(f"corpus: {args.output} ({total:,} records, COMPLETED)")
    return funnel


def main() -> None:
    from common import console
    from pipeline import output as output_lib

    argv = sys.argv[1:]
    log_file = None
    for i, arg in enumerate(argv):
        if arg == "--log-file" and i + 1 < len(argv):
            log_file = argv[i + 1]
        elif arg.startswith("--log-file="):
            log_file = arg.split("=", 1)[1]
    log_path = console.route_library_output("build", log_file)
    try:
        run(argv)
    except (UsageError, output_lib.OutputRefused) as error:
        # The mistake first, then one line of usage (argparse's full usage block is 12 lines).
        console.error(str(error))
        print(SHORT_USAGE, file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except output_lib.OutputLocked as error:
        console.error(str(error))
        sys.exit(EXIT_LOCKED)
    except AccountingError as error:
        console.error(f"{error}; COMPLETED not written")
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        console.error("interrupted; the output has no COMPLETED")
        sys.exit(EXIT_FAILED)
    except Exception as error:  # the job's own failure: one line here, the traceback in the log
        logging.exception("build failed")
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        console.error(f"the build failed: {type(error).__name__}: {first[:300]} (details: {log_path})")
        sys.exit(EXIT_FAILED)
