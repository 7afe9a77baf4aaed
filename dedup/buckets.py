"""C(10,3) buckets and candidate generation without materialising them.

ALIGN (appendix A) gives every image its top-10 nearest k-means clusters and
puts it in all C(10,3) = 120 buckets (each 3-subset of those clusters); a
query/index pair is compared only if the two images share a bucket.

**The identity this module is built on.** Let ``A`` and ``B`` be the sets of
top-n cluster ids of two images (n distinct ids each) and ``b`` the bucket
size. A bucket of an image is a ``b``-subset of its set, so

    the images share bucket S  <=>  S ⊆ A and S ⊆ B  <=>  S ⊆ A ∩ B.

Hence they share at least one bucket iff ``|A ∩ B| >= b``, and they share
exactly ``C(|A ∩ B|, b)`` buckets. Two consequences used below:

1. *Counting instead of enumerating.* "Shares one of the 120 buckets" is
   "shares >= 3 of its 10 clusters". With the index as inverted lists
   (cluster -> index rows), the number of shared clusters of a query with every
   index row is one sparse product ``Q @ R.T`` of 0/1 membership matrices
   (``Q [B, K]``, ``R [M, K]``); candidates are the entries >= ``b``. No bucket
   key is ever formed.
2. *Canonical bucket.* Among the shared buckets (sorted ``b``-tuples) the
   lexicographically smallest is the tuple of the ``b`` smallest ids of
   ``A ∩ B``: its first element is ``min(A ∩ B)``, which no other shared tuple
   can beat, and so on element by element. A keyed join on bucket keys emits
   a pair only in that bucket, so each pair comes out exactly once. Inside a
   bucket ``S = (s_1 < ... < s_b)`` that test needs no sorting: ``S`` is
   canonical for a pair iff the pair shares exactly ``b`` clusters ``<= s_b``
   (``S`` itself is shared, and any other shared id ``<= s_b`` would give a
   smaller tuple).

Candidate generation against a small index (``SharedClusterIndex``) is the
sparse product of consequence 1, computed as ``R @ Q.T`` so that pairs come
out grouped by index row (verification then reads index vectors in order).
Its work per query is the summed length of the 10 inverted lists it touches,
about ``M * n**2 / K`` entries (2,400 for M = 100k, n = 10, K = 4096): cheap
for evaluation-sized indexes, linear in M. (A sorted table of the index's own
bucket keys, probed with the query's 120 keys, was measured too: a pair
sharing s clusters is found C(s, 3) times, and on clustered data that
repetition made it 3-10x slower than counting; see benchmarks/RESULTS.md.)

The Beam keyed-join path for an index too large to broadcast uses
``bucket_ids``, ``canonical_pairs_in_bucket`` and the salting helpers.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

# ---------------------------------------------------------------------------
# Bucket keys
# ---------------------------------------------------------------------------


def effective_bucket_size(bucket_size: int, nearest_clusters: int) -> int:
    """``min(bucket_size, nearest_clusters)``.

    With fewer clusters per image than the bucket size (k-means trained with
    fewer clusters than ``bucket_size`` on a tiny corpus) no bucket would
    exist; shrinking it keeps the method exact (every pair becomes a candidate).
    """
    return int(max(1, min(bucket_size, nearest_clusters)))


def bucket_combinations(nearest_clusters: int, bucket_size: int) -> np.ndarray:
    """Positions of each ``b``-subset of ``n`` items, ``int [C(n, b), b]``, lexicographic."""
    return np.array(list(itertools.combinations(range(nearest_clusters), bucket_size)), dtype=np.intp).reshape(
        -1, bucket_size
    )


def _check_radix(num_clusters: int, bucket_size: int) -> None:
    if num_clusters ** bucket_size >= 2**63:
        raise ValueError(f"{num_clusters}**{bucket_size} bucket ids do not fit in int64")


def encode_bucket(clusters: Sequence[int], num_clusters: int) -> int:
    """One int64 per bucket: the sorted cluster ids read as base-K digits."""
    value = 0
    for c in sorted(int(c) for c in clusters):
        value = value * num_clusters + c
    return value


def decode_bucket(bucket_id: int, num_clusters: int, bucket_size: int) -> Tuple[int, ...]:
    digits = []
    for _ in range(bucket_size):
        bucket_id, c = divmod(int(bucket_id), num_clusters)
        digits.append(c)
    return tuple(reversed(digits))


def bucket_ids(clusters: np.ndarray, num_clusters: int, bucket_size: int) -> np.ndarray:
    """All bucket ids of each row: ``int64 [N, C(n, b)]``, in lexicographic bucket order.

    ``clusters`` is ``[N, n]`` distinct cluster ids per row (any order).
    """
    clusters = np.asarray(clusters)
    _check_radix(num_clusters, bucket_size)
    sorted_clusters = np.sort(clusters.astype(np.int64), axis=1)
    combos = bucket_combinations(clusters.shape[1], bucket_size)
    picked = sorted_clusters[:, combos]  # [N, C, b]
    ids = picked[..., 0].copy()
    for j in range(1, bucket_size):
        ids *= num_clusters
        ids += picked[..., j]
    return ids


def shared_cluster_count(a: Iterable[int], b: Iterable[int]) -> int:
    return len(set(int(x) for x in a) & set(int(x) for x in b))


def canonical_bucket(a: Iterable[int], b: Iterable[int], bucket_size: int) -> Optional[Tuple[int, ...]]:
    """The lexicographically smallest bucket two images share, or None."""
    shared = sorted(set(int(x) for x in a) & set(int(x) for x in b))
    return tuple(shared[:bucket_size]) if len(shared) >= bucket_size else None


def enumerate_bucket_pairs(
    query_clusters: np.ndarray, index_clusters: np.ndarray, num_clusters: int, bucket_size: int
) -> set:
    """Reference implementation: materialise every bucket of both sides and join.

    ``{(query_row, index_row)}`` of all pairs sharing at least one bucket. Slow
    and memory hungry (that is the point of the other paths); for tests.
    """
    q_ids = bucket_ids(query_clusters, num_clusters, bucket_size)
    r_ids = bucket_ids(index_clusters, num_clusters, bucket_size)
    table = {}
    for row, ids in enumerate(r_ids):
        for bucket in ids.tolist():
            table.setdefault(bucket, []).append(row)
    pairs = set()
    for q, ids in enumerate(q_ids):
        for bucket in ids.tolist():
            for r in table.get(bucket, ()):
                pairs.add((q, r))
    return pairs


# ---------------------------------------------------------------------------
# In-memory candidate generation against a small index
# ---------------------------------------------------------------------------


def _membership_matrix(clusters: np.ndarray, num_clusters: int):
    import scipy.sparse as sp

    rows, n = clusters.shape
    return sp.csr_matrix(
        (np.ones(rows * n, np.int8), clusters.reshape(-1).astype(np.int32), np.arange(0, rows * n + 1, n)),
        shape=(rows, num_clusters),
    )


class SharedClusterIndex:
    """The index side of candidate generation: which rows share >= b clusters with a query.

    ``index_clusters`` is ``int [M, n]``: the top-n cluster ids of every index
    row. ``candidates(query_clusters)`` returns every (query row, index row)
    pair sharing at least ``bucket_size`` clusters -- by the identity in the
    module docstring, exactly the pairs that share one of the C(n, b) buckets.
    Picklable (the inverted lists are rebuilt after unpickling, on first use).
    """

    def __init__(self, index_clusters: np.ndarray, num_clusters: int, bucket_size: int):
        clusters = np.asarray(index_clusters, dtype=np.int32)
        if clusters.ndim != 2:
            raise ValueError(f"index_clusters must be [M, n], got {clusters.shape}")
        if clusters.size and (clusters.min() < 0 or clusters.max() >= num_clusters):
            raise ValueError(f"cluster ids must be in [0, {num_clusters})")
        self.index_clusters = clusters
        self.num_clusters = int(num_clusters)
        self.nearest_clusters = int(clusters.shape[1])
        if self.nearest_clusters > 127:
            raise ValueError("at most 127 clusters per image (shared counts are int8)")
        self.bucket_size = effective_bucket_size(bucket_size, self.nearest_clusters)
        self._membership = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_membership"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._membership = None

    @property
    def num_rows(self) -> int:
        return int(self.index_clusters.shape[0])

    def expected_postings_per_query(self) -> float:
        """Inverted-list entries a query touches, for queries distributed like the index."""
        if self.num_rows == 0:
            return 0.0
        lengths = np.bincount(self.index_clusters.reshape(-1), minlength=self.num_clusters).astype(np.float64)
        return float((lengths**2).sum() / self.num_rows)

    def shared_counts(self, query_clusters: np.ndarray):
        """Sparse ``[M, B]`` matrix: clusters shared by index row m and query b (>= 1 stored)."""
        query_clusters = np.asarray(query_clusters, dtype=np.int32)
        if query_clusters.ndim != 2 or query_clusters.shape[1] != self.nearest_clusters:
            raise ValueError(f"query clusters must be [B, {self.nearest_clusters}], got {query_clusters.shape}")
        if self._membership is None:
            self._membership = _membership_matrix(self.index_clusters, self.num_clusters)
        # int8 counts (at most n <= 127 shared) keep the product's memory traffic low.
        queries_t = _membership_matrix(query_clusters, self.num_clusters).T.tocsr()
        return self._membership @ queries_t

    def candidates(self, query_clusters: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(query_rows, index_rows)`` int64, each pair once, ordered by index row."""
        query_clusters = np.asarray(query_clusters, dtype=np.int32)
        if self.num_rows == 0 or query_clusters.shape[0] == 0:
            if query_clusters.ndim != 2 or query_clusters.shape[1] != self.nearest_clusters:
                raise ValueError(f"query clusters must be [B, {self.nearest_clusters}], got {query_clusters.shape}")
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        shared = self.shared_counts(query_clusters)
        hit = np.flatnonzero(shared.data >= self.bucket_size)
        index_rows = np.searchsorted(shared.indptr, hit, side="right") - 1
        return shared.indices[hit].astype(np.int64), index_rows.astype(np.int64)


