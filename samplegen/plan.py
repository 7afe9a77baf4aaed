"""The plan model: every candidate row, its picture recipe and its expected fate.

Rows are grouped in units that are drawn (and re-drawn) together; a unit
draws from its own ``(seed, STREAM_ROW, slot, attempt)`` stream, so the plan
depends on the seed only. Also here: the ALIGN thresholds the expectations
are computed against, and the small predicates on alt-texts the cases and
checks share.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from common.schema import make_key
from filters import stages
from filters import text as text_lib
from filters.text import normalize_text, words


WRITTEN = "written"
WRITTEN_ONCE = "written_once"

# What a row's alt-text says about its own picture (the manifest's "pairing"):
# it describes it, or it describes another picture. Rows with no picture of
# their own, or an alt-text that describes nothing (boilerplate, junk, keyword
# lists, fixed words), have none.
CLEAN = "clean"
MISMATCHED = "mismatched"
# Planted mismatched pairs per ordinary candidate: web alt-text is noisy, and
# a model-score stage is judged by how many of them it finds.
MISMATCHED_SHARE = 0.05
# The manifest's "expected_with_model_score" of a mismatched pair that
# reaches the model-score stage: rejected there, under whichever cut the
# build sets (model_score/below_threshold or model_score/outside_top_fraction).
SCORED_OUT = "model_score"

# ALIGN preset values the per-record expectations use (checked against
# filters.presets in the tests, not imported: the manifest is a statement of
# the rules, not a copy of the code under test).
MIN_SHORTER_SIDE = 200
MAX_ASPECT = 3.0
MAX_PIXELS = 89_478_485
MAX_TEXTS_PER_IMAGE = 1000
MAX_IMAGES_PER_TEXT = 10
TEXTS_PER_IMAGE_ROWS = 1010

# Vocabulary for the tiny corpus: n-grams seen at least this often are in it.
MIN_NGRAM_COUNT = 2
# Margin kept on top of it for every alt-text expected to be written: each of
# its n-grams occurs at least this often among the rows that pass the read
# stage (a subset of what the build counts), so one row more or less never
# flips a verdict.
NGRAM_SUPPORT = MIN_NGRAM_COUNT + 1
MAX_IMAGES_PER_ORDINARY_TEXT = 3
# Ordinary images stay this far below the near-duplicate embedder's threshold.
NEAR_DUPLICATE_MARGIN = 0.1
NEAR_DUPLICATE_EMBEDDER = "dct"
# k-means clusters for the near-duplicate buckets: the preset's 4096 needs far
# more images than the sample has; 16 still leaves C(10,3) = 120 buckets.
SAMPLE_NUM_CLUSTERS = 16

# Random streams (the second entry of every seed sequence).
STREAM_ROW, STREAM_URL, STREAM_SHUFFLE, STREAM_EVAL = 1, 2, 3, 4


def seeded(seed: int, *stream: int) -> np.random.Generator:
    """The generator of one random stream: ``default_rng([seed, stream, ...])``."""
    return np.random.default_rng([seed, *stream])


def expected_image_fate(width: int, height: int) -> str:
    """The ALIGN header rules on an (oriented) size: shorter side > 200, ratio < 3."""
    shorter, longer = sorted((width, height))
    if shorter <= MIN_SHORTER_SIDE:
        return stages.reason("image_size", "too_small")
    if longer / shorter >= MAX_ASPECT:
        return stages.reason("image_aspect", "too_elongated")
    return WRITTEN


def word_count(caption: str) -> int:
    return text_lib.word_count(normalize_text(caption))


def wording_key(caption: str) -> str:
    """Coarser than ``text_identity`` (punctuation and spacing ignored): the
    "at most 3 images per ordinary alt-text" rule uses it."""
    return " ".join(words(normalize_text(caption)))


def ordinary_length(caption: str) -> bool:
    return 3 <= word_count(caption) <= 20


# ---------------------------------------------------------------------------
# The plan: rows, grouped in units that are drawn (and re-drawn) together
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Recipe:
    """How one image's bytes are made (rendered in a worker process)."""

    content: Optional[dict] = None  # scene / photo spec (its "size" is the oriented size)
    size: Optional[Tuple[int, int]] = None  # displayed (oriented) size
    encode: tuple = ("jpeg", 88)
    edit: tuple = ()  # near-duplicate edit applied before encoding
    raw: Optional[bytes] = None  # fixed bytes (garbage, html, ...); None -> render
    header_size: Optional[Tuple[int, int]] = None  # for bombs: declared size


