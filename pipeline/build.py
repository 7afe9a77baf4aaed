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

This module is the graph (``build_pipeline``) and the command's entry
point; the stages live in ``pipeline.read``, ``pipeline.record_stages``,
``filters.frequency``, ``pipeline.near_duplicates``, ``pipeline.verdicts``,
``pipeline.write`` and ``pipeline.write_stats``; the options in
``pipeline.options``; the launcher around the job (checks, the output
contract, the console) in ``pipeline.launcher``.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # ``python -m pipeline.build`` runs this file as ``__main__``. Run the
    # module imported by its real name instead, before this copy defines
    # anything: whatever the job pickles must refer to ``pipeline.build``
    # (with ``--pickle_library=dill`` a ``__main__`` class or function is a
    # NameError on a worker), and Beam allows one ``BuildOptions`` class.
    from pipeline.launcher import main

    sys.exit(main())

from typing import Optional

import apache_beam as beam

from filters import extra_stages, nsfw
from filters.frequency import ApplyCorpusFilters
from pipeline import concepts as concepts_lib
from pipeline import stats as stats_lib
from pipeline.download import stage as download_stage
from pipeline import write as write_lib
from pipeline.eval_index import EvalIndex
from pipeline.near_duplicates import PAIRS, RemoveNearDuplicates, WritePairsReport
from pipeline.options import BuildOptions, embedder_args, input_columns
from pipeline.read import ReadCandidates
from pipeline.record_stages import COUNTED, MEASURES, ApplyRecordFilters, ScorePornography
from pipeline.stage_rows import light_row, row_key
from pipeline.verdicts import REJECTED, SURVIVORS, DropKeys, JoinVerdicts, StagesRun
from pipeline.write_stats import WriteStats


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
