"""Keyed joins for near-duplicate search: no side input holds the index.

Both joins key vectors by k-means clusters, group each key's members and
compare them with one matrix product per *cell*; a key with more than
``max_bucket_members`` members on a side is salted, i.e. split into chunks
compared in a grid of cells (``dedup.buckets.cross_join_cells``), so no cell
grows with the data.

- ``BucketJoin``: ALIGN's rule. Every image emits its C(n, b) bucket keys; a
  pair is kept only in its canonical bucket (the smallest it shares), so each
  pair comes out once. Shuffles every vector C(n, b) = 120 times; the
  in-corpus dedup uses it as a self-join.
- ``ListJoin``: exact. A corpus image goes to its nearest list only, each
  index row to every list a near-duplicate query could have as its nearest
  (``dedup.cluster_lists.lists_within_reach``). Every pair above the
  threshold meets in exactly one list: the corpus is shuffled once, the
  index once per list within reach (~4 on uniform data, ~300 in a mass of
  images denser than the threshold radius).
"""

from __future__ import annotations

import hashlib
from typing import Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from dedup import buckets as buckets_lib
from dedup import cluster_lists
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
    vectors = kmeans_lib.l2_normalize(np.stack([np.asarray(v, np.float32).reshape(-1) for _, v in batch]))
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


def _cross_cells(bucket_member, side: str, left_salts: dict, right_salts: dict):
    bucket, (key, vector, clusters) = bucket_member
    ls, rs = left_salts.get(bucket, 1), right_salts.get(bucket, 1)
    own = buckets_lib.salt_of(str(key), ls if side == "left" else rs)
    for cell in buckets_lib.cross_join_cells(side, own, ls, rs):
        yield (bucket, cell[0], cell[1]), (side, key, vector, clusters)


class SaltedCells(beam.PTransform):
    """``{"left", "right"}`` of ``(key, (member key, vector, clusters))`` -> ``((key, i, j), (side, ...))`` cells.

    A key with more than ``max_members`` members on a side is split into
    chunks on that side; every left/right pair of a key meets in exactly one
    cell (``dedup.buckets.cross_join_cells``).
    """

    def __init__(self, max_members: int):
        super().__init__()
        self.max_members = int(max_members)

    def expand(self, sides):
        salts = {
            side: sides[side]
            | f"Count{side.title()}" >> beam.Map(_count_one)
            | f"Sum{side.title()}" >> beam.CombinePerKey(sum)
            | f"Hot{side.title()}" >> beam.FlatMap(_hot_salts, self.max_members)
            for side in ("left", "right")
        }
        return [
            sides[side]
            | f"Cells{side.title()}"
            >> beam.FlatMap(_cross_cells, side, beam.pvalue.AsDict(salts["left"]), beam.pvalue.AsDict(salts["right"]))
            for side in ("left", "right")
        ] | "MergeSides" >> beam.Flatten()


def _self_cells(bucket_member, salts: dict):
    bucket, (key, vector, clusters) = bucket_member
    s = salts.get(bucket, 1)
    own = buckets_lib.salt_of(str(key), s)
    for cell in buckets_lib.self_join_cells(own, s):
        yield (bucket, cell[0], cell[1]), (own, key, vector, clusters)


class _JoinCellFn(beam.DoFn):
    """One cell of a key: one matrix product of its members, cosine > threshold.

    With ``radix`` (bucket join) a pair is kept only if the cell's bucket is
    its canonical one; without (list join) every pair meets in one list only.
    """

    def __init__(self, threshold: float, radix, bucket_size: int, self_join: bool, counter_prefix: str = "bucket_join"):
        self.threshold = threshold
        self.radix = radix
        self.bucket_size = bucket_size
        self.self_join = self_join
        self.cells = Metrics.counter(METRICS_NAMESPACE, f"{counter_prefix}/cells")
        self.compared = Metrics.counter(METRICS_NAMESPACE, f"{counter_prefix}/compared_pairs")
        self.matched = Metrics.counter(METRICS_NAMESPACE, f"{counter_prefix}/near_duplicate_pairs")

    def process(self, element):
        (bucket, cell_i, cell_j), members = element
        members = list(members)
        same = self.self_join and cell_i == cell_j
        if same:
            left = right = sorted(members, key=lambda m: m[1])
        else:
            left_tag, right_tag = (cell_i, cell_j) if self.self_join else ("left", "right")
            left = sorted((m for m in members if m[0] == left_tag), key=lambda m: m[1])
            right = sorted((m for m in members if m[0] == right_tag), key=lambda m: m[1])
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
        if self.radix is not None:
            b = buckets_lib.effective_bucket_size(self.bucket_size, len(left[0][3]))
            bucket_tuple = buckets_lib.decode_bucket(bucket, self.radix, b)
        for i, j in zip(*np.nonzero(hits)):
            a, c = left[i], right[j]
            if a[1] == c[1]:
                continue  # the same key twice in the input is not a pair
            # Each pair is emitted only in its canonical (smallest shared)
            # bucket, so it comes out exactly once over all buckets.
            if self.radix is not None and buckets_lib.canonical_bucket(a[3], c[3], b) != bucket_tuple:
                continue
            self.matched.inc()
            first, second = (a[1], c[1]) if not self.self_join or a[1] < c[1] else (c[1], a[1])
            yield first, second, float(cosines[i, j])


