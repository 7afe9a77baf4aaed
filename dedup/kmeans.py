"""Spherical k-means centroids and top-n centroid assignment (ALIGN appendix A).

ALIGN clusters image embeddings into 4K k-means clusters and gives every image
its 10 nearest centroids. Here the centroids are trained with faiss on a
fixed-size, deterministic sample of the corpus embeddings:

* **Sample.** Each corpus key gets a 64-bit priority ``sample_priority(key)``
  (a hash, independent of input order, shards and runner); the sample is the
  keys whose priority is below ``sample_bound(n, sample_size)``, a fraction
  ``sample_size / n`` of the 64-bit range for a corpus of n rows (every row
  when n <= sample_size), sorted by priority. Its expected size is
  ``sample_size`` (binomial: within a few sqrt(sample_size) of it). A filter
  against one number, so no worker ranks or holds more than its share of the
  sample, unlike a global top-N, whose every bundle emits up to N rows
  that all merge on one worker. The same corpus always trains on the same
  vectors in the same order.
* **Number of clusters.** faiss warns when a centroid gets fewer than 39
  training points, and a centroid with too few points is noise. The rule:
  ``effective_num_clusters(k, n) = min(k, max(1, n // 39))``. A corpus with
  fewer than ``39 * 4096 = 159,744`` sampled images gets fewer clusters; with
  fewer than ``39 * nearest_clusters`` images every image is in every cluster
  it can be in and candidate generation degenerates to exhaustive comparison,
  which is exact (only slower, and such a corpus is tiny).
* **Training.** ``faiss.Kmeans(spherical=True)`` on L2-normalised vectors with a
  fixed seed: centroids are unit vectors, so nearest-by-inner-product is
  nearest-by-cosine. faiss is deterministic for a given input order, seed and
  thread count; the sample order is fixed by the priority, so reruns agree.

Assignment (``CentroidAssigner``) searches a ``faiss.IndexFlatIP`` over the
centroids with a whole batch of rows per call: faiss amortises the centroid
matrix over the batch (one SGEMM), which is what makes 20k+ images/s possible.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from common.vectors import l2_normalize

#: faiss's own ``min_points_per_centroid``: below it faiss warns that the
#: clustering is unreliable.
MIN_POINTS_PER_CENTROID = 39

#: Default faiss k-means settings. Buckets only need centroids that tile the
#: space, not a converged optimum: on 250k x 4096 (D = 64) 10 iterations take
#: half the time of 20 and leave as many centroids after thinning (2616 vs
#: 2622, benchmarks/RESULTS.md).
DEFAULT_NITER = 10
DEFAULT_SEED = 1234


def sample_priority(key: str, seed: int = DEFAULT_SEED) -> int:
    """A 64-bit number per key; the k-means sample is the smallest of these.

    A hash of the key only, so the sample does not depend on input order,
    bundle boundaries or the runner.
    """
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def effective_num_clusters(num_clusters: int, num_train: int) -> int:
    """Clusters actually trained: ``min(num_clusters, max(1, num_train // 39))``."""
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
    return int(min(num_clusters, max(1, num_train // MIN_POINTS_PER_CENTROID)))


def train_spherical_kmeans(
    vectors: np.ndarray,
    num_clusters: int,
    *,
    niter: int = DEFAULT_NITER,
    seed: int = DEFAULT_SEED,
    max_points_per_centroid: int = 256,
    verbose: bool = False,
) -> np.ndarray:
    """Unit-norm centroids ``[K, D]`` with ``K = effective_num_clusters(num_clusters, N)``.

    ``vectors`` is the training sample ``[N, D]`` in a fixed order (rows are
    L2-normalised here). ``K == 1`` (fewer than 78 points) is the normalised
    mean, without faiss. An empty sample gives an empty ``[0, D]`` array.
    """
    import faiss  # heavy import kept local: Beam pickles this module's functions

    x = l2_normalize(vectors)
    n, d = x.shape
    if n == 0:
        return np.zeros((0, d), np.float32)
    k = effective_num_clusters(num_clusters, n)
    if k == 1:
        centroid = x.mean(axis=0, keepdims=True)
        return l2_normalize(centroid if np.any(centroid) else x[:1])
    kmeans = faiss.Kmeans(
        d,
        k,
        niter=niter,
        seed=seed,
        spherical=True,
        verbose=verbose,
        min_points_per_centroid=1,  # the rule above already guarantees >= 39
        max_points_per_centroid=max_points_per_centroid,
    )
    kmeans.train(x)
    return l2_normalize(kmeans.centroids)


class CentroidAssigner:
    """Top-``n`` nearest centroids (by cosine) for batches of embeddings.

    Picklable: the faiss index is built lazily on first use, so the assigner
    can travel inside a DoFn or a side input.
    """

    def __init__(self, centroids: np.ndarray):
        self.centroids = l2_normalize(centroids)
        self._index = None

    @property
    def num_clusters(self) -> int:
        return int(self.centroids.shape[0])

    def __getstate__(self):
        return {"centroids": self.centroids}

    def __setstate__(self, state):
        self.centroids = state["centroids"]
        self._index = None

    def _faiss_index(self):
        if self._index is None:
            import faiss

            index = faiss.IndexFlatIP(self.centroids.shape[1])
            index.add(self.centroids)
            self._index = index
        return self._index

    def top_clusters(self, vectors: np.ndarray, n: int, with_scores: bool = False):
        """Cluster ids ``int32 [B, min(n, K)]``, nearest first (one faiss call per batch).

        Rows need not be normalised: a positive scale does not change which
        centroids are nearest by inner product.
        """
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.centroids.shape[1]:
            raise ValueError(f"expected [B, {self.centroids.shape[1]}] vectors, got {x.shape}")
        n = min(int(n), self.num_clusters)
        if x.shape[0] == 0:
            ids = np.zeros((0, n), np.int32)
            return (ids, np.zeros((0, n), np.float32)) if with_scores else ids
        scores, ids = self._faiss_index().search(x, n)
        ids = ids.astype(np.int32)
        return (ids, scores) if with_scores else ids


def nearest_clusters_for(num_clusters_trained: int, nearest_clusters: int) -> int:
    """Clusters per image actually used: ``min(nearest_clusters, K)``."""
    return int(min(nearest_clusters, max(1, num_clusters_trained)))


def sample_bound(count: int, sample_size: int) -> int:
    """Rows with ``sample_priority < sample_bound(count, sample_size)`` form the k-means sample.

    ``2**64`` (every row) when ``count <= sample_size``, else
    ``floor(sample_size * 2**64 / count)``: each row is drawn with
    probability ``sample_size / count``, so the sample has
    ``sample_size`` rows on average.
    """
    if sample_size < 1:
        raise ValueError(f"sample_size must be >= 1, got {sample_size}")
    if count <= sample_size:
        return 1 << 64
    return (int(sample_size) << 64) // int(count)


def in_sample(element, bound: int) -> bool:
    """Whether a ``sample_element`` is drawn: its priority is below ``bound``."""
    return element[0] < bound


def sample_order(item) -> tuple:
    """Sort key of a k-means sample element ``(priority, key, embedding)``.

    Compares (priority, key) only: never the embedding (numpy arrays do not
    define a total order), and ties in priority fall back to the key.
    """
    return item[0], item[1]


def sample_element(key: str, embedding: np.ndarray, seed: int = DEFAULT_SEED) -> tuple:
    """``(priority, key, embedding)``: what the sample is drawn and ordered by."""
    return sample_priority(key, seed), key, np.asarray(embedding, dtype=np.float32)


def train_from_sample(
    sample: list,
    num_clusters: int,
    niter: int = DEFAULT_NITER,
    seed: int = DEFAULT_SEED,
    merge_cosine: Optional[float] = None,
    dim: Optional[int] = None,
) -> np.ndarray:
    """Centroids from a list of ``sample_element`` tuples (any order).

    With ``merge_cosine`` the trained centroids are thinned
    (``thin_centroids``), sizes counted on the sample itself.
    """
    ordered = sorted(sample, key=sample_order)
    if not ordered:
        return np.zeros((0, dim or 0), np.float32)
    vectors = np.stack([np.asarray(e[2], np.float32) for e in ordered])
    centroids = train_spherical_kmeans(vectors, num_clusters, niter=niter, seed=seed)
    if merge_cosine is not None and len(centroids) > 1:
        top1 = CentroidAssigner(centroids).top_clusters(vectors, 1)[:, 0]
        centroids = thin_centroids(centroids, np.bincount(top1, minlength=len(centroids)), merge_cosine)
    return centroids


#: Centroids are kept at least this fraction of the near-duplicate angle apart.
MERGE_ANGLE_FRACTION = 2.0 / 3.0

#: ``centroid_merge_cosine`` values with a meaning of their own (see ``resolve_merge_cosine``).
AUTOMATIC_MERGE = 0.0
NEVER_MERGE = -1.0


def resolve_merge_cosine(centroid_merge_cosine: float, threshold: float, buckets: bool) -> Optional[float]:
    """The ``centroid_merge_cosine`` parameter -> the cosine ``thin_centroids`` merges at, or None.

    The parameter has one form wherever it is set (the preset,
    ``dedup.transforms.SearchOptions``, ``benchmarks.dedup``):
    ``0`` is automatic: ``merge_cosine_for(threshold)`` for a bucket search
    (``buckets``), which loses pairs in dense regions without it, and no
    thinning for the exact searches, which lose none anyway; ``-1`` is never
    (the paper's plain k-means); any other value is the cosine itself, in
    (0, 1).
    """
    value = float(centroid_merge_cosine)
    if value == AUTOMATIC_MERGE:
        return merge_cosine_for(threshold) if buckets else None
    if value == NEVER_MERGE:
        return None
    if not 0.0 < value < 1.0:
        raise ValueError(
            f"centroid_merge_cosine must be 0 (automatic), -1 (never) or a cosine in (0, 1), got {centroid_merge_cosine!r}"
        )
    return value


def merge_cosine_for(threshold: float) -> float:
    """Default centroid-merge cosine for a near-duplicate threshold.

    ``cos(2/3 * arccos(threshold))``: 0.9889 for threshold 0.975 (centroids at
    least 8.6 degrees apart; the near-duplicate angle is 12.8 degrees).
    Measured on 100k synthetic rows (benchmarks/RESULTS.md): under Zipf-skewed
    blob sizes plain k-means lost 48.2% of the above-threshold pairs; thinning
    at 1/2, 0.6, 2/3, 3/4 of the angle lost 0.046%, 0.002%, 0.0007%, 0.0004%,
    for 1.2x, 1.8x, 2.1x, 2.1x the candidates. With uniform blob sizes the
    loss stayed at 0.002-0.009% either way, with 0.96-1.0x the candidates.
    """
    angle = np.arccos(np.clip(threshold, -1.0, 1.0))
    return float(np.cos(MERGE_ANGLE_FRACTION * angle))


def thin_centroids(centroids: np.ndarray, sizes: np.ndarray, merge_cosine: float) -> np.ndarray:
    """Drop centroids closer than ``merge_cosine`` to a kept, larger one.

    Why: k-means spends centroids in proportion to density. Where many images
    are mutually close to the near-duplicate threshold (a mass of near-copies,
    a Zipf head), it packs centroids more tightly than the near-duplicate
    radius; two near-duplicates there then see different top-10 lists and
    share fewer than 3 clusters, so the buckets miss them (measured: half the
    above-threshold pairs of a synthetic Zipf corpus of 100k were lost,
    benchmarks/RESULTS.md). Keeping centroids at least a set angle apart bounds
    the packing; images of a dropped centroid fall to its kept neighbours, so
    dense regions get larger clusters (more candidates, found pairs) and
    sparse regions are untouched. Greedy in order of decreasing size (ties:
    lower id), so the result is deterministic. Returns the kept centroids in
    their original order.
    """
    c = l2_normalize(centroids)
    if len(c) <= 1:
        return c
    order = np.lexsort((np.arange(len(c)), -np.asarray(sizes, np.int64)))
    alive = np.ones(len(c), bool)
    kept = []
    for i in order:
        if not alive[i]:
            continue
        kept.append(i)
        alive[(c @ c[i]) > merge_cosine] = False
    return c[np.sort(np.asarray(kept))]
