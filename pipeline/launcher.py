"""The launcher of ``python -m pipeline.build``: checks, the output contract around one job, the console.

``run(argv)`` checks every argument before anything is touched
(``validate``), runs the job built by ``pipeline.build.build_pipeline`` into
the build's own version directory ``OUTPUT/versions/<id>/``, and publishes
it (``pipeline.publish``: check, describe, commit, remove what it replaced).
With ``--detached`` it returns once the job is submitted and
``python -m pipeline.publish`` finishes it later. ``main`` turns every
failure into one line and an exit code.

Without ``--runner`` the job runs on Beam's FnApiRunner in this process
(add ``--direct_running_mode=multi_processing --direct_num_workers=N`` for
several worker processes); the plain DirectRunner is never chosen because
Beam 2.77 first tries to download a Prism binary.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import StandardOptions

from common import cli, corpus_dir
from filters import extra_stages
from filters.presets import PresetError, format_preset, get_preset
from pipeline import concepts as concepts_lib
from pipeline import stats as stats_lib
from pipeline.build import build_pipeline
from pipeline.download import stage as download_stage
from pipeline.eval_index import embed_eval_sets, write_eval_index
from pipeline.finish import AccountingError, counters
from pipeline.funnel_table import format_funnel
from pipeline.options import (
    SHORT_USAGE, UsageError, beam_options, build_parser, check_spelling, corpus_directory, embedder_args,
    input_columns,
)
from pipeline.readers.input_notes import input_notes


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



EXIT_BUILT, EXIT_FAILED, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3


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
            raise UsageError(f"--eval_images {spec!r}: expected NAME=PATH")
        if not FileSystems.exists(path):
            raise UsageError(f"--eval_images {spec!r}: {path} does not exist")
        eval_paths.append(path)
    files = list_input_files(args.input)
    if not files:
        raise UsageError(f"--input {args.input} matches no files")
    try:
        output_lib.check_location(args.output, [output_lib.input_location(args.input)] + eval_paths)
    except output_lib.OutputRefused as error:
        raise UsageError(str(error)) from None
    check_model_score(args, preset)  # last: it loads the model
    return preset, files


def check_model_score(args, preset) -> None:
    """The ``--model_score`` model loads here, in one line if it cannot (a missing or incompatible checkpoint),
    and the preset's score cuts have a model to cut by."""
    from filters.score_cut import cut_values
    from pipeline.options import pair_scorer

    try:
        scorer = pair_scorer(args)
    except (TypeError, ValueError) as error:
        raise UsageError(f"--model_score {args.model_score}: {error}") from None
    if scorer is None:
        cuts = [name for name, value in zip(("model_score_threshold", "model_score_top_fraction"),
                                            cut_values(preset)) if value is not None]
        if cuts:
            raise UsageError(f"{' and '.join(cuts)} cut by a model's scores: name the model with --model_score "
                             "(e.g. --model_score checkpoint --model_score_arg workdir=DIR)")
        if args.model_score_args:
            raise UsageError("--model_score_arg needs --model_score")
        return
    if getattr(args, "download", False):
        # The crawl judges a fetched image once for all its rows, outside the file judge that scores pairs.
        raise UsageError("--model_score with --download: downloaded pairs are not scored; build the downloaded "
                         "corpus first, then rebuild from its shards with --model_score")
    try:
        scorer.check()
    except (TypeError, ValueError) as error:  # a checkpoint's problems are one-line ValueErrors (trainer.pair_score)
        raise UsageError(f"--model_score {args.model_score}: {error}") from None



def say(message: str) -> None:
    """Progress for the person at the terminal (library logging goes to the log file)."""
    print(message, flush=True)



def build_request(args, preset, version: str, expects: str, replaces, runner) -> dict:
    """What ``pipeline.publish`` needs to finish this build, from wherever it runs."""
    import socket
    import time

    return {
        "version": version, "name": args.name, "dataset_version": args.version,
        "description": f"Alt-text corpus built with preset {preset.name!r} by pipeline.build",
        "carried": list(input_columns(args).carry), "concepts": bool(args.concepts),
        "expects": expects, "replaces": replaces, "keep_previous": bool(args.keep_previous),
        "download": bool(args.download), "keep_downloads": bool(getattr(args, "download_keep", False)),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
        "runner": str(runner),
    }


