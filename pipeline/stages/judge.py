"""The build's first pass: every record is read once, judged once and handed on as a light row.

    paths --JudgeFiles--> LightRow per input record (+ measures, pairs, embeddings, NSFW outcomes)

One fused step per input file reads its records (``pipeline.readers.file_records.FileRecords``),
applies the per-record rules (``filters.record.judge_record``: header, format,
size, aspect, text, the reduced decode that gives sha256 and pHash, extra
stages) and, a batch at a time, the NSFW scorer and the match against the
evaluation index (a per-process copy read from its files, ``pipeline.
eval_index``) and, with ``--model_score``, the pair model (one copy per
process, ``filters.model_score``: the pairs that passed everything so far
wait for a full batch of the model, at most until the file ends; the cosine
goes into the row, the cut is a corpus stage, ``pipeline.stages.score_verdicts``),
then emits one ``LightRow`` per record (``pipeline.stages.light_rows``). Image bytes never leave the step (but
with ``--nsfw_accelerator``: ``PENDING``, ``pipeline.stages.nsfw_step``): a written record is read
again from its file by the second pass (``pipeline.write``), found by its
ordinal (its position in what the reader yields).

With ``--download``, rows without image bytes leave as ``to_fetch``: the
download stage (``pipeline.download.stage``) fetches each distinct URL once
into a staging file, judges its image once with this judge's NSFW scorer,
embedder and index, and judges each row with its image's facts, scoring
the pair with this judge's pair model (``pipeline.download.fanout``).

Tagged outputs besides the rows: ``measures`` (partial histograms of the
audit's distributions, one per measure per file or batch), ``pairs`` (near-
duplicates of evaluation images with the corpus image's thumbnail, for the
audit), ``embeddings`` (``(key, vector)`` for the in-corpus dedup, when the
preset asks for it) and ``nsfw`` (what the NSFW scorer did, for the funnel's note).
"""

from __future__ import annotations

import functools
import json
import math
from typing import Dict, Iterator, List, Optional, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.utils.shared import Shared

from common import allocator
from common.histogram import bin_index
from common.schema import Candidate
from dedup import preset_options as dedup_options
from filters import nsfw, score_cut
from filters.image import thumbnail_b64
from filters.record import Judgement, judge_record_decoding
from pipeline.funnel.accounting import records_of
from pipeline.funnel import progress
from pipeline.funnel.counts import HISTOGRAM_EDGES, METRICS_NAMESPACE, NSFW_MEASURE
from pipeline.readers import previous_build
from pipeline.readers.file_records import FileRecords, input_patterns
from pipeline.readers.rows import Columns, Rejection
from pipeline.stages.light_rows import LightRow, holding_rows
from pipeline.stages.nsfw_inference import Pending, model_input, verdict

ROWS, MEASURES, PAIRS, EMBEDDINGS, NSFW_OUTCOMES, TO_FETCH = "rows", "measures", "pairs", "embeddings", "nsfw", "to_fetch"
REUSE_OUTCOMES = "reuse"
#: With ``--nsfw_accelerator``: records waiting for their NSFW verdict (``pipeline.stages.nsfw_inference``).
PENDING = "pending"
#: Records judged together: the NSFW scorer, the embedder and the index search work on batches.
BATCH_SIZE = 64
#: Characters of a rejected record's alt-text kept for the audit (its samples show 500).
SHOWN_TEXT = 500


def scored_rows(scorer, waiting: List[Tuple[LightRow, bytes, str]], preset) -> List[LightRow]:
    """``(light row, image bytes, alt-text)`` of kept rows -> each row with its pair score, or rejected as
    ``model_score/undecodable`` where the model's decoder fails (the file judge's and the download's)."""
    scores = scorer.score([image for _, image, _ in waiting], [text for _, _, text in waiting],
                          [row.key for row, _, _ in waiting])
    counted = preset.counting_base == "raw"  # as NSFW: a quality judgement, the row still counts
    done = []
    for (row, _, _), score in zip(waiting, scores):
        score = float(score)
        if math.isnan(score):  # the model's decoder failed where the build's did not
            done.append(row._replace(reason=score_cut.UNDECODABLE, counted=counted))
        else:
            done.append(row._replace(model_score=score))
    return done


