"""Exact near-duplicate search over k-means lists, bounded by the triangle inequality.

ALIGN's buckets (``dedup.buckets``) compare a pair only if the two images
share 3 of their 10 nearest clusters. Two near-duplicates can sit on either
side of a cluster boundary and share fewer, so the rule loses pairs: a few in
10^4 on uniform data, most of them in a dense mass of images unless the
centroids are thinned (benchmarks/RESULTS.md). This module uses the same
k-means centroids with a bound instead of a rule, and loses nothing.

**The bound.** Every index row ``x`` lives in the list of its nearest centroid
``c`` at angle ``a(x) = ang(x, c)``; the list's radius is ``R_c = max a(x)``.
Angles on the sphere obey the triangle inequality, so for a query ``q``

    ang(q, c) <= ang(q, x) + ang(x, c) <= ang(q, x) + R_c.

A near-duplicate has ``cos(q, x) > t``, i.e. ``ang(q, x) < theta = arccos t``,
hence ``ang(q, c) < theta + R_c``, i.e. ``cos(q, c) > cos(theta + R_c)``.
Comparing ``q`` with every row of every list that passes this test finds every
pair above the threshold, *whatever the centroids are*: centroids only decide
how much is compared. Each row is in one list, so each pair is compared once.
The pairs found are a superset of what ALIGN's buckets find (all pairs with
cosine > t, shared bucket or not). Float error is covered by widening every
radius by ``ANGLE_MARGIN``.

**The computation.** One matrix product ``C @ Q.T`` gives a batch of queries
its cosines to all centroids (the same product that top-10 assignment needs),
one comparison per entry says which lists each query probes. Lists are
ordered by *block* (a coarse k-means over the centroids, ~39 lists per block),
so a block's rows are contiguous. Per block, the cheaper of two plans runs:
one product of all queries probing any list of the block with all the block's
rows, or one product per probed list with just its queries, where each numpy
call is charged ``call_overhead`` dot products. On uniform data blocks are
usually merged; in a dense region where hundreds of lists are probed by the
same queries, merging turns many small products into a few large ones.

The cost is what exactness costs: in a region denser than the threshold
radius (Zipf data, benchmarks/RESULTS.md) a query is compared with every row
that could be within ``theta``, thousands where the buckets compare ~200.
"""

from __future__ import annotations

import dataclasses
import numpy as np

from common.vectors import l2_normalize
from dedup import kmeans as kmeans_lib

#: Radians added to every list radius: float32 cosines near 1 give angles
#: accurate to ~5e-4 rad; the margin only makes the bound looser (still exact).
ANGLE_MARGIN = 2e-3

#: Lists per block (coarse cluster of centroids); faiss's own minimum of 39
#: points per centroid makes the coarse k-means well posed.
LISTS_PER_BLOCK = kmeans_lib.MIN_POINTS_PER_CENTROID

#: One numpy product call's fixed cost, in dot products (measured on 2 cores
#: at D = 64: 30k-100k all within 10% on Zipf data; merged blocks win on
#: uniform data at any value).
DEFAULT_CALL_OVERHEAD = 50_000

#: Largest similarity matrix computed at once (entries): 16 MiB of float32.
MAX_PRODUCT_ENTRIES = 1 << 22
#: How far below the threshold a matrix product's cosine may be and still be verified pair by pair. A row of
#: a float32 matrix product moves by ~1e-7 with the other rows in it (the blocking follows the batch); the
#: verified cosine is one pair's dot product, the same whatever was searched beside it.
VERIFY_MARGIN = 1e-4


@dataclasses.dataclass
class Matches:
    """Pairs above the threshold, sorted by (query row, index row)."""

    query_rows: np.ndarray  # int64
    index_rows: np.ndarray  # int64
    cosines: np.ndarray  # float32
    probed_lists: int = 0  # (query, list) probes
    compared_pairs: int = 0  # dot products computed

    def __len__(self) -> int:
        return int(len(self.query_rows))


def _empty(probed=0, compared=0) -> Matches:
    return Matches(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), probed, compared)


