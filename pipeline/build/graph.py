"""The build's job graph: candidates in, TFDS-compatible shards and their stats out.

It reads like its data flow, two passes over the sources with every decision
taken in between on light rows, as six composites:

    FirstPass       MatchInputFiles -> JudgeRecords [-> DownloadImages] [-> ScoreNsfw]           -> Judged
    CorpusStages    ApplyCorpusFilters [-> ModelScore] [-> NearDuplicatesOfEvalImages]
                    [-> RemoveCorpusNearDuplicates]                                               -> Verdicts
    DecideFates     JoinVerdicts (first reason wins, one row per pair), WhatIfStats              -> Fates
    SecondPass      ChooseSamples -> WriteShards -> WriteRejectionLedger
                    [, WritePairsReport, ConceptStats, WriteNsfwGallery]                          -> Written
    WriteBuildStats the funnel, distributions, samples and stage notes -> stats/
    CandidateTable  every input record's facts and fate -> stats/candidates/

Each composite takes the PCollections it reads as a named tuple (its
``Inputs``) and hands on a named tuple; a PCollection has one name from the
composite that makes it to those that read it. ``build_pipeline`` is the
only place they meet.

The first pass reads each record once and judges it where it was read
(``pipeline.stages.judge``: the per-record rules, NSFW, the evaluation-index
match, the pair model's score); it hands on one light row per record
(``pipeline.stages.light_rows``); with ``--nsfw_accelerator`` the NSFW score
is a step of its own (``pipeline.stages.nsfw_step``), which the records the
rules kept reach with their image bytes. With ``--download`` the URL-list rows go to
``DownloadImages`` (``pipeline.download.stage``): each distinct URL fetched
and judged once, then each row judged with its image's facts. The corpus
stages see light rows only and give ``(key, reason)`` verdicts
(``pipeline.stages.verdicts``). The second pass (``pipeline.write``) reads
the kept records again from their files and writes the shards. Image bytes
cross no shuffle (but the NSFW step's boundaries, with ``--nsfw_accelerator``). Every input record ends in a shard or in the funnel with
its first reason (``filters.stages``).

The funnel's list of the stages that ran is the list of stages applied: each
composite makes its stages when it is made and lists them in ``stages``;
``build_pipeline`` collects them (``StagesRun.of``) before it applies any,
and hands them to ``WriteBuildStats``. Evaluation images are embedded by the
launcher and written under the version (``pipeline.stages.eval_index``),
where the workers read them: the graph carries their path, not their
vectors.

Every composite takes the resolved ``BuildConfig`` (``pipeline.build.config``)
and hands its DoFns only the values they use. ``pipeline.select`` writes a
selection with the same ``SecondPass``, ``WriteBuildStats`` and candidate
table.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import apache_beam as beam

from common.optional_inputs import OptionalInputs
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
from pipeline.stages.judge import JudgeFiles, NsfwNote, RecordJudge, ReuseNote
from pipeline.stages.nsfw_step import ScoreNsfw
from pipeline.stages.near_duplicates import RemoveCorpusNearDuplicates, WritePairsReport
from pipeline.stages.score_verdicts import ModelScoreVerdicts, ScoreStats
from pipeline.stages.verdicts import OVERLAPS, CountVerdicts, JoinVerdicts, StagesRun
from pipeline.what_if.collect import WhatIfStats
from pipeline.write.candidate_table import TableInputs, WriteCandidateTable
from pipeline.write.concept_tags import WriteConceptStats
from pipeline.write.ledger import WriteRejectionLedger
from pipeline.write.nsfw_gallery import WriteNsfwGallery
from pipeline.write.second_pass import WriteShards
from pipeline.write.tar_shards import TFRECORD, WEBDATASET

PCollection = beam.PCollection


def build_pipeline(p: beam.Pipeline, config: BuildConfig, notes: dict,
                   eval_index: Optional[EvalIndex] = None) -> StagesRun:
    """Adds the whole build to ``p``; returns the stages applied (with ``notes``, the launcher's, for the funnel)."""
    judge = RecordJudge(config.preset, extra_stages.record_stages(config.extras), eval_index, config.flags.embedder,
                        config.embedder_args, scorer=config.scorer, previous=config.previous,
                        nsfw_step=bool(config.nsfw_accelerator))
    # Each composite makes its stages when it is made: the funnel's list of them is known before any is applied.
    first_pass = FirstPass(config, judge)
    corpus_stages = CorpusStages(config, eval_index)
    decide_fates = DecideFates(config)
    ran = StagesRun.of(first_pass.stages + corpus_stages.stages + decide_fates.stages, notes)

    judged = p | "FirstPass" >> first_pass
    verdicts = CorpusStages.Inputs(
        in_the_running=judged.in_the_running, record_rejections=judged.record_rejections,
        embeddings=judged.embeddings,
    ) | "CorpusStages" >> corpus_stages
    fates = DecideFates.Inputs(
        in_the_running=judged.in_the_running, record_rejections=judged.record_rejections,
        key_verdicts=verdicts.key_verdicts, lowest_ngram_counts=verdicts.lowest_ngram_counts,
        group_counts=verdicts.group_counts, vocabulary=verdicts.vocabulary,
    ) | "DecideFates" >> decide_fates
    written = SecondPass.Inputs(
        survivors=fates.survivors, decided_rejections=fates.decided_rejections, row_count=judged.row_count,
        pairs=judged.pairs,
    ) | "SecondPass" >> SecondPass(config, eval_index)
    _ = WriteBuildStats.Inputs(
        input_count=judged.input_count, rejections=written.rejections, shards=written.shards,
        samples=written.samples, measures=judged.measures, corpus_stats=verdicts.corpus_stats,
        download_notes=judged.download_notes, nsfw_outcomes=judged.nsfw_outcomes,
        reuse_outcomes=judged.reuse_outcomes, score_cut=verdicts.score_cut,
        score_histogram=verdicts.score_histogram, overlaps=fates.overlaps,
    ) | "WriteBuildStats" >> WriteBuildStats(config, ran)
    _ = TableInputs(
        rows=judged.rows, placements=written.placements, late_rejections=written.late_rejections,
        key_verdicts=verdicts.key_verdicts, lowest_ngram_counts=verdicts.lowest_ngram_counts,
    ) | "CandidateTable" >> candidate_table(config)
    return ran


class Judged(NamedTuple):
    """What the first pass hands on."""

    rows: PCollection               # one light row per input record
    input_count: PCollection        # what the funnel counts: a reader's marker as the rows it stands for (empty: 0)
    row_count: PCollection          # the rows themselves (empty when there are none: read as 0)
    in_the_running: PCollection     # the rows no per-record rule rejected
    record_rejections: PCollection  # the rows a per-record rule rejected
    measures: PCollection           # partial histograms of the measures (judge_lib.MEASURES)
    pairs: PCollection              # evaluation-index matches (judge_lib.PAIRS)
    embeddings: PCollection         # (key, vector) for the in-corpus near-duplicates (judge_lib.EMBEDDINGS)
    nsfw_outcomes: PCollection      # what the NSFW scorer did (judge_lib.NSFW_OUTCOMES)
    download_notes: Optional[PCollection]  # the download stage's (stage, note); None without --download
    reuse_outcomes: Optional[PCollection]  # (reused|recomputed|new, records) with --reuse; None without it


class FirstPass(beam.PTransform):
    """``--input`` -> ``Judged``: every input record read once and judged where it was read."""

    def __init__(self, config: BuildConfig, judge: RecordJudge):
        super().__init__()
        self.config = config
        self.judge_files = JudgeFiles(judge, config.flags.input, config.flags.input_format, config.columns)
        self.download = DownloadImages(
            judge, config.download_staging, config.version, config.download,
            max_record_bytes=config.columns.limits.max_record_bytes) if config.download is not None else None
        self.score_nsfw = ScoreNsfw(judge, config.nsfw_accelerator) if config.nsfw_accelerator else None
        self.stages = (self.judge_files,) + ((self.download,) if self.download is not None else ())

    def expand(self, pbegin):
        paths = pbegin | "MatchInputFiles" >> MatchInputFiles(self.config.flags.input)
        judged = paths | "JudgeRecords" >> self.judge_files
        parts, notes = [judged], []
        if self.score_nsfw is not None:  # --nsfw_accelerator: the kept records' verdicts and the rest of their work
            parts.append(judged[judge_lib.PENDING] | "ScoreNsfw" >> self.score_nsfw)
        if self.download is not None:
            downloaded = judged[judge_lib.TO_FETCH] | "DownloadImages" >> self.download
            parts.append(downloaded)
            notes.append(downloaded[NOTES])
        # Without --download every output has one part: no Flatten (each is a transform the runner translates).
        def all_of(tag, label):
            return parts[0][tag] if len(parts) == 1 else [part[tag] for part in parts] | label >> beam.Flatten()

        rows = all_of(judge_lib.ROWS, "InputRows")
        side = {tag: all_of(tag, f"All{tag.title()}")
                for tag in (judge_lib.MEASURES, judge_lib.PAIRS, judge_lib.EMBEDDINGS, judge_lib.NSFW_OUTCOMES)}
        reuse_outcomes = judged.get(judge_lib.REUSE_OUTCOMES)  # only the file judge reuses facts
        if reuse_outcomes is not None and self.score_nsfw is not None:
            reuse_outcomes = all_of(judge_lib.REUSE_OUTCOMES, "AllReuse")
        # The counts are read as singletons whose readers say what nothing counts (0): Beam's own default
        # for an empty input is five more transforms per combine.
        return Judged(
            rows=rows,
            input_count=(rows | "RecordsOfRow" >> beam.Map(records_of)
                         | "CountInput" >> beam.CombineGlobally(sum).without_defaults()),
            row_count=rows | "CountRows" >> beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults(),
            in_the_running=rows | "PassedRecordStages" >> beam.Filter(lambda row: not row.reason),
            record_rejections=rows | "RejectedByRecordStages" >> beam.Filter(lambda row: bool(row.reason)),
            measures=side[judge_lib.MEASURES], pairs=side[judge_lib.PAIRS], embeddings=side[judge_lib.EMBEDDINGS],
            nsfw_outcomes=side[judge_lib.NSFW_OUTCOMES],
            download_notes=notes[0] if notes else None, reuse_outcomes=reuse_outcomes,
        )


class Verdicts(NamedTuple):
    """What the corpus stages hand on."""

    key_verdicts: PCollection          # (key, reason) of every corpus stage, in stage order
    lowest_ngram_counts: PCollection   # (key, count)
    group_counts: PCollection          # the sharing counts (the what-if's)
    vocabulary: PCollection            # the n-gram vocabulary (the what-if's)
    corpus_stats: PCollection          # the corpus filters' distributions
    score_cut: Optional[PCollection]   # with a pair model: the score cut
    score_histogram: Optional[PCollection]  # with a pair model: the scores' histogram


class CorpusStages(OptionalInputs):
    """The first pass's rows -> ``Verdicts``, on light rows only."""

    class Inputs(NamedTuple):
        in_the_running: PCollection
        record_rejections: PCollection
        embeddings: PCollection

    def __init__(self, config: BuildConfig, eval_index: Optional[EvalIndex]):
        super().__init__()
        preset = config.preset
        self.corpus_filters = ApplyCorpusFilters(preset, extras=config.extras, every_verdict=True)
        self.model_score = ModelScoreVerdicts(preset) if config.scorer is not None else None
        self.eval_match = EvalMatchVerdicts(eval_index) if eval_index is not None else None
        self.corpus_dedup = RemoveCorpusNearDuplicates(
            preset, config.near_duplicate_threshold, config.flags.embedder) if preset.dedup_in_corpus else None
        self.stages = tuple(stage for stage in (self.corpus_filters, self.model_score, self.eval_match,
                                                self.corpus_dedup) if stage is not None)

    def expand(self, inputs: "CorpusStages.Inputs") -> Verdicts:
        in_the_running = inputs.in_the_running
        counted_only = (
            inputs.record_rejections
            | "StillCounted" >> beam.Filter(lambda row: row.counted)
            | "CountedOnlyPool" >> beam.Map(pool_row)
        )
        pool = {"survivors": in_the_running | "JudgedPool" >> beam.Map(pool_row), "counted_only": counted_only}
        corpus = pool | "ApplyCorpusFilters" >> self.corpus_filters
        # Every corpus stage's verdicts, not only a key's first: the audit's what-if needs them all.
        key_verdicts = [corpus[REJECTED] | "CountCorpusVerdicts" >> CountVerdicts("corpus_filters")]  # in stage order
        score_cut = score_histogram = None
        if self.model_score is not None:
            scored = in_the_running | "ModelScore" >> self.model_score
            key_verdicts.append(scored[REJECTED] | "CountScoreVerdicts" >> CountVerdicts("model_score"))
            score_cut, score_histogram = scored["cut"], scored["histogram"]
        if self.eval_match is not None:
            key_verdicts.append(
                in_the_running
                | "NearDuplicatesOfEvalImages" >> self.eval_match
                | "CountEvalVerdicts" >> CountVerdicts("near_duplicate_eval"))
        if self.corpus_dedup is not None:
            earlier = key_verdicts | "VerdictsBeforeCorpusDedup" >> beam.Flatten()
            key_verdicts.append(
                {"light": in_the_running, "embeddings": inputs.embeddings, "earlier": earlier}
                | "RemoveCorpusNearDuplicates" >> self.corpus_dedup
                | "CountCorpusDedupVerdicts" >> CountVerdicts("near_duplicate_corpus"))
        return Verdicts(
            key_verdicts=key_verdicts | "KeyVerdicts" >> beam.Flatten(),
            lowest_ngram_counts=corpus["lowest_ngram_counts"], group_counts=corpus["group_counts"],
            vocabulary=corpus["vocabulary"], corpus_stats=corpus["stats"],
            score_cut=score_cut, score_histogram=score_histogram,
        )


class Fates(NamedTuple):
    """What deciding the fates hands on."""

    survivors: PCollection           # the rows to write
    decided_rejections: PCollection  # every rejection decided before the second pass
    overlaps: PCollection            # which other stages rejected what the pair model rejected


class DecideFates(OptionalInputs):
    """Rows and key verdicts -> ``Fates``; the what-if's histograms of the keys' fates on the way."""

    class Inputs(NamedTuple):
        in_the_running: PCollection
        record_rejections: PCollection
        key_verdicts: PCollection
        lowest_ngram_counts: PCollection
        group_counts: PCollection
        vocabulary: PCollection

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config
        self.rank = extra_stages.stage_rank(config.extras)
        self.join = JoinVerdicts(self.rank, overlaps=config.scorer is not None)
        self.stages = (self.join,)

    def expand(self, inputs: "DecideFates.Inputs") -> Fates:
        config = self.config
        joined = (inputs.in_the_running, inputs.key_verdicts, inputs.lowest_ngram_counts) | "JoinVerdicts" >> self.join
        what_if = {"fates": joined["fates"], "record_rejections": inputs.record_rejections,
                   "group_counts": inputs.group_counts, "vocabulary": inputs.vocabulary}
        _ = what_if | "WhatIfStats" >> WhatIfStats(
            config.version_dir, config.preset, [name for name, _ in extra_stages.stage_list(config.extras)],
            self.rank)
        return Fates(
            survivors=joined[SURVIVORS],
            decided_rejections=(inputs.record_rejections, joined[REJECTED]) | "DecidedRejections" >> beam.Flatten(),
            overlaps=joined[OVERLAPS],
        )


class Written(NamedTuple):
    """What the second pass hands on."""

    shards: PCollection           # (split, index, info) per shard file
    samples: PCollection          # the audit's sample rows, with thumbnails
    rejections: PCollection       # every rejection: the decided ones and the late ones
    placements: PCollection       # (key, source, ordinal, split, shard, offset) of each record written
    late_rejections: PCollection  # the rows the second pass could not write after all


class SecondPass(OptionalInputs):
    """The rows to write and the rejections -> ``Written``: the shards and the rejection ledger, and with
    ``reports`` the audit's samples, the near-duplicate pairs, the TOnICS counts and the NSFW gallery.

    A build's second pass reports what its stages judged; a selection's
    (``pipeline.select``) judges nothing again, so it has no ``reports``
    and may have no ``decided_rejections``.
    """

    class Inputs(NamedTuple):
        survivors: PCollection
        decided_rejections: Optional[PCollection]
        row_count: PCollection        # the rows the job started from (the ledger's total)
        pairs: Optional[PCollection]  # with an evaluation index: its matches

    def __init__(self, config: BuildConfig, eval_index: Optional[EvalIndex], reports: bool = True):
        super().__init__()
        self.config, self.eval_index, self.reports = config, eval_index, reports

    def expand(self, inputs: "SecondPass.Inputs") -> Written:
        config, output = self.config, self.config.version_dir
        labels_column = config.flags.concept_labels_column
        samples = (inputs.decided_rejections | "ChooseSamples" >> ChooseSamples()) if self.reports else None
        formats = (TFRECORD, WEBDATASET) if config.flags.webdataset else (TFRECORD,)
        shards = (inputs.survivors, samples) | "WriteShards" >> WriteShards(
            output, config.flags.name, config.preset, config.columns, config.columns.carry, config.ontology,
            labels_column, formats, read_once=config.previous is not None)
        decided = [inputs.decided_rejections] if inputs.decided_rejections is not None else []
        rejections = [*decided, shards.late_rejections] | "AllRejections" >> beam.Flatten()
        _ = (rejections, inputs.row_count) | "WriteRejectionLedger" >> WriteRejectionLedger(output)
        if self.reports and self.eval_index is not None:
            _ = (inputs.pairs, rejections) | "WritePairsReport" >> WritePairsReport(self.eval_index.directory, output)
        if self.reports and config.ontology is not None:
            _ = shards.concept_counts | "ConceptStats" >> WriteConceptStats(output, config.ontology, labels_column)
        if self.reports and nsfw.stage_enabled(config.preset.nsfw_threshold):
            _ = (inputs.survivors, inputs.decided_rejections) | "WriteNsfwGallery" >> WriteNsfwGallery(
                output, config.columns)
        return Written(shards=shards.shards, samples=shards.samples, rejections=rejections,
                       placements=shards.placements, late_rejections=shards.late_rejections)


class WriteBuildStats(OptionalInputs):
    """Everything counted -> ``stats/funnel.json``, ``distributions.json``, ``rejected_samples.jsonl``.

    ``ran``: the stages the job applied and the launcher's notes. The stage
    notes made on the workers (NSFW, the download, the model score) replace
    the launcher's note of the same stage. What a job did not measure (a
    selection measures nothing again) is None.
    """

    class Inputs(NamedTuple):
        input_count: PCollection
        rejections: PCollection
        shards: PCollection
        samples: PCollection
        measures: Optional[PCollection] = None
        corpus_stats: Optional[PCollection] = None
        download_notes: Optional[PCollection] = None
        nsfw_outcomes: Optional[PCollection] = None
        reuse_outcomes: Optional[PCollection] = None
        score_cut: Optional[PCollection] = None
        score_histogram: Optional[PCollection] = None
        overlaps: Optional[PCollection] = None

    def __init__(self, config: BuildConfig, ran: StagesRun):
        super().__init__()
        self.config, self.ran = config, ran

    def expand(self, inputs: "WriteBuildStats.Inputs"):
        config, preset = self.config, self.config.preset
        written_per_split = (
            inputs.shards
            | "RecordsPerShard" >> beam.Map(lambda shard: (shard[0], shard[2]["records"]))
            | "WrittenPerSplit" >> beam.CombinePerKey(sum)
        )
        histograms = (inputs.measures | "Distributions" >> SumHistograms()) if inputs.measures is not None else None
        notes = [] if inputs.download_notes is None else [inputs.download_notes]
        if inputs.nsfw_outcomes is not None and nsfw.stage_enabled(preset.nsfw_threshold):  # a stage off scores none
            notes.append(inputs.nsfw_outcomes | "NsfwNote" >> NsfwNote(preset.nsfw_threshold, preset.nsfw_model))
        if inputs.reuse_outcomes is not None:
            notes.append(inputs.reuse_outcomes | "ReuseNote" >> ReuseNote(self.ran.notes.get("reuse", "")))
        corpus_stats = inputs.corpus_stats
        if config.scorer is not None:  # the scores' histogram with the cut, and what the score alone would have caught
            score_stats = (inputs.score_cut, inputs.score_histogram, inputs.rejections, inputs.overlaps) | (
                "ModelScoreStats" >> ScoreStats(config.scorer.check(), preset))
            corpus_stats = (corpus_stats, score_stats["distribution"]) | "CorpusAndScoreStats" >> beam.Flatten()
            notes.append(score_stats["note"])
        meta = {"ran": self.ran.names, "notes": self.ran.notes, "dataset": config.flags.name, "preset": preset,
                "extras": tuple(config.extras)}
        stage_notes = (notes | "StageNotes" >> beam.Flatten()) if notes else None
        return (inputs.input_count, inputs.rejections, written_per_split, histograms, corpus_stats, inputs.samples,
                stage_notes) | "WriteStats" >> WriteStats(config.version_dir, meta)


def candidate_table(config: BuildConfig) -> WriteCandidateTable:
    """The candidate table of the job's version, its fates ranked in the job's stage order."""
    return WriteCandidateTable(config.version_dir, extra_stages.stage_rank(config.extras))