def rejection_row(rejection: Rejection, reader: str = "", source: str = "", ordinal: int = -1) -> LightRow:
    """A reader's rejection as a light row (``source`` "" when the record cannot be read again)."""
    detail = json.dumps(dict(rejection.detail), sort_keys=True) if rejection.detail else ""
    return LightRow(rejection.key, rejection.url, rejection.alt_text[:SHOWN_TEXT], rejection.reason, False, "", "",
                    rejection.width, rejection.height, rejection.format, source, reader, ordinal, detail=detail)


def judged_row(judgement: Judgement, reader: str, source: str, ordinal: int) -> LightRow:
    c = judgement.candidate
    text = c.text if c.text or judgement.counted else c.alt_text[:SHOWN_TEXT]
    # A downloaded record's URL-list row is not read again: what the shard needs of it travels with the row.
    carried = json.dumps([list(kv) for kv in c.carried]) if c.origin else ""
    stored_width, stored_height = judgement.stored_size or (0, 0)
    return LightRow(c.key, c.url, text, judgement.reason or "", judgement.counted, c.sha256, c.phash,
                    c.width, c.height, c.format, source, reader, ordinal, carried=carried,
                    stored_width=stored_width, stored_height=stored_height)


class Histograms:
    """Partial histograms of the audit's measures (``pipeline.funnel.counts.HISTOGRAM_EDGES``), merged by summing."""

    def __init__(self):
        self.counts: Dict[str, List[int]] = {}

    def add(self, measures: Dict[str, float]) -> None:
        for name, value in measures.items():
            edges = HISTOGRAM_EDGES.get(name)
            if edges is not None:
                self.counts.setdefault(name, [0] * len(edges))[bin_index(edges, value)] += 1

    def take(self) -> List[Tuple[str, List[int]]]:
        counts, self.counts = self.counts, {}
        return sorted(counts.items())


def _rows_out(rows) -> List[Tuple[str, object]]:
    """Finished light rows as ``(ROWS, row)`` outputs, each rejection counted under its reason (a reader's
    marker as the rows it stands for)."""
    outputs = []
    for row in rows:
        if row is not None:
            if row.reason:
                Metrics.counter(METRICS_NAMESPACE, row.reason).inc(records_of(row))
            outputs.append((ROWS, row))
    return outputs


