"""The launcher of ``python -m pipeline.build``: the output contract around one job, and the console.

``run(argv)`` resolves the command line into one ``BuildConfig``
(``pipeline.build.config.resolve``: every check before anything is
touched), runs the job built by ``pipeline.build.graph.build_pipeline`` into
the build's own version directory ``OUTPUT/versions/<id>/``, and publishes
it (``pipeline.publish.publisher``: check, describe, commit, remove what it
replaced). With ``--detached`` it returns once the job is submitted and
``python -m pipeline.publish`` finishes it later; with ``--dry_run=true`` and
``--runner DataflowRunner`` it prints what Dataflow would be sent and returns
before the output is touched (``pipeline.build.dry_run``). ``main`` turns every
failure into one line and an exit code.

Without ``--runner`` the job runs on Beam's FnApiRunner in this process
(add ``--direct_running_mode=multi_processing --direct_num_workers=N`` for
several worker processes); the plain DirectRunner is never chosen because
Beam 2.77 first tries to download a Prism binary.
"""

from __future__ import annotations

import logging
import sys
from typing import List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import StandardOptions, TestOptions

from common import beam_construction, corpus_dir
from common.files import to_json, write_text
from filters.presets import format_preset
from pipeline.build import dry_run, reuse
from pipeline.build.config import BuildConfig, resolve, resolve_preset
from pipeline.build.graph import build_pipeline
from pipeline.build.options import SHORT_USAGE, UsageError, is_dataflow, parse
from pipeline.funnel.accounting import READ_NAMESPACE, VERDICTS_NAMESPACE, AccountingError, counters
from pipeline.funnel import progress
from pipeline.funnel.table import format_funnel
from pipeline.publish import output_contract, publisher
from pipeline.readers.input_notes import input_notes
from pipeline.stages.eval_index import embed_eval_sets, index_digest, write_eval_index
from pipeline.write import concept_tags


def stage_notes(config: BuildConfig) -> dict:
    """What the funnel should say before the job: stages that run degraded or not at all, extra stages, the input.

    No environment is judged here: whether NSFW scored is the workers' word
    (``pipeline.stages.judge.NsfwNote``'s note replaces this one as soon as a
    record reached the stage; ``nsfw/scorer_unavailable`` counts the unscored).
    """
    from filters import nsfw

    preset = config.preset
    notes = {}
    if not nsfw.stage_enabled(preset.nsfw_threshold):
        notes["nsfw"] = "disabled: nsfw_threshold >= 1.0"
    else:
        notes["nsfw"] = (f"no record reached the stage ({preset.nsfw_model}, rejected if score >= "
                         f"{preset.nsfw_threshold})")
    notes.update({e.name: f"extra stage {e.source}: {e.description}" for e in config.extras})
    for stage, note in input_notes(config.flags.input, config.flags.input_format, config.columns).items():
        notes[stage] = f"{notes[stage]}; {note}" if stage in notes else note
    return notes


EXIT_BUILT, EXIT_FAILED, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3


def say(message: str) -> None:
    """Progress for the person at the terminal (library logging goes to the log file)."""
    print(message, flush=True)


def build_request(config: BuildConfig, expects: str, replaces, runner, argv=(), eval_digest=None) -> dict:
    """What ``pipeline.publish`` needs to finish this build, from wherever it runs; and its command line
    and directory, from which ``pipeline.select`` resolves the same config for a selection."""
    import os
    import socket
    import time

    flags = config.flags
    return {
        "version": config.version, "name": flags.name, "dataset_version": flags.version,
        "description": f"Alt-text corpus built with preset {config.preset.name!r} by pipeline.build",
        "carried": list(config.columns.carry), "concepts": config.ontology is not None,
        "expects": expects, "replaces": replaces, "keep_previous": bool(flags.keep_previous),
        "download": config.download is not None, "keep_downloads": bool(flags.download_keep),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
        "runner": str(runner), "argv": list(argv), "cwd": os.getcwd(), "webdataset": bool(flags.webdataset),
        "facts": reuse.facts_record(config, eval_digest),
    }


def save_counters(result, directory: str) -> None:
    """What the runner counted apart from the data, for the publication to reconcile with the data."""
    for namespace, path in ((READ_NAMESPACE, publisher.READ_COUNTS), (VERDICTS_NAMESPACE, publisher.VERDICT_COUNTS)):
        found = counters(result, namespace)
        if found is not None:
            write_text(FileSystems.join(directory, path), to_json(found, sort_keys=True))
    funnel_counters = counters(result)
    if funnel_counters is not None:
        write_text(FileSystems.join(directory, "stats", "metrics.json"), to_json(funnel_counters, sort_keys=True))


