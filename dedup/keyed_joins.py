"""The bucket self-join of the in-corpus dedup (``dedup.corpus_dedup``): no side input holds the vectors.

ALIGN's rule as a keyed join: every image emits its C(n, b) bucket keys
(``AssignTopClusters`` gives its n nearest k-means clusters), each bucket's
members are grouped and compared with one matrix product per *cell*, and a
pair is kept only in its canonical bucket (the smallest it shares), so each
pair comes out once. A bucket with more than ``max_bucket_members`` members
is salted, i.e. split into chunks compared pairwise in cells
(``dedup.buckets.self_join_cells``), so no cell grows with the data. Every
vector is shuffled C(n, b) = 120 times.

The evaluation dedup matches against a side input instead
(``dedup.transforms``). Keyed joins for it (``bucket_join``, ``list_join``)
were measured on a multi-process runner and removed: slower than the side
input, and ``list_join`` lost pairs there (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import hashlib
from typing import Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from common.vectors import l2_normalize
from dedup import buckets as buckets_lib
from dedup import kmeans as kmeans_lib
from dedup import verify as verify_lib

METRICS_NAMESPACE = "dedup"
DEFAULT_BATCH_SIZE = 4096
DEFAULT_MAX_BUCKET_MEMBERS = 1000


def check_threshold(threshold) -> float:
    """The near-duplicate threshold as a float in (0, 1); the embedder supplies it."""
    if threshold is None:
        raise ValueError("threshold is required: take it from the embedder (embedder.threshold)")
    threshold = float(threshold)
    if not 0.0 < threshold < 1.0:
        raise ValueError(
            f"near-duplicate threshold must be in (0, 1), got {threshold}; "
            "0 in the preset means 'use the embedder's calibrated value' and must be resolved by the caller"
        )
    return threshold


def stack_batch(batch: Sequence[Tuple[object, np.ndarray]]) -> Tuple[list, np.ndarray]:
    keys = [k for k, _ in batch]
    vectors = l2_normalize(np.stack([np.asarray(v, np.float32).reshape(-1) for _, v in batch]))
    return keys, vectors


# ---------------------------------------------------------------------------
# Bucket join (ALIGN's rule)
# ---------------------------------------------------------------------------


class AssignTopClusters(beam.PTransform):
    """``(key, embedding)`` -> ``(key, unit vector, clusters tuple)`` using a centroids side input."""

    def __init__(self, centroids, nearest_clusters: int, batch_size: int = DEFAULT_BATCH_SIZE):
        super().__init__()
        self.centroids = centroids
        self.nearest_clusters = int(nearest_clusters)
        self.batch_size = int(batch_size)

    def expand(self, rows):
        return (
            rows
            | "Batch" >> beam.BatchElements(min_batch_size=min(256, self.batch_size), max_batch_size=self.batch_size)
            | "Assign" >> beam.ParDo(_AssignFn(self.nearest_clusters), beam.pvalue.AsSingleton(self.centroids))
        )


class _AssignFn(beam.DoFn):
    def __init__(self, nearest_clusters: int):
        self.nearest_clusters = nearest_clusters

    def setup(self):
        self._assigner = None
        self._token = None
        self._seen = None

    def process(self, batch, centroids):
        if not batch or len(centroids) == 0:
            return
        if centroids is not self._seen:  # hash only when the side input object changes
            token = hashlib.sha256(np.ascontiguousarray(centroids, np.float32).tobytes()).hexdigest()
            if token != self._token:
                self._assigner, self._token = kmeans_lib.CentroidAssigner(centroids), token
            self._seen = centroids
        keys, vectors = stack_batch(batch)
        n = kmeans_lib.nearest_clusters_for(len(centroids), self.nearest_clusters)
        clusters = self._assigner.top_clusters(vectors, n)
        for key, vector, row in zip(keys, vectors, clusters):
            yield key, vector, tuple(int(c) for c in row)


def _bucket_emissions(member, bucket_size: int, radix: int):
    key, vector, clusters = member
    b = buckets_lib.effective_bucket_size(bucket_size, len(clusters))
    ids = buckets_lib.bucket_ids(np.asarray([clusters]), radix, b)[0]
    for bucket in ids.tolist():
        yield bucket, member


def _count_one(bucket_member):
    return bucket_member[0], 1


def _hot_salts(bucket_count, max_members: int):
    bucket, count = bucket_count
    if count > max_members:
        yield bucket, buckets_lib.num_salts(count, max_members)


def _self_cells(bucket_member, salts: dict):
    bucket, (key, vector, clusters) = bucket_member
    s = salts.get(bucket, 1)
    own = buckets_lib.salt_of(str(key), s)
    for cell in buckets_lib.self_join_cells(own, s):
        yield (bucket, cell[0], cell[1]), (own, key, vector, clusters)


class _JoinCellFn(beam.DoFn):
    """One cell of a bucket: one matrix product of its members, cosine > threshold.

    A pair is kept only if the cell's bucket is its canonical one, so it
    comes out once over all buckets; cell ``(i, i)`` compares chunk i with
    itself, ``(i, j)`` chunk i with chunk j.
    """

    def __init__(self, threshold: float, radix: int, bucket_size: int):
        self.threshold = threshold
        self.radix = radix
        self.bucket_size = bucket_size
        self.cells = Metrics.counter(METRICS_NAMESPACE, "bucket_join/cells")
        self.compared = Metrics.counter(METRICS_NAMESPACE, "bucket_join/compared_pairs")
        self.matched = Metrics.counter(METRICS_NAMESPACE, "bucket_join/near_duplicate_pairs")

    def process(self, element):
        (bucket, cell_i, cell_j), members = element
        members = list(members)
        same = cell_i == cell_j
        if same:
            left = right = sorted(members, key=lambda m: m[1])
        else:
            left = sorted((m for m in members if m[0] == cell_i), key=lambda m: m[1])
            right = sorted((m for m in members if m[0] == cell_j), key=lambda m: m[1])
        if not left or not right:
            return
        self.cells.inc()
        cosines = verify_lib.block_cosines(
            np.stack([m[2] for m in left]), np.stack([m[2] for m in right]), normalized=True
        )
        hits = verify_lib.above_threshold(cosines, self.threshold)
        if same:
            hits = np.triu(hits, k=1)
            self.compared.inc(len(left) * (len(left) - 1) // 2)
        else:
            self.compared.inc(len(left) * len(right))
        if not hits.any():
            return
        b = buckets_lib.effective_bucket_size(self.bucket_size, len(left[0][3]))
        bucket_tuple = buckets_lib.decode_bucket(bucket, self.radix, b)
        for i, j in zip(*np.nonzero(hits)):
            a, c = left[i], right[j]
            if a[1] == c[1]:
                continue  # the same key twice in the input is not a pair
            if buckets_lib.canonical_bucket(a[3], c[3], b) != bucket_tuple:
                continue
            self.matched.inc()
            first, second = (a[1], c[1]) if a[1] < c[1] else (c[1], a[1])
            yield first, second, float(cosines[i, j])


class BucketJoin(beam.PTransform):
    """Near-duplicate pairs within one PCollection through a keyed self-join on bucket keys.

    Input: ``(key, unit vector, clusters tuple)`` (``AssignTopClusters``).
    Output: ``(smaller key, larger key, cosine)`` for every pair that shares a
    bucket and has cosine > threshold, each pair once. ``radix`` is the
    requested number of clusters (an upper bound on cluster ids; bucket ids
    are the sorted cluster ids in that base).
    """

    def __init__(self, threshold: float, radix: int, bucket_size: int, max_bucket_members: int = DEFAULT_MAX_BUCKET_MEMBERS):
        super().__init__()
        self.threshold = check_threshold(threshold)
        self.radix = int(radix)
        self.bucket_size = int(bucket_size)
        self.max_bucket_members = int(max_bucket_members)

    def expand(self, members):
        by_bucket = members | "Buckets" >> beam.FlatMap(_bucket_emissions, self.bucket_size, self.radix)
        salts = (
            by_bucket
            | "CountMembers" >> beam.Map(_count_one)
            | "SumMembers" >> beam.CombinePerKey(sum)
            | "HotBuckets" >> beam.FlatMap(_hot_salts, self.max_bucket_members)
        )
        return (
            by_bucket
            | "Cells" >> beam.FlatMap(_self_cells, beam.pvalue.AsDict(salts))
            | "GroupCells" >> beam.GroupByKey()
            | "CompareCells" >> beam.ParDo(_JoinCellFn(self.threshold, self.radix, self.bucket_size))
        )
