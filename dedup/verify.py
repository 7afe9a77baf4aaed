"""Verification of candidate pairs: cosine > threshold (exclusive), in blocks.

Candidates from the buckets are sparse: on clustered synthetic data (D = 64,
4096 clusters, 100k index rows) a corpus image has ~240 candidates, and in
any tiling of (corpus batch x index rows grouped by cluster) fewer than 10%
of the entries of a tile are candidates (benchmarks/RESULTS.md). A dense
``Q @ Y.T`` per tile would compute over ten dot products per useful one, so
``pair_cosines`` instead works through the candidate list in fixed-size
blocks: it gathers both sides of a block of pairs into two preallocated
``[block, D]`` buffers and takes the row-wise dot products in one BLAS-backed
``einsum`` per block. Pairs grouped by index row (as ``SharedClusterIndex``
emits them) make the large-side gather sequential, which is what the speed
depends on. Where every left/right combination is a candidate (all members of
one bucket) ``block_cosines`` is a plain matrix product.

Vectors are L2-normalised before the dot product, so the result is the
cosine whatever the embedder's output scale.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np

from dedup.kmeans import l2_normalize

#: Pairs per block: two [block, D] float32 buffers (2 x 2 MiB at D = 64)
#: stay in L2/L3 cache; measured best among 2k/8k/64k on 2 shared cores.
DEFAULT_BLOCK_PAIRS = 8192


def pair_cosines(
    queries: np.ndarray,
    index: np.ndarray,
    query_rows: np.ndarray,
    index_rows: np.ndarray,
    block_pairs: int = DEFAULT_BLOCK_PAIRS,
    normalized: bool = False,
) -> np.ndarray:
    """``cos(queries[query_rows[p]], index[index_rows[p]])`` for every pair p, float32.

    ``normalized=True`` skips the L2 normalisation when the caller has done it.
    """
    if not normalized:
        queries = l2_normalize(queries)
        index = l2_normalize(index)
    query_rows = np.asarray(query_rows, np.int64)
    index_rows = np.asarray(index_rows, np.int64)
    if query_rows.shape != index_rows.shape:
        raise ValueError("query_rows and index_rows must have the same length")
    pairs = len(query_rows)
    out = np.empty(pairs, np.float32)
    if pairs == 0:
        return out
    dim = queries.shape[1]
    if index.shape[1] != dim:
        raise ValueError(f"dimension mismatch: queries {queries.shape[1]} vs index {index.shape[1]}")
    block = int(min(block_pairs, pairs))
    left = np.empty((block, dim), np.float32)
    right = np.empty((block, dim), np.float32)
    for start in range(0, pairs, block):
        stop = min(pairs, start + block)
        n = stop - start
        np.take(queries, query_rows[start:stop], axis=0, out=left[:n])
        np.take(index, index_rows[start:stop], axis=0, out=right[:n])
        np.einsum("ij,ij->i", left[:n], right[:n], out=out[start:stop])
    return out


def block_cosines(left: np.ndarray, right: np.ndarray, normalized: bool = False) -> np.ndarray:
    """All cosines between two sets of vectors: ``[L, R]`` float32 (one matrix product)."""
    if not normalized:
        left = l2_normalize(left)
        right = l2_normalize(right)
    return left @ right.T


def above_threshold(cosines: np.ndarray, threshold: float) -> np.ndarray:
    """The near-duplicate rule: strictly greater than the threshold."""
    return cosines > np.float32(threshold)


def best_per_target(
    query_rows: np.ndarray,
    targets: np.ndarray,
    variant_ranks: np.ndarray,
    cosines: np.ndarray,
) -> np.ndarray:
    """Positions of the best pair per (query row, target): highest cosine, then lowest variant rank.

    ``targets`` identifies what a pair is reported against (an evaluation
    image: one index set and key, any variant). Returned positions are
    ordered by (query row, target).
    """
    if len(query_rows) == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((variant_ranks, -cosines.astype(np.float64), targets, query_rows))
    q = query_rows[order]
    t = targets[order]
    first = np.ones(len(order), bool)
    first[1:] = (q[1:] != q[:-1]) | (t[1:] != t[:-1])
    return order[first]
