"""The build's one resolved configuration: every flag checked, every object it names made, once.

    args, beam_args = options.parse(argv)
    config, beam_options = resolve(args, beam_args)

``resolve`` is the build's validation: a flag that cannot be honoured is a
``UsageError`` (one line) before the output is touched, and what it names
(the preset with its overrides, the extra stages, the input columns and read
limits, the download settings, the evaluation sets, the embedder and the
near-duplicate threshold it implies, the pair model, the TOnICS ontology,
the corpus and version directories) is made here and nowhere else. The
launcher and the job graph read the frozen ``BuildConfig``; nothing
downstream parses, defaults or rebuilds a flag.

A run derived from a build (``pipeline.select``) resolves the build's
command line with ``overrides``: flag values that replace those given
(its output, the thresholds it tightens, what it does not do again).

Every declared flag is on ``config.flags`` as given, or as ``overrides``
replaced it (``Flags``, read-only): a new option is its declaration
(``pipeline.build.options``) and the code that reads ``config.flags.<name>``;
one that needs checking or turns into an object gets a field here, resolved
in ``resolve``.
"""

from __future__ import annotations

import dataclasses
import re
import types
import uuid
from typing import Mapping, Optional, Tuple

from apache_beam.io.filesystems import FileSystems

from common import corpus_dir
from filters import extra_stages
from filters.presets import Preset, PresetError, get_preset
from pipeline.build.options import UsageError, beam_options
from pipeline.download import settings as download_settings
from pipeline.download.settings import DownloadOptions
from pipeline.readers import limits as read_limits
from pipeline.readers.rows import Columns, make_columns

#: An evaluation set's name: it ends the reason ``near_duplicate_eval/NAME`` (a ``/`` would start another part).
SET_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class Flags:
    """The build's flags as parsed (argparse's defaults filled in): read-only attributes, no defaults of its own."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, object]):
        object.__setattr__(self, "_values", types.MappingProxyType(dict(values)))

    def __getattr__(self, name: str):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"the build declares no flag {name!r} (pipeline.build.options)") from None

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"build flags are read-only: --{name}")

    def __reduce__(self):
        return Flags, (dict(self._values),)

    def __repr__(self) -> str:
        return f"Flags({dict(self._values)!r})"


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Everything a build was asked for, resolved: what the launcher and the job graph read."""

    flags: Flags
    preset: Preset
    extras: tuple                       # extra stages, the preset's then --stage's (filters.extra_stages)
    columns: Columns                    # input columns, carried columns, read limits, whether to download
    download: Optional[DownloadOptions]  # --download's settings; None without --download
    embedder_args: Tuple[tuple, ...]    # --embedder_arg as sorted (key, value) pairs (part of the graph)
    embedder: object                    # --embedder made with them (dedup.embedders): this process's one
    near_duplicate_threshold: float     # the cosine above which two images are near-duplicates (both searches)
    eval_sets: Tuple[Tuple[str, str], ...]  # --eval_images as (name, path), names distinct
    scorer: object                      # --model_score as a filters.model_score.PairScorer, loaded; or None
    ontology: object                    # --concepts as a common.ontology.Ontology; or None
    input_files: Tuple[str, ...]        # what --input matches now (the job matches again on the workers)
    output: str                         # the corpus directory: --output, or OUTPUT/NAME/VERSION (--layout tfds)
    version: str                        # this build's version id
    version_dir: str                    # OUTPUT/versions/<version>: everything the job writes
    download_staging: str               # OUTPUT/_downloads: downloads shared by the output's builds
    previous: object = None             # --reuse as a pipeline.readers.previous_build.PreviousBuild (the launcher
    #                                     resolves it once the evaluation index is embedded); None without it
    nsfw_accelerator: str = ""          # --nsfw_accelerator checked: the scoring step's accelerator; "" fused


def resolve_preset(flags) -> Preset:
    """The preset with ``--set``'s overrides (``UsageError`` names the parameter)."""
    try:
        return get_preset(flags.preset, flags.overrides)
    except PresetError as error:
        raise UsageError(str(error)) from None


