"""The build's job graph: candidates in, TFDS-compatible shards and their stats out.

It reads like its data flow, two passes over the sources with every decision
taken in between on light rows:

    FirstPass       MatchInputFiles -> JudgeRecords [-> DownloadImages]
    CorpusStages    ApplyCorpusFilters [-> ModelScore] [-> NearDuplicatesOfEvalImages]
                    [-> RemoveCorpusNearDuplicates]                      -> key verdicts
    DecideFates     JoinVerdicts (first reason wins, one row per pair), WhatIfStats
    SecondPass      ChooseSamples -> WriteShards -> WriteRejectionLedger [, WritePairsReport, ConceptStats,
                    WriteNsfwGallery]
    CandidateTable  every input record's facts and fate -> stats/candidates/
    WriteBuildStats the funnel, distributions, samples and stage notes -> stats/

The first pass reads each record once and judges it where it was read
(``pipeline.stages.judge``: the per-record rules, NSFW, the evaluation-index
match, the pair model's score); it hands on one light row per record
(``pipeline.stages.light_rows``). With ``--download`` the URL-list rows go to
``DownloadImages`` (``pipeline.download.stage``): each distinct URL fetched
and judged once, then each row judged with its image's facts. The corpus
stages see light rows only and give ``(key, reason)`` verdicts
(``pipeline.stages.verdicts``). The second pass (``pipeline.write``) reads
the kept records again from their files and writes the shards. Image bytes
cross no shuffle. Every input record ends in a shard or in the funnel with
its first reason (``filters.stages``); the funnel's list of the stages that
ran is the list of stages applied (``StagesRun``). Evaluation images are
embedded by the launcher and written under the version
(``pipeline.stages.eval_index``), where the workers read them: the graph
carries their path, not their vectors.

Every composite takes the resolved ``BuildConfig`` (``pipeline.build.config``)
and hands its DoFns only the values they use.
"""

from __future__ import annotations

from typing import Optional

import apache_beam as beam

from dedup import preset_options
from filters import extra_stages, nsfw
from filters.frequency import ApplyCorpusFilters, pool_row
from filters.stages import REJECTED, SURVIVORS
from pipeline.build.config import BuildConfig
from pipeline.download.stage import NOTES, DownloadImages
from pipeline.funnel.accounting import records_of
from pipeline.funnel.counts import SumHistograms
from pipeline.funnel.stats_files import ChooseSamples, WriteStats
from pipeline.readers.input_files import MatchInputFiles
from pipeline.stages import judge as judge_lib
from pipeline.stages.eval_index import EvalIndex, EvalMatchVerdicts
from pipeline.stages.judge import JudgeFiles, NsfwNote, RecordJudge
from pipeline.stages.near_duplicates import RemoveCorpusNearDuplicates, WritePairsReport
from pipeline.stages.score_verdicts import ModelScoreVerdicts, ScoreStats
from pipeline.stages.verdicts import OVERLAPS, CountVerdicts, JoinVerdicts, StagesRun
from pipeline.what_if.collect import WhatIfStats
from pipeline.write.candidate_table import WriteCandidateTable
from pipeline.write.concept_tags import WriteConceptStats
from pipeline.write.ledger import WriteRejectionLedger
from pipeline.write.nsfw_gallery import WriteNsfwGallery
from pipeline.write.second_pass import SHARDS, WRITTEN, WriteShards
from pipeline.write.tar_shards import TFRECORD, WEBDATASET

#: The first pass's side outputs, one PCollection each per part (the file judge, the download stage).
SIDE_OUTPUTS = (judge_lib.MEASURES, judge_lib.PAIRS, judge_lib.EMBEDDINGS, judge_lib.NSFW_OUTCOMES)


def build_pipeline(p: beam.Pipeline, config: BuildConfig, notes: dict,
                   eval_index: Optional[EvalIndex] = None) -> StagesRun:
    """Adds the whole build to ``p``; returns the stages applied (with ``notes``, the launcher's, for the funnel)."""
    ran = StagesRun(notes)
    judge = RecordJudge(config.preset, extra_stages.record_stages(config.extras), eval_index, config.flags.embedder,
                        config.embedder_args, scorer=config.scorer)
    records = p | "FirstPass" >> FirstPass(config, judge, ran)
    verdicts = records | "CorpusStages" >> CorpusStages(config, eval_index, ran)
    fates = {**records, **verdicts} | "DecideFates" >> DecideFates(config, ran)
    written = {**records, **fates} | "SecondPass" >> SecondPass(config, eval_index)
    _ = {**records, **verdicts, **fates, **written} | "WriteBuildStats" >> WriteBuildStats(config, ran)
    _ = {**records, **verdicts, **written} | "CandidateTable" >> WriteCandidateTable(
        config.version_dir, extra_stages.stage_rank(config.extras))
    return ran