def run(argv: Optional[List[str]] = None) -> dict:
    """The build. Raises ``UsageError``/``OutputRefused`` (nothing touched), ``AccountingError``
    or ``PublishError`` (the job ran, nothing committed), ``CommitConflict`` or the job's own error.

    Returns the funnel (``{}`` for ``--print_preset``, ``--detached`` and ``--dry_run=true``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args, beam_args = parse(argv)
    if args.print_preset:
        print(format_preset(resolve_preset(args)))
        return {}
    beam_construction.install()  # Beam re-derives the same DoFn and option facts per transform: remembered
    config, options = resolve(args, beam_args)
    output, directory = config.output, config.version_dir
    plan = output_contract.plan_output(output, config.flags.overwrite)
    committed, previous = publisher.current(output)
    say(f"input: {len(config.input_files):,} file(s) matching {config.flags.input}")
    unfinished = [v for v in corpus_dir.list_versions(output) if v != previous]
    if unfinished:
        say(f"note: {output} holds {len(unfinished)} uncommitted build(s) ({', '.join(unfinished[-3:])}): "
            "killed, failed or still running; this build does not touch them")
    notes = stage_notes(config)
    loaded = None
    if config.eval_sets:
        say(f"embedding evaluation images: {', '.join(f'{name}={path}' for name, path in config.eval_sets)}")
        loaded = embed_eval_sets(config.eval_sets, config.embedder, config.flags.embedder,
                                 config.near_duplicate_threshold, config.preset)
    eval_digest = index_digest(loaded, config.flags.embedder, config.embedder_args, config.preset) if loaded else None
    config = reuse.with_previous(config, eval_digest)
    if config.previous is not None:
        notes["reuse"] = reuse.launcher_note(config.previous, config)
    if options.view_as(TestOptions).dry_run:  # Dataflow's translation of the job, nothing touched
        job = dry_run.build_job(config, options, notes, loaded)
        say(dry_run.summary(job, config, loaded))
        refused = dry_run.over_limit(job)
        if refused:
            raise dry_run.JobRefused(refused)
        return {}
    # Everything is checked: from here on the output is touched, inside this build's own version only.
    runner = options.view_as(StandardOptions).runner
    if output_contract.MARKER not in plan.files:
        output_contract.write_marker(output, config.flags.name)
    publisher.write_request(directory, build_request(config, committed.token, previous, runner, argv, eval_digest))
    eval_index = write_eval_index(loaded, directory, config.preset) if loaded is not None else None
    p = beam.Pipeline(options=options)
    build_pipeline(p, config, notes, eval_index)
    say(f"running the job on {runner} into {directory}")
    local = not config.flags.detached and not is_dataflow(runner)
    seconds = 0 if config.flags.quiet or not local else config.flags.progress_seconds
    with progress.ProgressBoard(config.input_files, say, seconds):  # the local runners' only progress report
        result = p.run()
        if config.flags.detached:
            say(f"submitted; when the job has finished: python -m pipeline.publish {output} --build {config.version}")
            return {}
        result.wait_until_finish()
    save_counters(result, directory)
    published = publisher.publish(output, config.version)
    funnel = published.funnel
    say(format_funnel(funnel))
    if config.ontology is not None:
        say(concept_tags.summary_line(directory))
    for line in publisher.report_lines(published):
        say(line)
    total = sum(funnel["written"].values())
    if total == 0:
        say(f"no record was written: every input record was rejected (see the funnel). "
            f"{output} is an empty corpus (0 examples per split).")
    say(f"corpus: {output} ({total:,} records, version {config.version}, committed)")
    return funnel


def main(argv: Optional[List[str]] = None) -> None:
    from common import console
    from pipeline.publish import commit as commit_lib

    command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, _ = parse(argv)  # --help and argparse's own mistakes end here
    except UsageError as error:  # a misspelling: the line names the right spelling, no usage needed
        console.error(str(error))
        sys.exit(EXIT_USAGE)
    # The command line, not a test: library chatter goes to a log file.
    log_path = console.route_library_output("build", args.log_file) if command_line else "the log"
    try:
        run(argv)
    except (UsageError, output_contract.OutputRefused) as error:
        # The mistake first, then one line of usage (argparse's full usage block is 12 lines).
        console.error(str(error))
        print(SHORT_USAGE, file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except commit_lib.CommitConflict as error:
        console.error(str(error))
        sys.exit(EXIT_CONFLICT)
    except dry_run.JobRefused as error:
        console.error(f"{error}: Dataflow would refuse this job (nothing was submitted)")
        sys.exit(EXIT_FAILED)
    except (AccountingError, publisher.PublishError) as error:
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