def corpus_directory(output: str, layout: str, name: str, version: str) -> str:
    """Where the corpus goes: ``output`` (flat) or ``output/NAME/VERSION`` (TFDS's by-name layout)."""
    if layout == "tfds":
        return FileSystems.join(output, name, version)
    return output


def _columns(flags) -> Columns:
    """Which input columns hold what, and which are carried (with ``--download``, its HTTP status and final URL too)."""
    carry = [c.strip() for c in flags.carry_columns.split(",")]
    if flags.download:
        carry += list(download_settings.CARRIED)
    columns = make_columns(flags.url_col, flags.caption_col, flags.image_col, carry, flags.tsv_columns)
    return columns._replace(download=bool(flags.download), limits=read_limits.from_options(flags))


def _exists(path: str) -> bool:
    """A file, a glob's matches or a folder's files: on GCS a folder is no object of its own, only a prefix."""
    if FileSystems.exists(path):
        return True
    pattern = path if any(ch in path for ch in "*?[") else path.rstrip("/") + "/**"
    try:
        return any(result.metadata_list for result in FileSystems.match([pattern]))
    except Exception:  # Beam raises BeamIOError for a pattern it cannot list at all
        return False


def _eval_sets(specs) -> Tuple[Tuple[str, str], ...]:
    sets = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--eval_images {spec!r}: expected NAME=PATH")
        if not SET_NAME.match(name):
            raise UsageError(f"--eval_images {spec!r}: the set name {name!r} may hold letters, digits, '_', '-' "
                             "and '.' only (it names the rejection reason near_duplicate_eval/NAME)")
        if name in dict(sets):
            raise UsageError(f"--eval_images {spec!r}: the set name {name!r} is given twice (each set names its "
                             "own rejection reason near_duplicate_eval/NAME)")
        if not _exists(path):
            raise UsageError(f"--eval_images {spec!r}: {path} does not exist")
        sets.append((name, path))
    return tuple(sets)


def _embedder(flags) -> Tuple[Tuple[tuple, ...], object]:
    """``(--embedder_arg as sorted pairs, the embedder)``: the one this process embeds with."""
    from dedup import embedders, preset_options

    if flags.embedder not in embedders.names():
        raise UsageError(f"--embedder {flags.embedder!r}: known embedders are {', '.join(embedders.names())}")
    try:
        parsed = tuple(sorted(embedders.parse_args(flags.embedder_args).items()))
        embedder = preset_options.embedder(flags.embedder, parsed)  # e.g. checkpoint without workdir=
        if hasattr(embedder, "check"):  # a trained checkpoint: missing or damaged is refused before the job
            embedder.check()
    except (TypeError, ValueError) as error:
        raise UsageError(f"--embedder {flags.embedder}: {error}") from None
    return parsed, embedder


def _pair_scorer(flags, preset):
    """The ``--model_score`` model, loaded (one line if it cannot be), and the preset's score cuts checked against it."""
    from filters import model_score
    from filters.score_cut import cut_values

    if not flags.model_score:
        cuts = [name for name, value in zip(("model_score_threshold", "model_score_top_fraction"),
                                            cut_values(preset)) if value is not None]
        if cuts:
            raise UsageError(f"{' and '.join(cuts)} cut by a model's scores: name the model with --model_score "
                             "(e.g. --model_score checkpoint --model_score_arg workdir=DIR)")
        if flags.model_score_args:
            raise UsageError("--model_score_arg needs --model_score")
        return None
    try:
        scorer = model_score.PairScorer(flags.model_score, **model_score.parse_args(flags.model_score_args))
    except (TypeError, ValueError) as error:
        raise UsageError(f"--model_score {flags.model_score}: {error}") from None
    try:
        scorer.check()
    except (TypeError, ValueError) as error:  # a checkpoint's problems are one-line ValueErrors (trainer.pair_score)
        raise UsageError(f"--model_score {flags.model_score}: {error}") from None
    return scorer


