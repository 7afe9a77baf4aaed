"""Verification of candidate pairs: cosine > threshold (exclusive), in blocks.

Candidates from the buckets are sparse: on clustered synthetic data (D = 64,
4096 clusters, 100k index rows) a corpus image has ~240 candidates, and in
the tilings tried (index rows sorted by top-1 cluster in tiles of 64-1024
rows, corpus rows in blocks of 16-256 sorted the same way) at most 9% of a
tile's entries were candidates; tiled ``Q @ Y.T`` products then verified
0.3-4M candidate pairs per CPU-second, the gather below 10-20M
(benchmarks/RESULTS.md). So ``pair_cosines`` works through the candidate list in fixed-size
blocks: it gathers both sides of a block of pairs into two preallocated
``[block, D]`` buffers and takes the row-wise dot products in one vectorised
``einsum`` per block. Pairs grouped by index row (as ``SharedClusterIndex``
emits them) make the large-side gather sequential, which is what the speed
depends on. Where every left/right combination is a candidate (all members of
one bucket) ``block_cosines`` is a plain matrix product.

Vectors are L2-normalised before the dot product, so the result is the
cosine whatever the embedder's output scale.
"""

from __future__ import annotations

import numpy as np

from common.vectors import l2_normalize

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
    for rows, table, name in ((query_rows, queries, "query_rows"), (index_rows, index, "index_rows")):
        if rows.min() < 0 or rows.max() >= len(table):
            raise IndexError(f"{name} out of range [0, {len(table)})")
    block = int(min(block_pairs, pairs))
    left = np.empty((block, dim), np.float32)
    right = np.empty((block, dim), np.float32)
    for start in range(0, pairs, block):
        stop = min(pairs, start + block)
        n = stop - start
        # Bounds were checked once above; mode="clip" skips numpy's per-index
        # check, which measured as half the time of the gather.
        np.take(queries, query_rows[start:stop], axis=0, out=left[:n], mode="clip")
        np.take(index, index_rows[start:stop], axis=0, out=right[:n], mode="clip")
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