# ---------------------------------------------------------------------------
# Keyed join on bucket keys (index too large to broadcast; in-corpus dedup)
# ---------------------------------------------------------------------------


def canonical_pairs_in_bucket(
    bucket: Tuple[int, ...],
    left_clusters: np.ndarray,
    right_clusters: np.ndarray,
    same_side: bool = False,
) -> Tuple[np.ndarray, np.ndarray]:
    """Pairs (i, j) of bucket members for which ``bucket`` is their canonical bucket.

    All members contain ``bucket``; by the module docstring the bucket is the
    pair's canonical one iff the pair shares exactly ``b`` clusters
    ``<= max(bucket)``. ``same_side`` (a self-join of one member list) keeps
    only ``i < j``. Returns int64 index arrays into the two member lists.
    """
    b = len(bucket)
    top = max(bucket)
    left = np.asarray(left_clusters, np.int64)
    right = np.asarray(right_clusters, np.int64)
    if len(left) == 0 or len(right) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    small = np.unique(np.concatenate([left[left <= top], right[right <= top]]))

    def members(clusters):
        m = np.zeros((len(clusters), len(small)), np.float32)
        rows, cols = np.nonzero(clusters <= top)
        m[rows, np.searchsorted(small, clusters[rows, cols])] = 1.0
        return m

    shared_small = members(left) @ members(right).T
    i, j = np.nonzero(np.rint(shared_small) == b)
    if same_side:
        keep = i < j
        i, j = i[keep], j[keep]
    return i.astype(np.int64), j.astype(np.int64)


def salt_of(key: str, salts: int) -> int:
    """Deterministic chunk (0 .. salts-1) of a member of a salted (hot) bucket."""
    if salts <= 1:
        return 0
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % salts


def num_salts(members: int, max_members: int) -> int:
    """Chunks a bucket side is split into so that no chunk has more than ``max_members``."""
    if max_members < 1:
        raise ValueError("max_members must be >= 1")
    return max(1, -(-int(members) // int(max_members)))


def self_join_cells(salt: int, salts: int) -> List[Tuple[int, int]]:
    """Cells ``(i, j), i <= j`` a member of chunk ``salt`` of a salted self-join bucket joins.

    A self-join bucket split into ``s`` chunks runs the ``s (s + 1) / 2`` chunk
    pairs as separate cells; cell ``(i, i)`` compares chunk i with itself,
    cell ``(i, j)``, ``i < j``, chunk i with chunk j. Every unordered member
    pair is in exactly one cell.
    """
    return sorted({(min(salt, j), max(salt, j)) for j in range(salts)})