class RecordJudge:
    """The first pass's work on a batch of records, without Beam.

    ``judge(items)`` takes ``(record, reader, source, ordinal)`` items, a
    record being a ``Candidate`` or a reader's ``Rejection``, and returns
    ``(tag, value)`` outputs: a ``LightRow`` per record under ``ROWS``, and
    ``PAIRS``/``EMBEDDINGS``/``TO_FETCH`` values. ``setup`` loads what a
    worker needs once: the NSFW scorer, the embedder, the evaluation index.

    ``nsfw_step``: the NSFW score is a step of its own (``pipeline.stages.nsfw_inference``): ``judge``
    hands the records every cheaper rule kept on as ``PENDING``, and ``judge_scored`` does the rest of
    their work once they have their score; ``setup(part)`` loads what each of the two parts needs.
    """

    def __init__(self, preset, extras=(), eval_index=None, embedder_name: str = "dct", embedder_args=(),
                 download: bool = False, nsfw_factory=None, scorer=None, previous=None, nsfw_step: bool = False):
        self.preset = preset
        self.nsfw_step = nsfw_step
        self.previous = previous  # previous_build.PreviousBuild whose facts this build reuses (--reuse), or None
        self.scorer = scorer  # filters.model_score.PairScorer, or None: no model-score stage
        self.extras = tuple(extras)
        self.eval_index = eval_index
        self.embedder_name = embedder_name
        self.embedder_args = tuple(embedder_args)
        self.download = download
        self.nsfw_factory = nsfw_factory
        self.histograms = Histograms()

    def setup(self, part: str = "whole") -> None:
        """``part``: ``whole``, or with ``nsfw_step`` the file judge's (``before``) or the verdicts' (``after``)."""
        from threadpoolctl import threadpool_limits

        # The runner's worker processes are the parallelism: BLAS threads only
        # spin between the small matrix products of each record's pHash (they
        # doubled the first pass's CPU time on 2 cores).
        threadpool_limits(1, user_api="blas")
        allocator.keep_freed_buffers()
        preset = self.preset
        self.part = part
        self.nsfw = nsfw.NsfwScoring.from_preset(preset, scorer_factory=self.nsfw_factory)
        self.nsfw_counts: Dict[Tuple[bool, str], int] = {}  # the verdicts' part: what the scoring step did
        if part == "whole":
            # A rebuild may take every score from the old build: the model waits for an image that needs it.
            self.nsfw.load(lazy=self.previous is not None)
        self.facts = (previous_build.FactsOfFiles(self.previous)
                      if self.previous is not None and part != "after" else None)
        # An old score is this build's only if this worker's scorer is the one that made it (model, precision).
        self.reuse_scores = self.previous is not None and self.nsfw.label() in self.previous.nsfw_scorers
        self.reuse_counts: Dict[str, int] = {}
        self.embedder = self.index = None
        self.histograms = Histograms()
        self.unscored: List[Tuple[LightRow, bytes, str]] = []  # kept rows waiting for a full batch of the pair model
        self.rejected = Metrics.counter("dedup", "near_duplicate_eval/rejected")
        if part == "before":  # the rest is the verdicts' part
            return
        if self.eval_index is not None or preset.dedup_in_corpus:
            self.embedder = dedup_options.embedder(self.embedder_name, self.embedder_args)
        if self.eval_index is not None:
            from pipeline.stages.eval_index import load_clustered_index

            eval_index = self.eval_index
            self.index = _INDEXES.acquire(lambda: load_clustered_index(eval_index, preset), tag=eval_index.directory)
        if self.scorer is not None:
            self.scorer.check()  # this process's copy of the model, loaded once (filters.model_score)

    def judge(self, items) -> List[Tuple[str, object]]:
        outputs: List[Tuple[str, object]] = []
        rows: List[Optional[LightRow]] = []
        passing: List[Tuple[int, Candidate]] = []
        known: Dict[int, previous_build.KnownFacts] = {}  # row -> the old build's facts of the same bytes
        outcomes: Dict[int, str] = {}                      # row -> where its facts came from (--reuse)
        for record, reader, source, ordinal in items:
            if isinstance(record, Rejection):  # a file of no known format cannot be read again
                rows.append(rejection_row(record, reader, source if reader else "", ordinal))
            elif record.image is None:  # a URL-list row: the download stage fetches it (--download)
                outputs.append((TO_FETCH, record))
                rows.append(None)
            else:
                found = self.facts.get(source, ordinal) if self.facts is not None else None
                # Another record at this position: nothing of the old row is its.
                fact = found if found is not None and found.key == record.key else None
                judgement, decoded = judge_record_decoding(
                    record, self.preset, self.extras, (fact.sha256, fact.phash) if fact is not None else None)
                self.histograms.add(judgement.measures)
                rows.append(judged_row(judgement, reader, source, ordinal))
                if self.facts is not None:
                    outcomes[len(rows) - 1] = (previous_build.NEW if found is None
                                               else previous_build.RECOMPUTED if decoded or fact is None
                                               else previous_build.REUSED)
                sha256 = judgement.candidate.sha256
                if fact is not None and sha256 and sha256 == fact.sha256:
                    known[len(rows) - 1] = fact
                if judgement.reason is None:
                    passing.append((len(rows) - 1, judgement.candidate))
        if self.nsfw_step:
            return outputs + self._pending(rows, passing, known, outcomes)
        passing = self._score_nsfw(rows, passing, known, outcomes)
        return outputs + self._after_nsfw(rows, passing, known, outcomes)

    def _pending(self, rows, passing, known, outcomes) -> List[Tuple[str, object]]:
        """The kept records as ``PENDING`` ``(Pending, (sha256, model input, known score))``; the others' rows."""
        outputs = []
        for i, candidate in passing:
            fact = known.get(i)
            score = fact.nsfw_score if fact is not None else None
            prepared = model_input(candidate.image, self.preset, self.nsfw_factory)
            outputs.append((PENDING, (Pending(rows[i], candidate, fact, outcomes.pop(i, "")),
                                      (bytes.fromhex(candidate.sha256), prepared, score))))
            rows[i] = None
        self._count_reuse(outcomes)
        return outputs + _rows_out(rows)

    def judge_scored(self, scored) -> List[Tuple[str, object]]:
        """``(Pending, PredictionResult)`` pairs -> their records' outputs, as ``judge`` gives them fused."""
        rows, passing, known, outcomes = [], [], {}, {}
        for pending, result in scored:
            (was_scored, score), label = result.inference, result.model_id
            i, row = len(rows), pending.row
            if pending.fact is not None:
                known[i] = pending.fact
            if pending.outcome:
                reused = (label in self.previous.nsfw_scorers and pending.fact is not None
                          and pending.fact.nsfw_score is not None)
                outcomes[i] = (previous_build.RECOMPUTED if pending.outcome == previous_build.REUSED
                               and not reused else pending.outcome)
            if not was_scored or score is not None:
                self.nsfw_counts[(was_scored, label)] = self.nsfw_counts.get((was_scored, label), 0) + 1
            reason = verdict(self.preset, was_scored, score)
            rows.append(self._with_nsfw(row, score, reason))
            if not reason:
                passing.append((i, pending.candidate))
        return self._after_nsfw(rows, passing, known, outcomes)

    def _count_reuse(self, outcomes) -> None:
        for outcome in outcomes.values():
            self.reuse_counts[outcome] = self.reuse_counts.get(outcome, 0) + 1

    def _after_nsfw(self, rows, passing, known, outcomes) -> List[Tuple[str, object]]:
        """The work on the records NSFW kept: the stored picture, the evaluation index, the pair model."""
        outputs: List[Tuple[str, object]] = []
        for i, candidate in passing:  # kept so far: a picture the old build stored is copied, not made again
            if i in known and known[i].stored_at:  # with the source's columns: its file need not be read again
                rows[i] = rows[i]._replace(stored_at=known[i].stored_at, carried=rows[i].carried or json.dumps(
                    [list(kv) for kv in candidate.carried]))
        self._count_reuse(outcomes)
        if self.embedder is not None and passing:
            outputs += self._embed_and_match(rows, self._to_search(passing, known))
        if self.scorer is not None:
            for i, candidate in passing:
                self.unscored.append((rows[i], candidate.image, candidate.text))
                rows[i] = None
            rows += self._score_pairs(final=False)
        return outputs + _rows_out(rows)

    def finish(self) -> List[Tuple[str, object]]:
        """The rows still waiting for their pair score (the end of a file or of a batch of downloads)."""
        return _rows_out(self._score_pairs(final=True)) if self.scorer is not None and self.part != "before" else []

    def _score_pairs(self, final: bool) -> List[LightRow]:
        """Scores the waiting rows a full model batch at a time (all of them if ``final``): a pass rate of
        one half would otherwise pad every batch of the towers to twice its pairs."""
        size = self.scorer.model.batch_size
        done = []
        while len(self.unscored) >= size or (final and self.unscored):
            batch, self.unscored = self.unscored[:size], self.unscored[size:]
            done += scored_rows(self.scorer, batch, self.preset)
        return done

    def _score_nsfw(self, rows, passing, known=None, outcomes=None):
        """Scores the records every per-record rule kept; their score goes on the row and into the histogram.

        ``known``: the old build's facts of some rows' images (--reuse): their scores, when this worker's
        scorer made them, are taken as if scored again; a row scored now counts as recomputed."""
        if self.facts is not None and self.nsfw.enabled:
            for i, candidate in passing:
                fact = known.get(i)
                if self.reuse_scores and fact is not None and fact.nsfw_score is not None:
                    self.nsfw.remember(bytes.fromhex(candidate.sha256), fact.nsfw_score)
                elif outcomes.get(i) == previous_build.REUSED:
                    outcomes[i] = previous_build.RECOMPUTED
        reasons, scores = self.nsfw.judge_with_scores(
            [c.image for _, c in passing], [bytes.fromhex(c.sha256) for _, c in passing])
        kept = []
        for (i, candidate), reason, score in zip(passing, reasons, scores):
            rows[i] = self._with_nsfw(rows[i], score, reason)
            if not reason:
                kept.append((i, candidate))
        return kept

    def _with_nsfw(self, row: LightRow, score: Optional[float], reason: Optional[str]) -> LightRow:
        """``row`` with its NSFW score (into the histogram too) and, where the stage rejects it, the reason."""
        if score is not None:
            row = row._replace(nsfw_score=score)
            self.histograms.add({NSFW_MEASURE: score})
        if reason:  # NSFW is a quality threshold: under the raw base the row still counts
            row = row._replace(reason=reason, counted=self.preset.counting_base == "raw")
        return row

    def _to_search(self, passing, known):
        """The kept rows to embed: all of them, but with --reuse of the same evaluation index (and no in-corpus
        dedup, which needs every embedding) not those the old build searched and found no match for."""
        if self.previous is None or not self.previous.eval_matches or self.preset.dedup_in_corpus:
            return passing
        return [(i, c) for i, c in passing if not (i in known and known[i].searched and not known[i].eval_match)]

    def _embed_and_match(self, rows, passing) -> List[Tuple[str, object]]:
        from dedup.transforms import match_batch, stack_batch

        outputs = []
        if not passing:
            return outputs
        vectors = np.asarray(self.embedder.embed([c.image for _, c in passing]), np.float32)
        keys, unit = stack_batch([(c.key, v) for (_, c), v in zip(passing, vectors)])
        if self.preset.dedup_in_corpus:
            outputs += [(EMBEDDINGS, (key, vector)) for key, vector in zip(keys, unit)]
        if self.index is not None:
            found = match_batch(self.index, keys, unit)
            thumbnails = {}
            for q, reason in found.rejected:
                i, candidate = passing[q]
                rows[i] = rows[i]._replace(eval_match=reason)
                thumbnails[candidate.key] = thumbnail_b64(candidate.image)
                self.rejected.inc()
            for pair in found.pairs:
                outputs.append((PAIRS, dict(pair, cosine=round(float(pair["cosine"]), 6),
                                            thumbnail=thumbnails.get(pair["key"]))))
        return outputs

    def measures(self) -> List[Tuple[str, List[int]]]:
        return self.histograms.take()

    def nsfw_outcomes(self) -> List[Tuple[Tuple[bool, str], int]]:
        counts, self.nsfw_counts = {**self.nsfw.take_outcomes(), **self.nsfw_counts}, {}
        return sorted(counts.items())

    def reuse_outcomes(self) -> List[Tuple[str, int]]:
        """``(reused|recomputed|new, records)`` since the last call (--reuse; empty otherwise)."""
        counts, self.reuse_counts = sorted(self.reuse_counts.items()), {}
        return counts