def run(argv: Optional[List[str]] = None) -> dict:
    """The build. Raises ``UsageError``/``OutputRefused`` (nothing touched), ``AccountingError``
    or ``PublishError`` (the job ran, nothing committed), ``CommitConflict`` or the job's own error.

    Returns the funnel (``{}`` for ``--print_preset`` and ``--detached``).
    """
    import uuid

    from pipeline import output as output_lib
    from pipeline import publish as publish_lib
    from pipeline.read import READ_NAMESPACE
    from pipeline.verdicts import VERDICTS_NAMESPACE

    argv = list(sys.argv[1:] if argv is None else argv)
    check_spelling(argv)
    args, beam_args = build_parser().parse_known_args(argv)
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
    output = args.output = corpus_directory(args.output, args.layout, args.name, args.version).rstrip("/")
    plan = output_lib.plan_output(output, args.overwrite)
    committed, previous = publish_lib.current(output)
    version = output_lib.new_version_id(uuid.uuid4().hex[:8])
    directory = corpus_dir.version_dir(output, version)
    say(f"input: {len(files):,} file(s) matching {args.input}")
    unfinished = [v for v in corpus_dir.list_versions(output) if v != previous]
    if unfinished:
        say(f"note: {output} holds {len(unfinished)} uncommitted build(s) ({', '.join(unfinished[-3:])}): "
            "killed, failed or still running; this build does not touch them")
    notes = stage_notes(preset)
    notes.update({e.name: f"extra stage {e.source}: {e.description}" for e in extras})
    for stage, note in input_notes(args.input, args.input_format, input_columns(args)).items():
        notes[stage] = f"{notes[stage]}; {note}" if stage in notes else note
    loaded = None
    if args.eval_images:
        say(f"embedding evaluation images: {', '.join(args.eval_images)}")
        loaded = embed_eval_sets(args.eval_images, args.embedder, preset, embedder_args(args))
    # Everything is checked: from here on the output is touched, inside this build's own version only.
    runner = options.view_as(StandardOptions).runner
    if output_lib.MARKER not in plan.files:
        output_lib.write_marker(output, args.name)
    publish_lib.write_request(directory, build_request(args, preset, version, committed.token, previous, runner))
    eval_index = write_eval_index(loaded, directory, preset) if loaded is not None else None
    job_args = argparse.Namespace(**dict(vars(args), output=directory, build_id=version,
                                         download_staging=FileSystems.join(output, output_lib.DOWNLOADS)))
    p = beam.Pipeline(options=options)
    build_pipeline(p, job_args, preset, notes, eval_index, extras, ontology)
    say(f"running the job on {runner} into {directory}")
    result = p.run()
    if args.detached:
        say(f"submitted; when the job has finished: python -m pipeline.publish {output} --build {version}")
        return {}
    result.wait_until_finish()
    # What the runner counted apart from the data, for the publication to reconcile with the data.
    for namespace, path in ((READ_NAMESPACE, publish_lib.READ_COUNTS), (VERDICTS_NAMESPACE, publish_lib.VERDICT_COUNTS)):
        found = counters(result, namespace)
        if found is not None:
            stats_lib.write_text(FileSystems.join(directory, path), stats_lib.to_json(found, sort_keys=True))
    funnel_counters = counters(result)
    if funnel_counters is not None:
        stats_lib.write_text(FileSystems.join(directory, "stats", "metrics.json"),
                             stats_lib.to_json(funnel_counters, sort_keys=True))
    published = publish_lib.publish(output, version)
    funnel = published.funnel
    say(format_funnel(funnel))
    if ontology is not None:
        say(concepts_lib.summary_line(directory))
    for line in publish_lib.report_lines(published):
        say(line)
    total = sum(funnel["written"].values())
    if total == 0:
        say(f"no record was written: every input record was rejected (see the funnel). "
            f"{output} is an empty corpus (0 examples per split).")
    say(f"corpus: {output} ({total:,} records, version {version}, committed)")
    return funnel


def main(argv: Optional[List[str]] = None) -> None:
    from common import console
    from pipeline import commit as commit_lib
    from pipeline import output as output_lib
    from pipeline.publish import PublishError

    command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_spelling(argv)
    except UsageError as error:  # the line names the right spelling: no usage needed
        console.error(str(error))
        sys.exit(EXIT_USAGE)
    args, _ = build_parser().parse_known_args(argv)  # --help and argparse's own mistakes end here
    # The command line, not a test: library chatter goes to a log file.
    log_path = console.route_library_output("build", args.log_file) if command_line else "the log"
    try:
        run(argv)
    except (UsageError, output_lib.OutputRefused) as error:
        # The mistake first, then one line of usage (argparse's full usage block is 12 lines).
        console.error(str(error))
        print(SHORT_USAGE, file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except commit_lib.CommitConflict as error:
        console.error(str(error))
        sys.exit(EXIT_CONFLICT)
    except (AccountingError, PublishError) as error:
        console.error(f"{error}; not committed, the output's corpus is unchanged")
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        console.error("interrupted; nothing was committed, the output's corpus is unchanged")
        sys.exit(EXIT_FAILED)
    except Exception as error:  # the job's own failure: one line here, the traceback in the log
        logging.exception("build failed")
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        console.error(f"the build failed: {type(error).__name__}: {first[:300]} (details: {log_path}); "
                      "nothing was committed, the output's corpus is unchanged")
        sys.exit(EXIT_FAILED)
