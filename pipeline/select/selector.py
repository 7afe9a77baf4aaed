"""Write a selection of a built corpus's records as a new committed corpus, without judging again.

    python -m pipeline.select CORPUS --output NEW --where "model_score > 0.3 and words >= 5"
    python -m pipeline.select CORPUS --output NEW --keys keys.txt
    python -m pipeline.select CORPUS --output NEW --set min_words=5 --set nsfw_threshold=0.3

``--where`` is a pandas ``DataFrame.query`` expression over the candidate
table's columns (``docs/output.md``); ``--keys`` a file of keys, one a
line; ``--set`` tighter thresholds of the per-record rules the table
answers, re-applied as a rebuild would (``pipeline.select.thresholds``).
Each picks among the records the build wrote (the rows with a
``split``): a selection narrows a corpus, it does not let in what a rule
rejected (that takes a rebuild with other thresholds). Everything is
checked before the output is touched: the corpus is committed and has a
table, the expression names only columns of the table and gives a truth
value per row, every key is a written record of the corpus; each mistake is
one line.

The new corpus is written as a build writes one, from the same sources:
the build's own command line (kept in its ``_BUILD.json``) resolves the same
config with the selection's overrides (``--output NEW``, its ``--set`` after
the build's, nothing scored or searched again: ``pipeline.build.config.resolve``);
each table file's selected rows become light rows again, and the build's
own composites write them (``pipeline.build.graph``: ``SecondPass`` without
the build's reports, ``WriteBuildStats``, the candidate table). The second
pass (``pipeline.write.second_pass``) reads each record from its source,
checks its sha256 against the table and copies its stored picture from the
source corpus's shard at the table's offset (``pipeline.write.stored_copies``)
instead of decoding, resizing and encoding it again. The records go to the
same splits (a function of the key). The funnel, the rejection ledger, the
candidate table and the commit are a build's: the funnel's input is the
records selected (a record whose source changed since is rejected late, as
in a build), and the publication checks conservation against the new table.
The manifest's ``selected_from`` names the source version and the selection.
A relative path of the build's command line is read from the directory the
selection runs in, as the table's source paths are: run it where the build
ran.
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

from common import cli, corpus_dir
from pipeline.build.config import resolve
from pipeline.build.graph import SecondPass, WriteBuildStats, candidate_table
from pipeline.build.options import UsageError, parse
from pipeline.funnel.candidate_counts import SUMMARY_FILE
from pipeline.publish import output_contract, publisher
from pipeline.select.chosen import ReadSelection, check_keys, check_where, read_keys
from pipeline.select.thresholds import ApplyThresholds, check_thresholds
from pipeline.stages.light_rows import holding_rows
from pipeline.stages.verdicts import StagesRun
from pipeline.write.candidate_table import TableInputs

EXIT_SELECTED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Flags of the build that a selection does not take over: it writes a new output, attached, and judges nothing
#: again (the table holds the scores and the evaluation matches: no model is loaded, no set embedded).
_NOT_TAKEN = {"overwrite": False, "keep_previous": False, "detached": False, "model_score": "", "eval_images": [],
              "reuse": ""}


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m pipeline.select", allow_abbrev=False,
        description="Write a selection of a built corpus's records (a --where expression over its candidate table, "
                    "or --keys) as a new committed corpus, from the same sources, without judging again.")
    parser.add_argument("corpus", help="a corpus built by pipeline.build (its committed version is read)")
    parser.add_argument("--output", required=True, help="where the new corpus goes: a new or empty directory")
    chosen = parser.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--where", help="a pandas DataFrame.query expression over the candidate table's columns")
    chosen.add_argument("--keys", help="a file of keys, one a line: exactly these records")
    chosen.add_argument("--set", dest="overrides", action="append", metavar="NAME=VALUE",
                        help="a tighter threshold of a per-record rule the table answers (min_words, max_words, "
                             "max_word_repetition, nsfw_threshold, model_score_threshold), repeatable: the corpus "
                             "a rebuild with it writes")
    return parser


def _read_json(path: str) -> Optional[dict]:
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as handle:
        return json.loads(handle.read())


def _committed_source(corpus: str) -> str:
    """The committed version of ``corpus``; ``UsageError`` (one line) if there is none to select from."""
    path = corpus.rstrip("/") or "/"
    if "://" not in path and not os.path.isdir(path):
        raise UsageError(f"{corpus}: no such directory")
    try:
        return corpus_dir.resolve(path, flag=None)
    except corpus_dir.IncompleteCorpus as error:
        if corpus_dir.list_versions(path):  # a build's output that never committed: say what to do about it
            raise UsageError(str(error)) from None
        raise UsageError(f"{corpus}: not a committed corpus of pipeline.build") from None


def source_config(request: dict, output: str, beam_args: List[str], overrides: List[str] = ()):
    """The build's config, resolved again from its command line with the selection's overrides: ``--output``
    ``output``, ``overrides`` after the build's own ``--set``, and what a selection does not take over."""
    args, _ = parse(list(request["argv"]))
    return resolve(args, list(beam_args), overrides=dict(
        _NOT_TAKEN, output=output, overrides=[*(args.overrides or []), *overrides]))