def _block_of_centroids(centroids: np.ndarray, lists_per_block: int, seed: int) -> np.ndarray:
    """Coarse cluster id per centroid (0 for all when there are too few for two blocks)."""
    blocks = len(centroids) // max(1, lists_per_block)
    if blocks < 2:
        return np.zeros(len(centroids), np.int64)
    coarse = kmeans_lib.train_spherical_kmeans(centroids, blocks, niter=10, seed=seed)
    return kmeans_lib.CentroidAssigner(coarse).top_clusters(centroids, 1)[:, 0].astype(np.int64)


class ClusterListIndex:
    """Index rows in k-means lists with angular radii; ``search`` returns every pair with cosine > threshold.

    Args:
      vectors: ``[M, D]`` index rows (normalised here; all-zero rows can
        match nothing and are left out).
      centroids: ``[K, D]`` k-means centroids (any unit vectors work; good
        ones make the search fast, not correct).
      threshold: cosine in (0, 1); pairs with cosine > threshold are found.
    Picklable: numpy arrays only.
    """

    def __init__(
        self,
        vectors: np.ndarray,
        centroids: np.ndarray,
        threshold: float,
        lists_per_block: int = LISTS_PER_BLOCK,
        call_overhead: int = DEFAULT_CALL_OVERHEAD,
        seed: int = kmeans_lib.DEFAULT_SEED,
    ):
        if not 0.0 < float(threshold) < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.threshold = float(threshold)
        self.call_overhead = int(call_overhead)
        vectors = l2_normalize(vectors) if len(vectors) else np.zeros((0, centroids.shape[1]), np.float32)
        centroids = l2_normalize(centroids)
        if vectors.shape[1] != centroids.shape[1]:
            raise ValueError(f"index vectors have dimension {vectors.shape[1]}, centroids {centroids.shape[1]}")
        block = _block_of_centroids(centroids, lists_per_block, seed)
        list_order = np.argsort(block, kind="stable")  # list id -> original centroid
        self.centroids = np.ascontiguousarray(centroids[list_order])
        num_lists = len(self.centroids)
        self.block_starts = np.searchsorted(block[list_order], np.arange(block.max() + 2)).astype(np.int64)

        nonzero = np.flatnonzero(np.abs(vectors).sum(axis=1) > 0)
        home, home_cos = _nearest(vectors[nonzero], self.centroids)
        order = np.argsort(home, kind="stable")
        #: original index row of each stored row (stored rows are grouped by list)
        self.row_ids = nonzero[order].astype(np.int64)
        self.rows = np.ascontiguousarray(vectors[self.row_ids])
        self.list_starts = np.searchsorted(home[order], np.arange(num_lists + 1)).astype(np.int64)
        angles = np.arccos(np.clip(home_cos[order].astype(np.float64), -1.0, 1.0))
        radius = np.full(num_lists, -np.inf)
        np.maximum.at(radius, home[order], angles)
        empty = np.isneginf(radius)
        reach = np.where(empty, 0.0, radius) + np.arccos(self.threshold) + ANGLE_MARGIN
        # A list is probed iff cos(q, c) >= probe_cosine: empty lists never
        # (+inf), lists that reach past the antipode always (-inf).
        probe_cosine = np.where(reach >= np.pi, -np.inf, np.cos(np.minimum(reach, np.pi)))
        self.probe_cosine = np.where(empty, np.inf, probe_cosine).astype(np.float32)

    @property
    def num_rows(self) -> int:
        return int(len(self.row_ids))

    def probes(self, queries: np.ndarray) -> np.ndarray:
        """``bool [K, B]``: list k may hold a near-duplicate of query b (candidate generation)."""
        return (self.centroids @ queries.T) >= self.probe_cosine[:, None]

    def search(self, queries: np.ndarray, normalized: bool = False) -> Matches:
        """Every (query row, index row) pair with cosine > threshold, in ``Matches``."""
        queries = np.asarray(queries, np.float32)
        if queries.ndim != 2 or (len(queries) and queries.shape[1] != self.centroids.shape[1]):
            raise ValueError(f"queries must be [B, {self.centroids.shape[1]}], got {queries.shape}")
        if len(queries) == 0 or self.num_rows == 0:
            return _empty()
        if not normalized:
            queries = l2_normalize(queries)
        probe = self.probes(queries)
        found_q, found_r, found_c = [], [], []
        compared = 0

        def compare(query_ids, row_start, row_stop):
            nonlocal compared
            rows = self.rows[row_start:row_stop]
            step = max(1, MAX_PRODUCT_ENTRIES // max(1, len(rows)))
            for s in range(0, len(query_ids), step):
                ids = query_ids[s : s + step]
                sims = queries[ids] @ rows.T
                compared += sims.size
                qi, ri = np.nonzero(sims > self.threshold - VERIFY_MARGIN)
                if len(qi):
                    cosines = np.einsum("ij,ij->i", queries[ids[qi]], rows[ri])
                    kept = cosines > np.float32(self.threshold)
                    found_q.append(ids[qi[kept]])
                    found_r.append(self.row_ids[row_start + ri[kept]])
                    found_c.append(cosines[kept])

        sizes = np.diff(self.list_starts)
        for b in range(len(self.block_starts) - 1):
            first, last = self.block_starts[b], self.block_starts[b + 1]
            row_start, row_stop = self.list_starts[first], self.list_starts[last]
            if row_stop == row_start:
                continue
            block_probe = probe[first:last]
            per_list = block_probe.sum(axis=1)
            probed = np.flatnonzero(per_list)
            if len(probed) == 0:
                continue
            any_query = np.flatnonzero(block_probe.any(axis=0))
            separate = int((per_list[probed] * sizes[first:last][probed]).sum()) + self.call_overhead * len(probed)
            merged = len(any_query) * int(row_stop - row_start) + self.call_overhead
            if merged <= separate:
                compare(any_query, row_start, row_stop)
            else:
                for k in probed:
                    lst = first + k
                    if sizes[lst]:
                        compare(np.flatnonzero(block_probe[k]), self.list_starts[lst], self.list_starts[lst + 1])
        probed_total = int(probe.sum())
        if not found_q:
            return _empty(probed_total, compared)
        q = np.concatenate(found_q).astype(np.int64)
        r = np.concatenate(found_r).astype(np.int64)
        c = np.concatenate(found_c).astype(np.float32)
        order = np.lexsort((r, q))
        return Matches(q[order], r[order], c[order], probed_total, compared)


def _nearest(vectors: np.ndarray, centroids: np.ndarray):
    """Each row's nearest centroid and its cosine: ``(int64 [N], float32 [N])``, in blocks of rows."""
    ids = np.zeros(len(vectors), np.int64)
    cosines = np.zeros(len(vectors), np.float32)
    for start in range(0, len(vectors), 8192):
        sims = vectors[start : start + 8192] @ centroids.T
        ids[start : start + 8192] = sims.argmax(axis=1)
        cosines[start : start + 8192] = sims.max(axis=1)
    return ids, cosines


def exhaustive_pairs(queries: np.ndarray, index: np.ndarray, threshold: float, normalized: bool = False) -> Matches:
    """Reference: every pair with cosine > threshold by brute force, in blocks (for tests and benchmarks)."""
    if not normalized:
        queries, index = l2_normalize(queries), l2_normalize(index)
    found_q, found_r, found_c = [], [], []
    step = max(1, MAX_PRODUCT_ENTRIES // max(1, len(index)))
    for s in range(0, len(queries), step):
        sims = queries[s : s + step] @ index.T
        qi, ri = np.nonzero(sims > threshold)
        found_q.append(qi + s)
        found_r.append(ri)
        found_c.append(sims[qi, ri])
    if not found_q:
        return _empty()
    q, r, c = (np.concatenate(x) for x in (found_q, found_r, found_c))
    order = np.lexsort((r, q))
    return Matches(q[order].astype(np.int64), r[order].astype(np.int64), c[order].astype(np.float32), 0, len(queries) * len(index))
