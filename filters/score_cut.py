"""The model-score stage's rule: which scored pairs it keeps (an absolute threshold, a top fraction).

A pair's score is its image-text cosine (``filters.model_score``). The
stage keeps a pair when both cuts keep it:

- ``model_score_threshold``: cosine >= the threshold (-1: off);
- ``model_score_top_fraction`` f: the pair is among the ``round(f * N)``
  highest of the N pairs scored (1: off). DataComp keeps the top 30%.

The top fraction needs the corpus-wide quantile, and no worker may see the
corpus: pairs are put in one total order by ``order_key`` (the score as a
32-bit fixed-point number, then a hash of the pair's key, so that equal
scores still order and the kept count is exact), and the cut is the
``r``-th smallest order key, ``r = N - round(f * N)``, found digit by digit
(``DIGITS`` digits of ``DIGIT_BITS`` bits): each step counts the pairs under
the prefix found so far by their next digit (a histogram of at most
2^16 counts, merged from partial ones), and ``choose_digit`` picks the digit
holding the ``r``-th. Four small merges, never a list of pairs.

Kept by the fraction: ``order_key >= cut``, exactly ``round(f * N)`` pairs
(more only when one key is scored twice with the same score: the same pair
read twice, which the duplicate-pair stage reduces to one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Dict, Optional, Tuple

from filters import stages
from filters.presets import PARAMS_BY_NAME, compare, rule_enabled

BELOW_THRESHOLD = stages.reason("model_score", "below_threshold")
OUTSIDE_TOP_FRACTION = stages.reason("model_score", "outside_top_fraction")
UNDECODABLE = stages.reason("model_score", "undecodable")
#: The threshold's comparison that keeps a pair (``filters.presets``, where the direction is written).
THRESHOLD_KEEPS = PARAMS_BY_NAME["model_score_threshold"].keep

SCORE_BITS = 32
KEY_BITS = 32
DIGIT_BITS = 16
DIGITS = (SCORE_BITS + KEY_BITS) // DIGIT_BITS
#: Above every order key: the fraction keeps nothing.
NOTHING = 1 << (SCORE_BITS + KEY_BITS)


def fixed_point(score: float) -> int:
    """A cosine in [-1, 1] as an unsigned 32-bit number, in the same order (finer than float32's steps above 1e-9)."""
    clipped = min(1.0, max(-1.0, float(score)))
    return min((1 << SCORE_BITS) - 1, int((clipped + 1.0) * (1 << (SCORE_BITS - 1))))


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=KEY_BITS // 8).digest(), "big")


def order_key(score: float, key: str) -> int:
    """The pair's place in the stage's total order: by score, then by a hash of its key."""
    return (fixed_point(score) << KEY_BITS) | key_hash(key)


def score_of(order: int) -> float:
    """The (fixed-point) score an order key starts with: what the audit draws as the fraction's cut."""
    return (order >> KEY_BITS) / (1 << (SCORE_BITS - 1)) - 1.0


def kept_count(scored: int, fraction: float) -> int:
    """``round(fraction * scored)``, halves up (Python's ``round`` goes to even)."""
    return min(scored, max(0, math.floor(fraction * scored + 0.5)))


def digit(order: int, level: int) -> int:
    """The ``level``-th digit of an order key, most significant first."""
    return (order >> (DIGIT_BITS * (DIGITS - 1 - level))) & ((1 << DIGIT_BITS) - 1)


def prefix(order: int, level: int) -> int:
    """The order key's first ``level`` digits (0 for level 0)."""
    return order >> (DIGIT_BITS * (DIGITS - level))


@dataclasses.dataclass(frozen=True)
class Search:
    """Where the search for the ``rank``-th smallest order key stands after ``level`` digits.

    ``found``: the digits chosen so far (the prefix); ``rank``: the wanted
    key's rank among the keys under that prefix. ``cut`` is set once known
    (``rank`` 0 of all: 0, the fraction keeps every pair; nothing to find:
    ``NOTHING``).
    """

    level: int
    found: int
    rank: int
    cut: Optional[int] = None

    def wants(self, order: int) -> bool:
        """Is this key under the prefix, so that its next digit is counted?"""
        return self.cut is None and prefix(order, self.level) == self.found


def start(scored: int, fraction: float) -> Search:
    """The search for the fraction's cut over ``scored`` pairs."""
    rejected = scored - kept_count(scored, fraction)
    if rejected <= 0:
        return Search(0, 0, 0, cut=0)
    if rejected >= scored:
        return Search(0, 0, 0, cut=NOTHING)
    return Search(0, 0, rejected)


def choose_digit(search: Search, counts: Dict[int, int]) -> Search:
    """One step: the digit under which the ``rank``-th key lies, from how many keys each next digit holds."""
    if search.cut is not None:
        return search
    below = 0
    for value in sorted(counts):
        if below + counts[value] > search.rank:
            found = (search.found << DIGIT_BITS) | value
            level = search.level + 1
            rank = search.rank - below
            return Search(level, found, rank, cut=found if level == DIGITS else None)
        below += counts[value]
    raise ValueError(f"rank {search.rank} past the {below} keys under the prefix: the counts changed between steps")


def top_fraction_cut(orders, fraction: float) -> int:
    """The cut on a list of order keys, as the stage finds it digit by digit (tests and small callers)."""
    search = start(len(orders), fraction)
    while search.cut is None:
        counts: Dict[int, int] = {}
        for order in orders:
            if search.wants(order):
                counts[digit(order, search.level)] = counts.get(digit(order, search.level), 0) + 1
        search = choose_digit(search, counts)
    return search.cut


@dataclasses.dataclass(frozen=True)
class Cut:
    """Both cuts as the stage applies them: ``threshold`` (None: off) and the fraction's ``order`` cut (0: off)."""

    threshold: Optional[float]
    order: int = 0

    def reason(self, score: float, key: str) -> Optional[str]:
        """The pair's rejection, or None: kept. Below the threshold is said first when both cut it."""
        if not math.isfinite(score):  # NaN: the model's decoder failed
            return UNDECODABLE
        if self.threshold is not None and not compare(THRESHOLD_KEEPS, score, self.threshold):
            return BELOW_THRESHOLD
        if self.order and order_key(score, key) < self.order:
            return OUTSIDE_TOP_FRACTION
        return None

    def lowest_kept(self) -> Optional[float]:
        """The lowest score either cut keeps (None: both off), for the plots and the funnel's note."""
        found = [c for c in (self.threshold, score_of(self.order) if self.order else None) if c is not None]
        return max(found) if found else None


def cut_values(preset) -> Tuple[Optional[float], Optional[float]]:
    """``(threshold or None, top fraction or None)`` of a preset; None for a cut that is off."""
    values = preset.as_dict()
    threshold = values["model_score_threshold"] if rule_enabled("model_score_threshold", values) else None
    fraction = values["model_score_top_fraction"] if rule_enabled("model_score_top_fraction", values) else None
    return threshold, fraction


def otsu_threshold(histogram: dict) -> float:
    """The label-blind threshold of a score histogram: Otsu's cut, at a bin edge.

    ``histogram`` is ``{"edges": lower edges, "counts": counts}`` (the stage's
    ``stats/distributions.json`` entry, bins of 0.05). Each inner edge splits
    the pairs in two; the threshold is the edge at which the between-class
    variance ``w0 * w1 * (mean0 - mean1) ** 2`` of the bin centres is
    largest (Otsu, 1979): the point that best separates a low mode of
    mismatched pairs from a high mode of matching ones, read without a
    single label. Where several edges tie (empty bins between the two
    modes), the middle one (the lower of two). Keeping
    ``cosine >= threshold`` then keeps the upper class.
    """
    edges, counts = list(histogram["edges"]), [float(c) for c in histogram["counts"]]
    if len(edges) != len(counts) or len(edges) < 2:
        raise ValueError("a histogram needs as many edges as counts, two at least")
    widths = [b - a for a, b in zip(edges, edges[1:])]
    centres = [a + w / 2 for a, w in zip(edges, widths)] + [edges[-1] + widths[-1] / 2]
    total = sum(counts)
    if total <= 0:
        raise ValueError("an empty histogram has no threshold")
    mean = sum(c * x for c, x in zip(counts, centres)) / total
    best, chosen, below, below_sum = -1.0, [], 0.0, 0.0
    for index in range(1, len(edges)):
        below += counts[index - 1]
        below_sum += counts[index - 1] * centres[index - 1]
        if below <= 0 or below >= total:
            continue
        mean0 = below_sum / below
        mean1 = (mean * total - below_sum) / (total - below)
        variance = below * (total - below) * (mean0 - mean1) ** 2
        if variance > best * (1 + 1e-9):
            best, chosen = variance, [index]
        elif variance >= best * (1 - 1e-9):
            chosen.append(index)
    if not chosen:
        raise ValueError("every pair is in one bin: no threshold splits them")
    return float(round(edges[chosen[(len(chosen) - 1) // 2]], 6))