def select(argv: Optional[List[str]] = None) -> dict:
    """The selection; returns the new corpus's funnel. Raises ``UsageError``/``OutputRefused`` (nothing touched)
    or ``AccountingError``/``PublishError`` (the job ran, nothing committed)."""
    args, beam_args = build_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    source = _committed_source(args.corpus)
    request = _read_json(FileSystems.join(source, output_contract.REQUEST))
    if request is None or not FileSystems.exists(FileSystems.join(source, "stats", "funnel.json")):
        raise UsageError(f"{args.corpus}: not a committed corpus of pipeline.build")
    summary = _read_json(FileSystems.join(source, SUMMARY_FILE))
    if summary is None:
        raise UsageError(f"{args.corpus}: its build wrote no candidate table (built before tables were written); "
                         "rebuild it to select from it")
    if not request.get("argv"):
        raise UsageError(f"{args.corpus}: its build did not record its command line; rebuild it to select from it")
    if args.where is not None:
        check_where(args.where)
        keys = None
    elif args.overrides:
        keys = None
    else:
        keys = read_keys(args.keys)
        check_keys(keys, source, summary)
    if request.get("download"):
        raise UsageError(f"{args.corpus}: a build with --download; its records are read from downloads that "
                         "its publication deleted, so a selection cannot read them again")
    output = args.output.rstrip("/") if "://" in args.output else os.path.abspath(args.output)
    config, options = source_config(request, output, beam_args, args.overrides or [])
    source_funnel = _read_json(FileSystems.join(source, "stats", "funnel.json"))
    if args.overrides:
        check_thresholds(args.overrides, source_funnel["preset"], config.preset._by_name())
    plan = output_contract.plan_output(config.output, overwrite=False, can_overwrite=False)
    if output_contract.MARKER not in plan.files:
        output_contract.write_marker(config.output, config.flags.name)
    committed, previous = publisher.current(config.output)
    if args.where is not None:
        selection = {"where": args.where}
    elif args.overrides:
        selection = {"set": list(args.overrides)}
    else:
        selection = {"keys": args.keys, "count": len(keys)}
    # The build's command line with the selection's --set after its own: it resolves to the thresholds this
    # corpus's records obey, which a later selection of it starts from and may only tighten.
    argv = list(request["argv"]) + [arg for item in args.overrides or [] for arg in ("--set", item)]
    publisher.write_request(config.version_dir, dict(
        request, argv=argv, version=config.version, expects=committed.token, replaces=previous, keep_previous=False,
        selected_from={"version": source, "selection": selection}))
    p = beam.Pipeline(options=options)
    _selection_graph(p, config, source, summary, args.where, args.keys, source_funnel, bool(args.overrides))
    p.run().wait_until_finish()
    published = publisher.publish(config.output, config.version)
    return published.funnel


def _selection_graph(p, config, source: str, summary: dict, where, keys_path, source_funnel: dict,
                     thresholds: bool = False) -> None:
    """The selected rows, written by the build's second pass, stats and candidate table."""
    files = [FileSystems.join(source, relative) for relative in sorted(summary["files"])]
    read = p | "TableFiles" >> beam.Create(files) | "ReadSelection" >> ReadSelection(
        source, where, keys_path, measured=thresholds)
    if thresholds:
        rows = holding_rows(read | "ApplyThresholds" >> ApplyThresholds(config.preset._by_name()))
        kept = holding_rows(rows | "StillKept" >> beam.Filter(lambda row: not row.reason))
        decided = holding_rows(rows | "NowRejected" >> beam.Filter(lambda row: bool(row.reason)))
    else:
        rows = kept = holding_rows(read)
        decided = None
    selected = rows | "CountSelected" >> beam.combiners.Count.Globally()
    written = SecondPass.Inputs(survivors=kept, decided_rejections=decided, row_count=selected, pairs=None) | (
        "SecondPass" >> SecondPass(config, eval_index=None, reports=False))
    # The funnel lists the source build's stages as ran: the selection stands on their verdicts.
    ran = StagesRun([stage["stage"] for stage in source_funnel.get("stages", []) if stage.get("ran")],
                    {"read": f"a selection of {source}: no rule judged again"})
    _ = WriteBuildStats.Inputs(
        input_count=selected, rejections=written.rejections, shards=written.shards, samples=written.samples,
    ) | "WriteBuildStats" >> WriteBuildStats(config, ran)
    _ = TableInputs(rows=rows, placements=written.placements, late_rejections=written.late_rejections) | (
        "CandidateTable" >> candidate_table(config))


def main(argv: Optional[List[str]] = None) -> None:
    from common import console
    from pipeline.funnel.accounting import AccountingError
    from pipeline.funnel.table import format_funnel

    command_line = argv is None
    if command_line:
        console.route_library_output("select", None)
    try:
        funnel = select(argv)
    except (UsageError, output_contract.OutputRefused) as error:
        console.error(str(error))
        sys.exit(EXIT_USAGE)
    except (AccountingError, publisher.PublishError) as error:
        console.error(f"{error}; not committed")
        sys.exit(EXIT_FAILED)
    except Exception as error:  # the job's own failure: one line here, the traceback in the log
        logging.exception("selection failed")
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        console.error(f"the selection failed: {type(error).__name__}: {first}")
        sys.exit(EXIT_FAILED)
    print(format_funnel(funnel), flush=True)
    total = sum(funnel["written"].values())
    print(f"selection: {total:,} records written", flush=True)