@dataclasses.dataclass
class Row:
    slot: int
    case: str
    expected: str
    note: str
    caption: Optional[str] = None
    recipe: Optional[Recipe] = None
    status: str = "success"
    error_message: Optional[str] = None
    reported_size: object = "header"  # "header": img2dataset's width/height; None; or (w, h)
    url: Optional[str] = None  # set for rows that share a URL
    url_ext: str = "jpg"
    shared_caption: bool = False  # planted shared alt-text: exempt from the 3-images rule
    missing_column: bool = False
    pairing: Optional[str] = None  # CLEAN, MISMATCHED or None (see above)

    @property
    def stage(self) -> str:
        return "" if self.expected in (WRITTEN, WRITTEN_ONCE) else stages.stage_of(self.expected)

    def reaches(self, stage: str) -> bool:
        """Does the row get to ``stage`` (not rejected by an earlier one)?"""
        if self.missing_column:
            return False
        if self.expected in (WRITTEN, WRITTEN_ONCE):
            return True
        return stages.STAGE_INDEX[self.stage] >= stages.STAGE_INDEX[stage]

    @property
    def expected_with_model_score(self) -> str:
        """The fate under a build that also runs the model-score stage with a model that tells a mismatched
        pair from a clean one: a mismatched pair that reaches the stage is rejected there (it runs before
        the corpus stages, so that is its first reason); every other row keeps ``expected``."""
        if self.pairing == MISMATCHED and self.reaches(SCORED_OUT):
            return SCORED_OUT
        return self.expected

    @property
    def should_be_frequent(self) -> bool:
        """Its alt-text's n-grams must all be in the vocabulary."""
        return self.reaches("rare_ngrams") and self.stage != "rare_ngrams"


@dataclasses.dataclass
class Unit:
    """Rows drawn together (a duplicate pair shares one drawing)."""

    rows: List[Row]
    draw: Callable[["Unit", np.random.Generator], None]
    fixed_caption: bool = False  # re-drawing changes the picture, never the alt-text
    attempt: int = 0

    @property
    def slot(self) -> int:
        return self.rows[0].slot


class Plan:
    def __init__(self, seed: int):
        self.seed = seed
        self.units: List[Unit] = []
        self.next_slot = 0
        self.num_candidates = 0
        self.evaluation: List[Tuple[str, str, int, dict]] = []  # (split, class, index, spec)
        self.eval_test: List[Tuple[str, dict]] = []  # (path, spec) of the eval/test images
        self.facts: Dict[str, object] = {}

    @property
    def rows(self) -> List[Row]:
        return [row for unit in self.units for row in unit.rows]

    def add(self, case, expected, note, draw, count=1, **fields) -> Unit:
        rows = []
        for _ in range(count):
            rows.append(Row(self.next_slot, case, expected, note, **fields))
            self.next_slot += 1
        unit = Unit(rows, draw, getattr(draw, "fixed_caption", False))
        self.redraw(unit, attempt=0)
        self.units.append(unit)
        return unit

    def redraw(self, unit: Unit, attempt: int) -> None:
        unit.attempt = attempt
        unit.draw(unit, seeded(self.seed, STREAM_ROW, unit.slot, attempt))


def row_key(row: Row) -> str:
    return make_key(row.url, "" if row.missing_column or row.caption is None else row.caption)