#: The evaluation index, one copy per worker process however many DoFn instances it runs.
_INDEXES = Shared()


class _JudgeBase(beam.DoFn):
    def __init__(self, judge: RecordJudge):
        self.judge = judge

    def setup(self):
        self.judge.setup("before" if self.judge.nsfw_step else "whole")

    def _emit(self, outputs) -> Iterator[object]:
        for tag, value in outputs:
            yield value if tag == ROWS else beam.pvalue.TaggedOutput(tag, value)

    def _judged(self, batch) -> Iterator[object]:
        """The batch's outputs; the console's progress told how many records it held and kept."""
        outputs = self.judge.judge(batch)
        progress.tally("judge", records=len(batch), kept=_kept(outputs))
        return self._emit(outputs)

    def _emit_totals(self) -> Iterator[object]:
        for name, counts in self.judge.measures():
            yield beam.pvalue.TaggedOutput(MEASURES, (name, counts))
        for outcome, records in self.judge.nsfw_outcomes():
            yield beam.pvalue.TaggedOutput(NSFW_OUTCOMES, (outcome, records))
        if self.judge.previous is not None:
            for outcome, records in self.judge.reuse_outcomes():
                yield beam.pvalue.TaggedOutput(REUSE_OUTCOMES, (outcome, records))