class FirstPass(beam.PTransform):
    """``--input`` -> ``{"rows": one light row per input record, "input_count", "row_count", "in_the_running",
    "record_rejections", "embeddings", "measures", "pairs", "nsfw", "notes"}``.

    ``input_count`` is what the funnel counts (a reader's marker as the rows it stands for, so the input is
    what the files state), ``row_count`` the rows themselves.
    """

    def __init__(self, config: BuildConfig, judge: RecordJudge, ran: StagesRun):
        super().__init__()
        self.config, self.judge, self.ran = config, judge, ran

    def expand(self, pbegin):
        config, ran = self.config, self.ran
        paths = pbegin | "MatchInputFiles" >> MatchInputFiles(config.flags.input)
        judged = paths | "JudgeRecords" >> ran(
            JudgeFiles(self.judge, config.flags.input, config.flags.input_format, config.columns))
        parts, notes = [judged], []
        if config.download is not None:
            downloaded = judged[judge_lib.TO_FETCH] | "DownloadImages" >> ran(DownloadImages(
                self.judge, config.download_staging, config.version, config.download,
                max_record_bytes=config.columns.limits.max_record_bytes))
            parts.append(downloaded)
            notes.append(downloaded[NOTES])
        rows = [part[judge_lib.ROWS] for part in parts] | "InputRows" >> beam.Flatten()
        outputs = {tag: [part[tag] for part in parts] | f"All{tag.title()}" >> beam.Flatten() for tag in SIDE_OUTPUTS}
        return {
            "rows": rows,
            "input_count": rows | "RecordsOfRow" >> beam.Map(records_of) | "CountInput" >> beam.CombineGlobally(sum),
            "row_count": rows | "CountRows" >> beam.combiners.Count.Globally(),
            "in_the_running": rows | "PassedRecordStages" >> beam.Filter(lambda row: not row.reason),
            "record_rejections": rows | "RejectedByRecordStages" >> beam.Filter(lambda row: bool(row.reason)),
            "download_notes": notes | "DownloadNotes" >> beam.Flatten(pipeline=pbegin.pipeline),
            **outputs,
        }


class CorpusStages(beam.PTransform):
    """The first pass's rows -> ``{"key_verdicts": (key, reason) of every corpus stage, "lowest_ngram_counts",
    "group_counts", "vocabulary", "corpus_stats"[, "score_cut", "score_histogram"]}``, on light rows only."""

    def __init__(self, config: BuildConfig, eval_index: Optional[EvalIndex], ran: StagesRun):
        super().__init__()
        self.config, self.eval_index, self.ran = config, eval_index, ran

    def expand(self, records):
        config, preset, ran, eval_index = self.config, self.config.preset, self.ran, self.eval_index
        in_the_running = records["in_the_running"]
        counted_only = (
            records["record_rejections"]
            | "StillCounted" >> beam.Filter(lambda row: row.counted)
            | "CountedOnlyPool" >> beam.Map(pool_row)
        )
        pool = {"survivors": in_the_running | "JudgedPool" >> beam.Map(pool_row), "counted_only": counted_only}
        corpus = pool | "ApplyCorpusFilters" >> ran(ApplyCorpusFilters(preset, extras=config.extras,
                                                                       every_verdict=True))
        # Every corpus stage's verdicts, not only a key's first: the audit's what-if needs them all.
        key_verdicts = [corpus[REJECTED] | "CountCorpusVerdicts" >> CountVerdicts("corpus_filters")]  # in stage order
        found = {}
        if config.scorer is not None:
            scored = in_the_running | "ModelScore" >> ran(ModelScoreVerdicts(preset))
            key_verdicts.append(scored[REJECTED] | "CountScoreVerdicts" >> CountVerdicts("model_score"))
            found.update(score_cut=scored["cut"], score_histogram=scored["histogram"])
        if eval_index is not None:
            key_verdicts.append(
                in_the_running
                | "NearDuplicatesOfEvalImages" >> ran(EvalMatchVerdicts(eval_index))
                | "CountEvalVerdicts" >> CountVerdicts("near_duplicate_eval"))
        if preset.dedup_in_corpus:
            earlier = key_verdicts | "VerdictsBeforeCorpusDedup" >> beam.Flatten()
            inputs = {"light": in_the_running, "embeddings": records[judge_lib.EMBEDDINGS], "earlier": earlier}
            key_verdicts.append(
                inputs
                | "RemoveCorpusNearDuplicates" >> ran(RemoveCorpusNearDuplicates(
                    preset, corpus_dedup_threshold(config, eval_index), config.flags.embedder))
                | "CountCorpusDedupVerdicts" >> CountVerdicts("near_duplicate_corpus"))
        return {
            "key_verdicts": key_verdicts | "KeyVerdicts" >> beam.Flatten(),
            **{name: corpus[name] for name in ("lowest_ngram_counts", "group_counts", "vocabulary")},
            "corpus_stats": corpus["stats"],
            **found,
        }