class BucketJoin(beam.PTransform):
    """Near-duplicate pairs through a keyed join on bucket keys.

    Input: ``left`` (and ``right``, unless ``self_join``) of ``(key, unit
    vector, clusters tuple)`` (``AssignTopClusters``). Output: ``(left_key,
    right_key, cosine)`` for every pair that shares a bucket and has cosine >
    threshold, each pair once (self-join: ``left_key < right_key``).
    ``radix`` is the requested number of clusters (an upper bound on cluster
    ids; bucket ids are the sorted cluster ids in that base).
    """

    def __init__(self, threshold: float, radix: int, bucket_size: int, self_join: bool = False, max_bucket_members: int = DEFAULT_MAX_BUCKET_MEMBERS):
        super().__init__()
        self.threshold = check_threshold(threshold)
        self.radix = int(radix)
        self.bucket_size = int(bucket_size)
        self.self_join = bool(self_join)
        self.max_bucket_members = int(max_bucket_members)

    def expand(self, inputs):
        if self.self_join:
            members = inputs
            by_bucket = members | "Buckets" >> beam.FlatMap(_bucket_emissions, self.bucket_size, self.radix)
            salts = (
                by_bucket
                | "CountMembers" >> beam.Map(_count_one)
                | "SumMembers" >> beam.CombinePerKey(sum)
                | "HotBuckets" >> beam.FlatMap(_hot_salts, self.max_bucket_members)
            )
            cells = by_bucket | "Cells" >> beam.FlatMap(_self_cells, beam.pvalue.AsDict(salts))
        else:
            left, right = inputs
            cells = {
                "left": left | "BucketsLeft" >> beam.FlatMap(_bucket_emissions, self.bucket_size, self.radix),
                "right": right | "BucketsRight" >> beam.FlatMap(_bucket_emissions, self.bucket_size, self.radix),
            } | "Cells" >> SaltedCells(self.max_bucket_members)
        return (
            cells
            | "GroupCells" >> beam.GroupByKey()
            | "CompareCells" >> beam.ParDo(_JoinCellFn(self.threshold, self.radix, self.bucket_size, self.self_join))
        )




# ---------------------------------------------------------------------------
# List join (exact)
# ---------------------------------------------------------------------------


class _ListsFn(beam.DoFn):
    """A batch of ``(key, vector)`` -> ``(list, (key, unit vector, ()))``: nearest list, or all lists within reach."""

    def __init__(self, threshold=None):
        self.threshold = threshold  # None: the nearest list only (corpus side)

    def process(self, batch, centroids):
        if not batch or len(centroids) == 0:
            return
        keys, vectors = stack_batch(batch)
        centroids = kmeans_lib.l2_normalize(centroids)
        if self.threshold is None:
            lists = [[c] for c in cluster_lists.nearest_list(vectors, centroids).tolist()]
        else:
            lists = [row.tolist() for row in cluster_lists.lists_within_reach(vectors, centroids, self.threshold)]
        for key, vector, row in zip(keys, vectors, lists):
            for lst in row:
                yield lst, (key, vector, ())


class ListJoin(beam.PTransform):
    """Every (corpus key, index key, cosine) with cosine > threshold, through a keyed join on k-means lists.

    Input: ``(corpus, index)``, both of ``(key, vector)``; ``centroids`` a
    singleton PCollection of centroids. Exact whatever the centroids (see
    ``cluster_lists.lists_within_reach``); each pair comes out once.
    """

    def __init__(self, centroids, threshold: float, batch_size: int = DEFAULT_BATCH_SIZE, max_members: int = DEFAULT_MAX_BUCKET_MEMBERS):
        super().__init__()
        self.centroids = centroids
        self.threshold = check_threshold(threshold)
        self.batch_size = int(batch_size)
        self.max_members = int(max_members)

    def expand(self, inputs):
        corpus, index = inputs
        batch = dict(min_batch_size=min(256, self.batch_size), max_batch_size=self.batch_size)
        centroids = beam.pvalue.AsSingleton(self.centroids)
        return (
            {
                "left": corpus
                | "BatchCorpus" >> beam.BatchElements(**batch)
                | "NearestList" >> beam.ParDo(_ListsFn(), centroids),
                "right": index
                | "BatchIndex" >> beam.BatchElements(**batch)
                | "ListsWithinReach" >> beam.ParDo(_ListsFn(self.threshold), centroids),
            }
            | "Cells" >> SaltedCells(self.max_members)
            | "GroupCells" >> beam.GroupByKey()
            | "CompareCells" >> beam.ParDo(_JoinCellFn(self.threshold, None, 0, False, counter_prefix="list_join"))
        )