class _JudgeFiles(_JudgeBase):
    """An input file's path -> its records' outputs; per file, the partial histograms and NSFW outcomes."""

    def __init__(self, judge: RecordJudge, patterns, input_format: Optional[str], columns: Columns):
        super().__init__(judge)
        self.records = FileRecords(patterns, input_format, columns)

    def process(self, path: str):
        batch, records = [], 0
        for ordinal, (reader, source, record) in enumerate(self.records.read(path)):
            batch.append((record, reader, source, ordinal))
            records += 1
            if len(batch) >= BATCH_SIZE:
                yield from self._judged(batch)
                batch = []
        yield from self._judged(batch)
        finished = self.judge.finish()
        progress.tally("judge", kept=_kept(finished), file=path, file_records=records)
        yield from self._emit(finished)
        yield from self._emit_totals()


def _kept(outputs) -> int:
    """Rows that no per-record rule rejected (the second pass's upper bound on the console)."""
    return sum(1 for tag, value in outputs if tag == ROWS and not value.reason)


OUTPUT_TAGS = (MEASURES, PAIRS, EMBEDDINGS, NSFW_OUTCOMES, TO_FETCH)
#: The per-record stages of ``filters.record``, in run order.
RECORD_STAGES = ("image_header", "image_format", "image_size", "image_aspect", "text", "text_length",
                 "text_repetition", "image_decode")


