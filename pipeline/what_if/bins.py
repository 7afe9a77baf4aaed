"""The bins of the what-if histograms, and the sparse histograms themselves (no Beam).

A *grid* is a sorted list of edges. Every edge is a bin of its own (the
values equal to it), and so is each open interval between two edges, below
the first and above the last::

    bin -1: v < e0     bin 0: v == e0     bin 1: e0 < v < e1     bin 2: v == e1   ...

So a comparison with a threshold that is an edge (``<``, ``<=``, ``>`` or
``>=``, either side of the value) keeps or cuts every bin whole, inclusive
and exclusive thresholds alike: the survivors at an edge are exact. A
threshold inside an open interval splits that bin: the bin's count is the
bound of the estimate there. Integer measures have an edge at every
integer of their exact range (the open intervals between are empty), then
a geometric tail; real measures (aspect ratio, scores, cosines) a decimal
grid (0.01 or 0.001), which holds the presets' values and any value a user
types with that many decimals.

A *histogram* is sparse: ``{bin: count}``; a what-if histogram of a rule is
``{class: {bin: count}}``, the class being where the record ends if the rule
passes it (``pipeline.what_if.rules``). Merging sums counts. In JSON a
histogram is ``[[bin, count], ...]`` in bin order.
"""

from __future__ import annotations

import bisect
import math
from typing import Dict, Iterable, List, Sequence, Tuple

Histogram = Dict[int, int]
ClassHistograms = Dict[str, Histogram]
UNDER = -1
BIG = 1 << 62  # an integer bin open at one end reaches this far


class Grid:
    """Edges, the bin of a value, and each bin's interval."""

    def __init__(self, name: str, edges: Sequence[float], integer: bool):
        self.name = name
        self.edges = list(edges)
        self.integer = integer
        if any(b <= a for a, b in zip(self.edges, self.edges[1:])):
            raise ValueError(f"grid {name}: edges must increase")

    def bin(self, value) -> int:
        i = bisect.bisect_right(self.edges, value) - 1
        if i < 0:
            return UNDER
        return 2 * i if value == self.edges[i] else 2 * i + 1

    def interval(self, b: int) -> Tuple[float, float, bool]:
        """``(lo, hi, is_point)``: the bin's values are ``lo`` (a point) or the open ``(lo, hi)``."""
        if b == UNDER:
            return -math.inf, self.edges[0], False
        i, odd = divmod(b, 2)
        if not odd:
            return self.edges[i], self.edges[i], True
        return self.edges[i], self.edges[i + 1] if i + 1 < len(self.edges) else math.inf, False

    def ends(self, b: int) -> Tuple[float, float]:
        """The smallest and the largest value bin ``b`` can hold (a comparison with any threshold is
        monotone in the value, so it keeps or cuts the whole bin when it agrees on both)."""
        lo, hi, point = self.interval(b)
        if point:
            return lo, lo
        if self.integer:  # the integers strictly inside
            return (math.floor(lo) + 1 if lo > -math.inf else -BIG), (math.ceil(hi) - 1 if hi < math.inf else BIG)
        return math.nextafter(lo, math.inf), math.nextafter(hi, -math.inf)



def integer_grid(name: str, exact_up_to: int, top: int, per_octave: int) -> Grid:
    """Every integer 0..exact_up_to, then about ``per_octave`` integer edges per doubling up to ``top``."""
    edges = list(range(exact_up_to + 1))
    k = 1
    while True:
        edge = int(round(exact_up_to * 2 ** (k / per_octave)))
        if edge > top:
            break
        if edge > edges[-1]:
            edges.append(edge)
        k += 1
    return Grid(name, edges, integer=True)


def decimal_grid(name: str, lo: int, hi: int, scale: int, tail: Iterable[float] = ()) -> Grid:
    """``k / scale`` for k in lo..hi (correctly rounded: ``250 / 100 == 2.5 == float("2.5")``), then ``tail``."""
    return Grid(name, [k / scale for k in range(lo, hi + 1)] + list(tail), integer=False)


# ---------------------------------------------------------------------------
# Sparse histograms
# ---------------------------------------------------------------------------


def add(hists: ClassHistograms, cls: str, b: int, n: int = 1) -> None:
    hist = hists.get(cls)
    if hist is None:
        hist = hists[cls] = {}
    hist[b] = hist.get(b, 0) + n


def merge_into(target: Dict[str, ClassHistograms], other: Dict[str, ClassHistograms]) -> Dict[str, ClassHistograms]:
    """``{rule: {class: {bin: count}}}`` summed into ``target``."""
    for rule, classes in other.items():
        mine = target.setdefault(rule, {})
        for cls, hist in classes.items():
            into = mine.setdefault(cls, {})
            for b, n in hist.items():
                into[b] = into.get(b, 0) + n
    return target


def to_json(hist: Histogram) -> List[List[int]]:
    return [[b, n] for b, n in sorted(hist.items()) if n]


def from_json(pairs) -> Histogram:
    """``[[bin, count], ...]`` -> ``{bin: count}``; anything else is a ``ValueError``."""
    out: Histogram = {}
    for pair in pairs:
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair) or pair[1] < 0):
            raise ValueError(f"a histogram entry must be [bin, count], got {pair!r}")
        out[pair[0]] = out.get(pair[0], 0) + pair[1]
    return out
