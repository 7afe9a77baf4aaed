"""Settle and verify: the plan's expectations hold before anything is written.

``settle`` re-draws units (deterministically) until every alt-text expected
to be written has frequent n-grams, no ordinary alt-text is used by more than
3 images, and no ordinary picture is close to an evaluation image under the
build's near-duplicate embedder (``NearDuplicateGuard``); ``verify_plan``
recomputes every whole-corpus expectation from the rows and fails loudly.
"""

from __future__ import annotations

import collections
import functools
from typing import Dict, List, Optional, Tuple

import numpy as np

from filters.text import ngrams, normalize_text, text_identity
from samplegen.evalset import EVAL_SET
from samplegen.plan import (
    CLEAN, MAX_IMAGES_PER_ORDINARY_TEXT, MAX_IMAGES_PER_TEXT, MAX_TEXTS_PER_IMAGE, MIN_NGRAM_COUNT, MISMATCHED,
    NEAR_DUPLICATE_EMBEDDER, NEAR_DUPLICATE_MARGIN, NGRAM_SUPPORT, WRITTEN, WRITTEN_ONCE, Plan, Row, row_key,
    word_count, wording_key,
)
from samplegen.render import Workers, thumbnail


class PlanError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def ngram_list(caption: str) -> tuple:
    return tuple(ngrams(normalize_text(caption)))


@functools.lru_cache(maxsize=None)
def ngram_set(caption: str) -> frozenset:
    return frozenset(ngram_list(caption))


def ngram_support(plan: Plan) -> collections.Counter:
    """n-gram occurrences over the alt-texts of every row that passes the read stage."""
    support = collections.Counter()
    for row in plan.rows:
        if row.reaches("image_header"):
            support.update(ngram_list(row.caption))
    return support


def rare_rows(plan: Plan) -> List[Row]:
    """Rows expected to be written whose alt-text has an n-gram short of the margin."""
    support = ngram_support(plan)
    return [row for row in plan.rows
            if row.should_be_frequent and any(support[g] < NGRAM_SUPPORT for g in ngram_set(row.caption))]


def overused_rows(plan: Plan) -> List[Row]:
    """Ordinary rows whose alt-text is already used by 3 other images, or is a planted shared one."""
    reserved = {wording_key(r.caption) for r in plan.rows if r.shared_caption and r.caption}
    images = collections.defaultdict(list)
    for row in plan.rows:
        if row.reaches("images_per_text") and not row.shared_caption:
            images[wording_key(row.caption)].append(row)
    bad = []
    for key, rows in images.items():
        distinct, kept = set(), 0
        for row in sorted(rows, key=lambda r: r.slot):
            if key in reserved:
                bad.append(row)
            elif id(row.recipe) in distinct:
                continue
            elif kept < MAX_IMAGES_PER_ORDINARY_TEXT:
                distinct.add(id(row.recipe))
                kept += 1
            else:
                bad.append(row)
    return bad


class NearDuplicateGuard:
    """The build's near-duplicate embedder and eval/test index, for the plan's checks.

    The index is built exactly as the build builds it (``dedup.index_sets``,
    with its flipped and centre-cropped variants). Ordinary pictures are
    embedded from a 32x32 rendering (cheap) and kept ``NEAR_DUPLICATE_MARGIN``
    below the threshold; planted copies are embedded from their real bytes.
    """

    def __init__(self, eval_test: List[Tuple[str, bytes]], workers: Workers):
        from dedup import embedders
        from dedup.index_sets import IndexImage, build_index

        self.embedder = embedders.get(NEAR_DUPLICATE_EMBEDDER)
        self.limit = self.embedder.threshold - NEAR_DUPLICATE_MARGIN
        self.workers = workers
        index = build_index([IndexImage(EVAL_SET, path, data) for path, data in eval_test], self.embedder)
        self.index, self.keys = index.vectors, index.keys
        self.cache: Dict[Tuple[int, int], float] = {}

    def similarity_to(self, data: bytes, key: str) -> float:
        vector = self.embedder.embed([data])[0]
        return float((self.index[self.keys == key] @ vector).max())

    @staticmethod
    def applies(row: Row) -> bool:
        """Pictures that reach the near-duplicate stage and are not planted copies."""
        return (row.reaches("near_duplicate_eval") and row.stage != "near_duplicate_eval"
                and row.recipe is not None and row.recipe.content is not None)

    def final_max(self, plan: Plan) -> float:
        values = [self.cache.get((u.slot, u.attempt), 0.0) for u in plan.units if self.applies(u.rows[0])]
        return max(values, default=0.0)

    def similarity(self, specs: List[dict]) -> np.ndarray:
        if not specs:
            return np.zeros(0)
        vectors = self.embedder.embed_pil(self.workers.map(thumbnail, specs, chunksize=64))
        return (vectors @ self.index.T).max(axis=1)

    def too_close(self, plan: Plan) -> List[Row]:
        todo, keys = [], []
        for unit in plan.units:
            row = unit.rows[0]
            if self.applies(row):
                key = (unit.slot, unit.attempt)
                if key not in self.cache:
                    todo.append(row.recipe.content)
                    keys.append(key)
        for key, value in zip(keys, self.similarity(todo)):
            self.cache[key] = float(value)
        bad = []
        for unit in plan.units:
            value = self.cache.get((unit.slot, unit.attempt))
            if value is not None and self.applies(unit.rows[0]):
                if value > self.limit:
                    bad.extend(unit.rows)
        return bad


