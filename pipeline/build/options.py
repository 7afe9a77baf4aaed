"""The build's command line: where every flag is declared (``BuildOptions``), its parser, and Beam's options.

``BuildOptions`` is a Beam ``PipelineOptions`` subclass, Beam's idiom for a
job's own flags; the ``--download*`` and ``--read_max_*`` groups are declared
beside the code they configure (``pipeline.download.settings``,
``pipeline.readers.limits``). A flag is declared once, here or there;
``pipeline.build.config.resolve`` turns the parsed flags into the one
``BuildConfig`` that the launcher and the job graph read.
"""

from __future__ import annotations

import argparse
import os
from typing import List

from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions, TestOptions

from common import cli
from pipeline.download import settings as download_settings
from pipeline.readers import limits as read_limits

LOCAL_RUNNER = "FnApiRunner"


class UsageError(Exception):
    """An invalid argument: reported in one line with the usage; nothing was touched."""


class BuildOptions(PipelineOptions):
    """The project's flags; everything else goes to Beam (runner, project, ...)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--input", help="glob of input files or directories (local or gs://); see docs/building.md")
        parser.add_argument(
            "--input_format", default=None,
            help="read every data file as this format instead of by its name: parquet, webdataset, tsv, jsonl, tfrecord",
        )
        parser.add_argument("--url_col", default="", help="input column/field of the URL (default: url)")
        parser.add_argument(
            "--caption_col", default="",
            help="input column/field of the alt-text (default: first of caption, alt_text, text, texts)",
        )
        parser.add_argument(
            "--image_col", default="",
            help="input column/field of the image bytes (default: first of jpg, image, png, webp, jpeg)",
        )
        parser.add_argument(
            "--carry_columns", default="",
            help="comma-separated input columns written to the shards as source_<column> (key and sha256 always are)",
        )
        parser.add_argument(
            "--tsv_columns", default="",
            help="column names of a headerless TSV, in order (default url,caption as CC12M; CC3M is caption,url)",
        )
        parser.add_argument(
            "--layout", default="flat", choices=("flat", "tfds"),
            help="flat: the corpus in --output; tfds: in --output/NAME/VERSION/, so tfds.builder(NAME, data_dir=OUTPUT) loads it",
        )
        parser.add_argument("--version", default="1.0.0", help="dataset version (the VERSION directory of --layout tfds)")
        parser.add_argument(
            "--webdataset", action="store_true",
            help="also write the records as WebDataset tars in img2dataset's layout (SPLIT/00000.tar: KEY.jpg, KEY.txt, "
                 "KEY.json), the same records as the TFRecord shards, for PyTorch trainers (open_clip)")
        parser.add_argument("--output", help="directory to write, a literal path (local or gs://); see --layout")
        parser.add_argument("--preset", default="align", help="filter preset: align (default) or cc12m")
        parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                            help="override one preset threshold (repeatable; names and ranges: --print_preset)")
        parser.add_argument(
            "--stage", dest="extra_stages", action="append", default=[], metavar="MODULE:ATTRIBUTE",
            help="an extra stage, per-record or corpus (filters.extra_stages), e.g. filters.language:ENGLISH (repeatable)")
        parser.add_argument("--name", default="alt_text_corpus",
                            help="dataset name, the start of every shard file name (letters, digits, '_')")
        parser.add_argument(
            "--eval_images", action="append", default=[], metavar="NAME=PATH",
            help="evaluation image set whose near-duplicates are removed: a folder of images, TFDS shards "
                 "or Parquet (repeatable)",
        )
        parser.add_argument("--embedder", default="dct",
                            help="image embedder for near-duplicate search: dct (default, no model) or checkpoint")
        parser.add_argument(
            "--embedder_arg", dest="embedder_args", action="append", default=[], metavar="KEY=VALUE",
            help="constructor argument of the embedder (JSON values; repeatable), e.g. workdir=gs://b/run for "
                 "checkpoint, whose workers need the 'train' extra (docs/dataflow.md)")
        parser.add_argument(
            "--model_score", default="", metavar="MODEL",
            help="score each pair that passes the per-record rules with a two-tower image-text model and record "
                 "the cosine: 'checkpoint' (a trainer.train run, --model_score_arg workdir=DIR) or a model a "
                 "module registers (MODULE:NAME, filters.model_score); the cuts are the preset's "
                 "model_score_threshold and model_score_top_fraction (docs/model-score.md)")
        parser.add_argument(
            "--model_score_arg", dest="model_score_args", action="append", default=[], metavar="KEY=VALUE",
            help="constructor argument of the --model_score model (JSON values; repeatable), e.g. workdir=out/train, "
                 "step=1200, batch_size=128")
        parser.add_argument(
            "--concepts", default="", metavar="ONTOLOGY",
            help="TOnICS: tag written pairs with the classes their alt-text names: 'default' (built-in English "
                 "ontology) or a JSON ontology file; writes the concepts feature and concepts/ index (docs/tonics.md)")
        parser.add_argument(
            "--concept_labels_column", default="",
            help="with --concepts: a carried column of detector labels per image; a class is tagged only if "
                 "the text names it and the labels contain it")
        parser.add_argument("--overwrite", action="store_true",
                            help="replace the corpus a previous build wrote in --output: its files are deleted "
                                 "only after the new one is committed")
        parser.add_argument("--keep_previous", action="store_true",
                            help="with --overwrite: keep the replaced corpus's files (under --output/versions/)")
        parser.add_argument("--reuse", default="", metavar="OLD",
                            help="a previous committed corpus of the same input: its candidate table's facts "
                                 "(hashes, NSFW scores, evaluation matches, stored pictures) are reused where the "
                                 "bytes are the same; writes what a full build writes (docs/building.md)")
        parser.add_argument("--detached", action="store_true",
                            help="return once the job is submitted; publish it when it has finished with "
                                 "'python -m pipeline.publish OUTPUT' (from any machine)")
        parser.add_argument(
            "--nsfw_accelerator", default="", metavar="ACCELERATOR",
            help="score NSFW in a step of its own (Beam's RunInference) on workers with this accelerator, "
                 "Dataflow's syntax, e.g. 'type:nvidia-tesla-t4;count:1;install-nvidia-driver'; the rest of "
                 "the job stays on CPU workers (docs/dataflow.md)")
        download_settings.add_arguments(parser)
        read_limits.add_arguments(parser)



EPILOG = """\
Every other --flag goes to Apache Beam (--runner, --project, --region,
--temp_location, --setup_file, --direct_running_mode, --direct_num_workers, ...).
With --runner DataflowRunner, --dry_run=true builds the Dataflow job, prints what
it would run, install and write, and submits nothing (docs/dataflow.md).