def _nsfw_accelerator(flags, preset) -> str:
    """``--nsfw_accelerator`` checked against the build it splits (``pipeline.stages.nsfw_inference``)."""
    from filters import nsfw
    from pipeline.stages.nsfw_inference import parse_accelerator

    if not flags.nsfw_accelerator:
        return ""
    try:
        accelerator = parse_accelerator(flags.nsfw_accelerator)
    except ValueError as error:
        raise UsageError(f"--nsfw_accelerator {flags.nsfw_accelerator!r}: {error}") from None
    if not nsfw.stage_enabled(preset.nsfw_threshold):
        raise UsageError("--nsfw_accelerator: the NSFW stage is off (nsfw_threshold >= 1.0): nothing to score")
    if flags.download:
        raise UsageError("--nsfw_accelerator with --download: the download step scores its own images; "
                         "drop one of the two")
    return accelerator


def _ontology(flags):
    if not flags.concepts:
        return None
    from common.ontology import OntologyError, load

    try:
        return load(flags.concepts)
    except OntologyError as error:
        raise UsageError(f"--concepts: {error}") from None


def resolve(args, beam_args=(), overrides: Optional[Mapping[str, object]] = None) -> tuple:
    """``(BuildConfig, Beam's PipelineOptions)`` from parsed flags, or ``UsageError``; nothing is written.

    ``overrides``: flag values that replace the parsed ones (a run derived
    from a build's command line, e.g. a selection's output). The checks run
    in the order a person fixes a command line: Beam's flags, the required
    ones, names and formats, the input and output locations, and last the
    pair model (it loads the model).
    """
    from dedup import preset_options
    from pipeline import readers
    from pipeline.publish import output_contract
    from pipeline.readers.input_files import list_input_files

    flags = Flags({**vars(args), **(overrides or {})})
    beam = beam_options(list(beam_args))
    if not flags.input or not flags.output:
        raise UsageError("--input and --output are required")
    problem = output_contract.valid_dataset_name(flags.name)
    if problem:
        raise UsageError(problem)
    preset = resolve_preset(flags)
    if flags.input_format and flags.input_format not in readers.FORMATS:
        raise UsageError(f"--input_format {flags.input_format!r}: one of {', '.join(readers.FORMATS)}")
    if not re.match(r"^\d+\.\d+\.\d+$", flags.version or ""):
        raise UsageError(f"--version {flags.version!r}: expected MAJOR.MINOR.PATCH, e.g. 1.0.0")
    try:
        columns = _columns(flags)
        download = download_settings.from_args(flags) if flags.download else None
    except ValueError as error:
        raise UsageError(str(error)) from None
    if flags.concept_labels_column and not flags.concepts:
        raise UsageError("--concept_labels_column needs --concepts")
    if flags.concept_labels_column and flags.concept_labels_column not in columns.carry:
        raise UsageError(f"--concept_labels_column {flags.concept_labels_column!r}: also name it in --carry_columns")
    nsfw_accelerator = _nsfw_accelerator(flags, preset)
    embedder_args, embedder = _embedder(flags)
    eval_sets = _eval_sets(flags.eval_images)
    files = list_input_files(flags.input)
    if not files:
        raise UsageError(f"--input {flags.input} matches no files")
    try:
        output_contract.check_location(flags.output, [output_contract.input_location(flags.input)]
                                       + [path for _, path in eval_sets])
    except output_contract.OutputRefused as error:
        raise UsageError(str(error)) from None
    scorer = _pair_scorer(flags, preset)
    try:
        extras = extra_stages.load_all(tuple(preset.extra_stages) + tuple(flags.extra_stages))
    except ValueError as error:
        raise UsageError(str(error)) from None
    ontology = _ontology(flags)
    output = corpus_directory(flags.output, flags.layout, flags.name, flags.version).rstrip("/")
    version = output_contract.new_version_id(uuid.uuid4().hex[:8])
    config = BuildConfig(
        flags=flags, preset=preset, extras=extras, columns=columns, download=download,
        embedder_args=embedder_args, embedder=embedder,
        near_duplicate_threshold=preset_options.resolve_threshold(preset, embedder), eval_sets=eval_sets,
        scorer=scorer, ontology=ontology, input_files=tuple(files),
        output=output, version=version, version_dir=corpus_dir.version_dir(output, version),
        download_staging=FileSystems.join(output, output_contract.DOWNLOADS), nsfw_accelerator=nsfw_accelerator,
    )
    return config, beam