class DecideFates(beam.PTransform):
    """Rows and key verdicts -> ``{"survivors": the rows to write, "decided_rejections": every rejection decided
    before the second pass, "overlaps"}``; the what-if's histograms of the keys' fates on the way."""

    def __init__(self, config: BuildConfig, ran: StagesRun):
        super().__init__()
        self.config, self.ran = config, ran

    def expand(self, inputs):
        config, extras = self.config, self.config.extras
        rank = extra_stages.stage_rank(extras)
        joined = (inputs["in_the_running"], inputs["key_verdicts"], inputs["lowest_ngram_counts"]) | (
            "JoinVerdicts" >> self.ran(JoinVerdicts(rank, overlaps=config.scorer is not None)))
        what_if = {"fates": joined["fates"], "record_rejections": inputs["record_rejections"],
                   "group_counts": inputs["group_counts"], "vocabulary": inputs["vocabulary"]}
        _ = what_if | "WhatIfStats" >> WhatIfStats(
            config.version_dir, config.preset, [name for name, _ in extra_stages.stage_list(extras)], rank)
        return {
            "survivors": joined[SURVIVORS],
            "decided_rejections": (inputs["record_rejections"], joined[REJECTED]) | "DecidedRejections" >> beam.Flatten(),
            "overlaps": joined[OVERLAPS],
        }


class SecondPass(beam.PTransform):
    """The rows to write and the rejections -> ``{"shards", "samples", "rejections": every rejection, late ones
    included, "written": where each record went, "late": the late rejections}``: the shards, the rejection
    ledger, the near-duplicate pairs, the TOnICS counts, the NSFW gallery."""

    def __init__(self, config: BuildConfig, eval_index: Optional[EvalIndex]):
        super().__init__()
        self.config, self.eval_index = config, eval_index

    def expand(self, inputs):
        config, output = self.config, self.config.version_dir
        labels_column = config.flags.concept_labels_column
        samples = inputs["decided_rejections"] | "ChooseSamples" >> ChooseSamples()
        formats = (TFRECORD, WEBDATASET) if config.flags.webdataset else (TFRECORD,)
        written = (inputs["survivors"], samples) | "WriteShards" >> WriteShards(
            output, config.flags.name, config.preset, config.columns, config.columns.carry, config.ontology,
            labels_column, formats)
        rejections = (inputs["decided_rejections"], written[REJECTED]) | "AllRejections" >> beam.Flatten()
        _ = (rejections, inputs["row_count"]) | "WriteRejectionLedger" >> WriteRejectionLedger(output)
        if self.eval_index is not None:
            _ = (inputs[judge_lib.PAIRS], rejections) | "WritePairsReport" >> WritePairsReport(
                self.eval_index.directory, output)
        if config.ontology is not None:
            _ = written["concepts"] | "ConceptStats" >> WriteConceptStats(output, config.ontology, labels_column)
        if nsfw.stage_enabled(config.preset.nsfw_threshold):
            _ = (inputs["survivors"], inputs["decided_rejections"]) | "WriteNsfwGallery" >> WriteNsfwGallery(
                output, config.columns)
        return {"shards": written[SHARDS], "samples": written["samples"], "rejections": rejections,
                "written": written[WRITTEN], "late": written[REJECTED]}


class WriteBuildStats(beam.PTransform):
    """Everything counted -> ``stats/funnel.json``, ``distributions.json``, ``rejected_samples.jsonl``.

    The stage notes made on the workers (NSFW, the download, the model
    score) replace the launcher's note of the same stage.
    """

    def __init__(self, config: BuildConfig, ran: StagesRun):
        super().__init__()
        self.config, self.ran = config, ran

    def expand(self, inputs):
        config, preset = self.config, self.config.preset
        written_per_split = (
            inputs["shards"]
            | "RecordsPerShard" >> beam.Map(lambda shard: (shard[0], shard[2]["records"]))
            | "WrittenPerSplit" >> beam.CombinePerKey(sum)
        )
        histograms = inputs[judge_lib.MEASURES] | "Distributions" >> SumHistograms()
        notes = [inputs["download_notes"], inputs[judge_lib.NSFW_OUTCOMES] | "NsfwNote" >> NsfwNote(
            preset.nsfw_threshold, preset.nsfw_model)]
        corpus_stats = inputs["corpus_stats"]
        if config.scorer is not None:  # the scores' histogram with the cut, and what the score alone would have caught
            score_stats = (inputs["score_cut"], inputs["score_histogram"], inputs["rejections"], inputs["overlaps"]) | (
                "ModelScoreStats" >> ScoreStats(config.scorer.check(), preset))
            corpus_stats = (corpus_stats, score_stats["distribution"]) | "CorpusAndScoreStats" >> beam.Flatten()
            notes.append(score_stats["note"])
        meta = {"ran": self.ran.names, "notes": self.ran.notes, "dataset": config.flags.name, "preset": preset,
                "extras": tuple(config.extras)}
        return (inputs["input_count"], inputs["rejections"], written_per_split, histograms, corpus_stats,
                inputs["samples"], notes | "StageNotes" >> beam.Flatten()) | "WriteStats" >> WriteStats(
            config.version_dir, meta)


def corpus_dedup_threshold(config: BuildConfig, eval_index: Optional[EvalIndex]) -> float:
    """The in-corpus dedup's cosine: the evaluation index's when there is one, else the embedder's."""
    if eval_index is not None:
        return eval_index.threshold
    embedder = preset_options.embedder(config.flags.embedder, config.embedder_args)
    return preset_options.resolve_threshold(config.preset, embedder)