Output contract: --output is a literal directory (glob characters are
characters). It must not equal, contain or lie inside an input location. An
existing non-empty output is refused unless --overwrite is given, and then only
if it is a corpus a previous build wrote and holds nothing else. The job writes
into OUTPUT/versions/<id>/; the build becomes the corpus when OUTPUT/dataset_info.json
naming it is written, last, in one write (tfds.builder_from_directory(OUTPUT) reads it).
Only then are the replaced corpus's files deleted (kept with --keep_previous).
A build that fails leaves the previous corpus as it was.

Exit codes: 0 built (also when no record was written: an empty corpus) or,
with --detached, submitted; 1 the job failed or its counts do not reconcile
(not committed), 2 invalid arguments or unsafe output (nothing was touched),
3 another build committed to the output while this one ran (this one's version
is kept: python -m pipeline.publish OUTPUT --build ID --replace)."""


SHORT_USAGE = ("usage: python -m pipeline.build --input GLOB --output DIR [--preset align|cc12m] "
               "[--set NAME=VALUE ...] [--overwrite] (--help lists every option)")



def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: a number of seconds >= 0")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m pipeline.build",
        description="Build a filtered alt-text corpus: img2dataset-style Parquet in, TFDS-compatible shards out.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    BuildOptions._add_argparse_args(parser)
    parser.add_argument("--print_preset", action="store_true",
                        help="print every threshold of the preset (after --set) with its meaning, and exit")
    parser.add_argument("--log_file", default=None,
                        help="where library logging goes (default: $ALT_TEXT_CORPUS_LOG_DIR/build.log or a temp dir)")
    parser.add_argument("--progress_seconds", type=_seconds, default=5.0,
                        help="a local job's progress (pass, files, records, rate, ETA) on the console at most this "
                             "often; 0: none (default 5)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines: the funnel, the result and errors only")
    return parser


def beam_parser() -> argparse.ArgumentParser:
    """Beam's own parser (value-provider arguments) with every Beam option; its errors are ``UsageError``."""
    from apache_beam.options import pipeline_options as po

    class Parser(po._BeamArgumentParser):
        def error(self, message):
            raise UsageError(message)

    parser = Parser(allow_abbrev=False)
    seen = {}
    for cls in PipelineOptions.__subclasses__():
        if cls is not BuildOptions:
            seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)
    return parser


