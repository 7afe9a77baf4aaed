"""Build a filtered alt-text corpus: candidates in, TFDS-compatible shards out.

    python -m pipeline.build --input 'data/sample/candidates/*.parquet' \\
        --output out/corpus --preset align [--set NAME=VALUE ...] \\
        [--eval_images NAME=PATH ...] [--runner DataflowRunner ...]

The job reads like its data flow, in two passes over the sources:

    MatchInputFiles -> JudgeRecords [-> DownloadImages]                        first pass
      -> ApplyCorpusFilters -> [ModelScore] -> NearDuplicatesOfEvalImages
      -> [RemoveCorpusNearDuplicates] -> JoinVerdicts -> ChooseSamples         on light rows
      -> WriteShards                                                           second pass
      -> WriteRejectionLedger, WritePairsReport, WriteStats

The first pass reads each record once and judges it where it was read
(``pipeline.judge``): the per-record rules, NSFW, the evaluation-index
match, the pair model's score (``--model_score``); it hands on a light row
per record (``pipeline.stage_rows``). With ``--download``, the URL-list rows
go to ``DownloadImages`` (``pipeline.download.stage``): each distinct URL
fetched and its image judged once, then each row judged with its image's facts.
Every later decision is taken on light rows: the corpus-wide counts, the
near-duplicate and duplicate-pair verdicts (``pipeline.verdicts``). The
second pass (``pipeline.write``) reads the kept records again from their
files and writes the shards. Image bytes cross no shuffle. Every input
record ends either in a shard or in the funnel with its first reason
(``filters/stages.py``); the funnel's list of stages that ran is the list of
stages applied. Evaluation images are embedded in the launcher and written
to ``<output>/near_duplicates/index/`` (``pipeline.eval_index``), where the
workers read them: the job graph carries their path, not their vectors.

This module is the graph (``build_pipeline``) and the command's entry
point; the options live in ``pipeline.options``, the launcher around the
job (checks, the output contract, the console) in ``pipeline.launcher``.

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
    from pipeline.launcher import main

    sys.exit(main())

from typing import Optional

import apache_beam as beam

from filters import extra_stages
from filters.frequency import ApplyCorpusFilters
from filters.stages import REJECTED, SURVIVORS
from pipeline import concepts as concepts_lib
from pipeline import judge as judge_lib
from pipeline import stats as stats_lib
from pipeline import write as write_lib
from pipeline.download import stage as download_stage
from pipeline.download import staging
from pipeline.eval_index import EvalIndex, EvalMatchVerdicts
from pipeline.judge import JudgeFiles, NsfwNote, RecordJudge
from pipeline.near_duplicates import RemoveCorpusNearDuplicates, WritePairsReport
from pipeline.score_stage import ModelScoreVerdicts, ScoreStats
from pipeline.options import BuildOptions, embedder_args, input_columns, pair_scorer
from pipeline.read import MatchInputFiles
from pipeline.stage_rows import pool_row
from pipeline.verdicts import OVERLAPS, CountVerdicts, JoinVerdicts, StagesRun
from pipeline.what_if_stats import WhatIfStats
from pipeline.write_stats import ChooseSamples, WriteStats


def build_pipeline(
    p: beam.Pipeline, opts: BuildOptions, preset, notes: dict, eval_index: Optional[EvalIndex] = None, extras=(),
    ontology=None,
) -> StagesRun:
    """Adds the whole build to ``p``; returns the stages applied.

    ``notes`` ({stage: text}, the launcher's) go to the funnel with the
    stages' own notes; ``extras`` are extra stages (``filters.extra_stages``):
    per-record ones run in the first pass, corpus ones with the corpus filters.
    ``ontology`` (``common.ontology``) turns on the TOnICS tagging (``pipeline.concepts``).
    """
    ran = StagesRun(notes)
    columns = input_columns(opts)
    scorer = pair_scorer(opts)  # --model_score: None unless asked for
    judge = RecordJudge(preset, extra_stages.record_stages(extras), eval_index, opts.embedder, embedder_args(opts),
                        scorer=scorer)

    # First pass: every input record read once and judged once; image bytes stay in the step that read them.
    paths = p | "MatchInputFiles" >> MatchInputFiles(opts.input)
    judged = paths | "JudgeRecords" >> ran(JudgeFiles(judge, opts.input, opts.input_format, columns))
    outputs_per_part = [judged]
    rows_per_part = [judged[judge_lib.ROWS]]
    worker_notes = []  # (stage, note) made in the job
    if columns.download:
        downloaded = judged[judge_lib.TO_FETCH] | "DownloadImages" >> ran(download_stage.DownloadImages(
            judge, download_staging(opts), download_build_id(opts), download_stage.from_args(opts),
            max_record_bytes=columns.limits.max_record_bytes))
        outputs_per_part.append(downloaded)
        rows_per_part.append(downloaded[judge_lib.ROWS])
        worker_notes.append(downloaded[download_stage.NOTES])
    input_rows = rows_per_part | "InputRows" >> beam.Flatten()  # one light row per input record
    input_count = input_rows | "CountInput" >> beam.combiners.Count.Globally()
    in_the_running = input_rows | "PassedRecordStages" >> beam.Filter(lambda row: not row.reason)
    record_rejections = input_rows | "RejectedByRecordStages" >> beam.Filter(lambda row: bool(row.reason))

    # Corpus stages, on light rows only.
    counted_only = (
        record_rejections
        | "StillCounted" >> beam.Filter(lambda row: row.counted)
        | "CountedOnlyPool" >> beam.Map(pool_row)
    )
    corpus = {"survivors": in_the_running | "JudgedPool" >> beam.Map(pool_row), "counted_only": counted_only} | (
        "ApplyCorpusFilters" >> ran(ApplyCorpusFilters(preset, extras=extras, every_verdict=True)))
    # Every corpus stage's verdicts, not only a key's first: the audit's what-if needs them all.
    key_verdicts = [corpus[REJECTED] | "CountCorpusVerdicts" >> CountVerdicts("corpus_filters")]  # in stage order
    if scorer is not None:
        scored = in_the_running | "ModelScore" >> ran(ModelScoreVerdicts(preset))
        key_verdicts.append(scored[REJECTED] | "CountScoreVerdicts" >> CountVerdicts("model_score"))
    if eval_index is not None:
        key_verdicts.append(
            in_the_running
            | "NearDuplicatesOfEvalImages" >> ran(EvalMatchVerdicts(eval_index))
            | "CountEvalVerdicts" >> CountVerdicts("near_duplicate_eval"))
    if preset.dedup_in_corpus:
        earlier_verdicts = key_verdicts | "VerdictsBeforeCorpusDedup" >> beam.Flatten()
        embeddings = [part[judge_lib.EMBEDDINGS] for part in outputs_per_part] | "Embeddings" >> beam.Flatten()
        key_verdicts.append(
            {"light": in_the_running, "embeddings": embeddings, "earlier": earlier_verdicts}
            | "RemoveCorpusNearDuplicates" >> ran(RemoveCorpusNearDuplicates(
                preset, corpus_dedup_threshold(preset, eval_index, opts), opts.embedder))
            | "CountCorpusDedupVerdicts" >> CountVerdicts("near_duplicate_corpus"))
    all_key_verdicts = key_verdicts | "KeyVerdicts" >> beam.Flatten()
    rank = extra_stages.stage_rank(extras)
    joined = (in_the_running, all_key_verdicts, corpus["lowest_ngram_counts"]) | "JoinVerdicts" >> ran(
        JoinVerdicts(rank, overlaps=scorer is not None))
    _ = {"fates": joined["fates"], "record_rejections": record_rejections, "group_counts": corpus["group_counts"],
         "vocabulary": corpus["vocabulary"]} | "WhatIfStats" >> WhatIfStats(
        opts.output, preset, [name for name, _ in extra_stages.stage_list(extras)], rank)
    decided_rejections = (record_rejections, joined[REJECTED]) | "DecidedRejections" >> beam.Flatten()

    # Second pass: the kept records read again from their files and written; the audit's samples on the way.
    samples = decided_rejections | "ChooseSamples" >> ChooseSamples()
    written = (joined[SURVIVORS], samples) | "WriteShards" >> write_lib.WriteShards(
        opts.output, opts.name, preset, columns, columns.carry, ontology, getattr(opts, "concept_labels_column", ""))
    rejections = (decided_rejections, written[REJECTED]) | "AllRejections" >> beam.Flatten()

    _ = (rejections, input_count) | "WriteRejectionLedger" >> write_lib.WriteRejectionLedger(opts.output)
    if eval_index is not None:
        pairs = [part[judge_lib.PAIRS] for part in outputs_per_part] | "EvalPairs" >> beam.Flatten()
        _ = (pairs, rejections) | "WritePairsReport" >> WritePairsReport(eval_index.directory, opts.output)
    if ontology is not None:
        _ = written["concepts"] | "ConceptStats" >> concepts_lib.WriteConceptStats(
            opts.output, ontology, getattr(opts, "concept_labels_column", ""))
    written_per_split = (
        written[write_lib.SHARDS]
        | "RecordsPerShard" >> beam.Map(lambda shard: (shard[0], shard[2]["records"]))
        | "WrittenPerSplit" >> beam.CombinePerKey(sum)
    )
    measures = [part[judge_lib.MEASURES] for part in outputs_per_part] | "Measures" >> beam.Flatten()
    histograms = measures | "Distributions" >> stats_lib.SumHistograms()
    nsfw_outcomes = [part[judge_lib.NSFW_OUTCOMES] for part in outputs_per_part] | "NsfwOutcomes" >> beam.Flatten()
    worker_notes.append(nsfw_outcomes | "NsfwNote" >> NsfwNote(preset.nsfw_threshold))
    corpus_stats = corpus["stats"]
    if scorer is not None:  # the scores' histogram with the cut, and what the score alone would have caught
        score_stats = (scored["cut"], scored["histogram"], rejections, joined[OVERLAPS]) | "ModelScoreStats" >> (
            ScoreStats(scorer.check(), preset))
        corpus_stats = (corpus_stats, score_stats["distribution"]) | "CorpusAndScoreStats" >> beam.Flatten()
        worker_notes.append(score_stats["note"])
    stage_notes_made_by_workers = worker_notes | "StageNotes" >> beam.Flatten()
    meta = {"ran": ran.names, "notes": ran.notes, "dataset": opts.name, "preset": preset, "extras": tuple(extras)}
    _ = (input_count, rejections, written_per_split, histograms, corpus_stats, written[write_lib.SAMPLES],
         stage_notes_made_by_workers) | "WriteStats" >> WriteStats(opts.output, meta)
    return ran


def download_staging(opts) -> str:
    """Where downloads are staged: ``OUTPUT/_downloads``, shared by the output's builds (the launcher says where)."""
    return getattr(opts, "download_staging", "") or staging.directory(opts.output)


def download_build_id(opts) -> str:
    """The build id that names this build's staging files (the launcher's version id; else a fresh one)."""
    from pipeline.output import new_version_id
    import uuid

    return getattr(opts, "build_id", "") or new_version_id(uuid.uuid4().hex[:8])


def corpus_dedup_threshold(preset, eval_index: Optional[EvalIndex], opts) -> float:
    """The in-corpus dedup's cosine: the evaluation index's when there is one, else the embedder's."""
    from pipeline import dedup_options

    if eval_index is not None:
        return eval_index.threshold
    return dedup_options.resolve_threshold(preset, dedup_options.embedder(opts.embedder, embedder_args(opts)))
