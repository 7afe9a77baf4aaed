"""One fixed-edge histogram combiner for every distribution the build reports.

Convention: one count per edge; bin ``i`` holds ``edges[i] <= v < edges[i+1]``,
the last bin everything from ``edges[-1]`` up, values below ``edges[0]`` count
in the first bin. The frequency filters report counts capped at ``limit + 1``
with a closed last bin ``[limit + 1, limit + 2)``: for capped values that bin
is exactly this open one, so ``close_last_bin`` derives their output from the
same counts.
"""

from __future__ import annotations

import bisect
from typing import List

import apache_beam as beam


def bin_index(edges: List[float], value) -> int:
    """The bin of ``value``: ``edges[i] <= value < edges[i+1]``; below ``edges[0]`` is the first bin."""
    return max(0, bisect.bisect_right(edges, value) - 1)


class HistogramFn(beam.CombineFn):
    """Counts values into fixed bins; a tiny, mergeable accumulator."""

    def __init__(self, edges: List[float]):
        self.edges = list(edges)

    def create_accumulator(self):
        return [0] * len(self.edges)

    def add_input(self, counts, value):
        counts[bin_index(self.edges, value)] += 1
        return counts

    def merge_accumulators(self, accumulators):
        merged = self.create_accumulator()
        for counts in accumulators:
            for i, c in enumerate(counts):
                merged[i] += c
        return merged

    def extract_output(self, counts):
        return {"edges": self.edges, "counts": counts}


def close_last_bin(histogram: dict, upper: float) -> dict:
    """The same counts with the last bin closed at ``upper``: one more edge than counts.

    Exact only when no value reaches ``upper`` (the caller's values are capped below it).
    """
    return {"edges": list(histogram["edges"]) + [upper], "counts": histogram["counts"]}