def settle(plan: Plan, guard: Optional[NearDuplicateGuard], max_rounds: int = 60) -> int:
    """Re-draw units until every expectation about alt-texts and pictures holds.

    A unit whose alt-text is rare or overused is re-worded (and re-drawn);
    one whose picture is close to an evaluation image is re-drawn. Units are
    visited in slot order and each draws from its own (slot, attempt) stream,
    so the outcome depends on the seed only.
    """
    by_slot = {row.slot: unit for unit in plan.units for row in unit.rows}
    for round_index in range(max_rounds):
        wording = rare_rows(plan) + overused_rows(plan)
        stuck = sorted({r.case for r in wording if by_slot[r.slot].fixed_caption})
        if stuck:
            raise PlanError(f"planted alt-texts break the plan's expectations: {stuck}")
        bad_rows = wording + (guard.too_close(plan) if guard else [])
        if not bad_rows:
            return round_index
        units = {by_slot[r.slot].slot: by_slot[r.slot] for r in bad_rows}
        for slot in sorted(units):
            plan.redraw(units[slot], units[slot].attempt + 1)
    raise PlanError(f"alt-texts still rare or overused after {max_rounds} rounds of re-drawing")


def _sharing_problems(rows, stage, limit, group_of, member_of):
    """Rows reaching ``stage`` whose expected fate disagrees with "group has > limit distinct members"."""
    members = collections.defaultdict(set)
    for row in rows:
        if row.reaches(stage):
            members[group_of(row)].add(member_of(row))
    return [f"{row.case}: {stage} expectation does not match the rows ({row.caption!r})"
            for row in rows
            if row.reaches(stage) and (len(members[group_of(row)]) > limit) != (row.stage == stage)]


def verify_plan(plan: Plan) -> Dict[str, object]:
    """Recompute every whole-corpus expectation from the rows; fail loudly on a mismatch."""
    rows = [r for r in plan.rows if not r.missing_column]
    problems = []
    # Rows expected to pass the per-record text rules have a 3..20-word alt-text.
    for row in rows:
        if row.reaches("text_repetition") and not (3 <= word_count(row.caption) <= 20):
            problems.append(f"{row.case}: {row.caption!r} should pass the length rule")
    # texts per image: per recipe (one image), distinct alt-texts of the rows reaching the stage.
    problems += _sharing_problems(rows, "texts_per_image", MAX_TEXTS_PER_IMAGE,
                                  lambda row: id(row.recipe), lambda row: text_identity(row.caption))
    # images per text: per alt-text, distinct images among rows reaching the stage.
    problems += _sharing_problems(rows, "images_per_text", MAX_IMAGES_PER_TEXT,
                                  lambda row: text_identity(row.caption), lambda row: id(row.recipe))
    # rare n-grams: vocabulary = n-grams with >= MIN_NGRAM_COUNT occurrences over *all* alt-texts
    # (an upper bound for what the pipeline counts); junk must have one n-gram outside it.
    occurrences = collections.Counter()
    for row in rows:
        if row.caption is not None:
            occurrences.update(ngrams(normalize_text(row.caption)))
    for row in rows:
        if row.reaches("rare_ngrams") and row.stage == "rare_ngrams":
            if all(occurrences[g] >= MIN_NGRAM_COUNT for g in ngrams(normalize_text(row.caption))):
                problems.append(f"{row.case}: {row.caption!r} has no rare n-gram")
    rare = rare_rows(plan)
    problems += [f"{r.case}: {r.caption!r} has a rare n-gram" for r in rare]
    # A row that should be written says whether its alt-text describes its picture.
    for row in rows:
        if row.expected in (WRITTEN, WRITTEN_ONCE) and row.pairing not in (CLEAN, MISMATCHED):
            problems.append(f"{row.case}: expected to be written, but its pairing is not stated")
    # One pipeline key per row, except the planted repeats.
    keys = collections.Counter(row_key(r) for r in plan.rows)
    for row in plan.rows:
        if (keys[row_key(row)] > 1) != (row.expected == WRITTEN_ONCE):
            problems.append(f"{row.case}: pipeline key {row_key(row)} repeats unexpectedly")
    if problems:
        raise PlanError("the sample's expectations do not hold:\n  " + "\n  ".join(sorted(set(problems))[:30]))
    return {"vocabulary_ngrams": sum(1 for g, c in occurrences.items() if c >= MIN_NGRAM_COUNT),
            "ngrams": len(occurrences)}