def check_spelling(argv: List[str]) -> None:
    """``UsageError`` naming the underscore spelling of the first hyphenated option, the build's or Beam's.

    Beam would take a hyphenated spelling of its own option for an unknown
    flag, and argparse one of ours for a prefix of nothing: one line that
    names the right spelling says more than either.
    """
    known = set(build_parser()._option_string_actions) | set(beam_parser()._option_string_actions)
    found = cli.misspelled(argv, known)
    if found:
        raise UsageError(cli.spelling_message(*found))


def beam_options(beam_args: List[str]) -> PipelineOptions:
    """Beam's options from the remaining flags; an unknown flag is an error, not a warning."""
    parser = beam_parser()
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
            runner_object = create_runner(runner)  # an unknown name fails here, before the output is touched
        except ValueError:
            raise UsageError(f"--runner {runner}: unknown runner (e.g. FnApiRunner, DataflowRunner)") from None
        check_for_runner(options, runner_object)
    setup = options.view_as(SetupOptions)
    setup.save_main_session = False
    if setup.setup_file:  # Beam changes into its directory, which for a bare "setup.py" is "" (an error)
        setup.setup_file = os.path.abspath(setup.setup_file)
    test = options.view_as(TestOptions)
    test.dry_run = dry_run_value(test.dry_run)
    if test.dry_run and not is_dataflow(runner):
        raise UsageError(f"--dry_run=true checks a Dataflow launch (pipeline.build.dry_run): add --runner DataflowRunner "
                         f"--project PROJECT --region REGION --temp_location gs://BUCKET/tmp (runner: {runner})")
    return options


def check_for_runner(options, runner) -> None:
    """Beam's own checks of its options for ``runner`` (a Dataflow launch without ``--project``, ...), as one line.

    ``beam.Pipeline`` makes them too, but only once the launcher has written
    to the output, and its message puts the errors after a line break.
    """
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator

    errors = PipelineOptionsValidator(options, runner).validate()
    if errors:
        raise UsageError("; ".join(" ".join(error.split()) for error in errors))


#: Beam declares ``--dry_run`` as a string option, so its runner would take ``--dry_run=false`` for a yes.
DRY_RUN_VALUES = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def dry_run_value(value) -> bool:
    """``--dry_run``'s value as a yes or no; ``UsageError`` for anything else."""
    if isinstance(value, bool):
        return value
    try:
        return DRY_RUN_VALUES[str(value).strip().lower()]
    except KeyError:
        raise UsageError(f"--dry_run {value!r}: true or false") from None


def is_dataflow(runner) -> bool:
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1].lower() in ("dataflowrunner", "dataflow")



def parse(argv: List[str]):
    """``(the build's flags, Beam's flags)`` from a command line; a misspelling or argparse's own mistake first."""
    check_spelling(argv)
    return build_parser().parse_known_args(argv)