def stages_decided(judge: RecordJudge) -> tuple:
    """The stages the first pass decides: reading, the per-record rules and extra stages, NSFW when it runs,
    model_score when a pair model scores (a pair its decoder cannot read)."""
    return ("read",) + RECORD_STAGES + tuple(e.name for e in judge.extras) + (
        ("nsfw",) if nsfw.stage_enabled(judge.preset.nsfw_threshold) else ()) + (
        ("model_score",) if judge.scorer is not None else ())


class JudgeFiles(beam.PTransform):
    """Input file paths -> ``{"rows": LightRow, "measures", "pairs", "embeddings", "nsfw", "to_fetch"}``."""

    def __init__(self, judge: RecordJudge, file_pattern: str, input_format: Optional[str] = None,
                 columns: Columns = Columns()):
        super().__init__()
        self.judge = judge
        self.decides = stages_decided(judge)
        self.file_pattern = file_pattern
        self.input_format = input_format
        self.columns = columns

    def expand(self, paths):
        dofn = _JudgeFiles(self.judge, input_patterns(self.file_pattern), self.input_format, self.columns)
        tags = OUTPUT_TAGS + ((REUSE_OUTCOMES,) if self.judge.previous is not None else ()) + (
            (PENDING,) if self.judge.nsfw_step else ())
        outputs = paths | "ReadAndJudge" >> beam.ParDo(dofn).with_outputs(*tags, main=ROWS)
        return {ROWS: holding_rows(outputs[ROWS]), **{tag: outputs[tag] for tag in tags}}


class OutcomesNote(beam.PTransform):
    """The workers' ``(outcome, records)`` counts -> at most one ``(stage, note_of(counts))`` for the funnel.

    Nothing when no record was counted: the launcher's note stands.
    """

    def __init__(self, stage: str, note_of):
        super().__init__()
        self.stage, self.note_of = stage, note_of

    def expand(self, outcomes):
        stage, note_of = self.stage, self.note_of
        return (
            outcomes
            | "RecordsPerOutcome" >> beam.CombinePerKey(sum)
            # No outcome makes no note: no default dict for an empty input (five transforms fewer).
            | "Outcomes" >> beam.CombineGlobally(beam.combiners.ToDictCombineFn()).without_defaults()
            | "Note" >> beam.FlatMap(lambda found: [(stage, note_of(found))] if found else [])
        )


def NsfwNote(threshold: float, scorer_name: str = nsfw.DEFAULT_SCORER) -> OutcomesNote:
    """The NSFW scorer's outcomes ``((scored, status), records)`` -> its note (``filters.nsfw.stage_note``)."""
    return OutcomesNote("nsfw", functools.partial(nsfw.stage_note, threshold, scorer_name))


def ReuseNote(said: str) -> OutcomesNote:
    """``(reused|recomputed|new, records)`` -> how many records' facts a rebuild took from the previous build
    (``said``: the launcher's account of which facts), derived again, or met first."""
    return OutcomesNote("reuse", functools.partial(previous_build.reuse_note, said))
