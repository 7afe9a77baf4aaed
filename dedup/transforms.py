"""Beam composites for near-duplicate removal against evaluation images.

    result = corpus | "RemoveNearDuplicates" >> RemoveNearDuplicates(
        index, threshold=embedder.threshold, num_clusters=4096)
    result["pairs"]     # {key, index_set, index_key, variant, cosine}
    result["rejected"]  # (corpus_key, "near_duplicate_eval/<index_set>")

``corpus`` is a PCollection of ``(corpus_key, embedding float32 [D])``. The
stages, in order (labels are stable):

1. ``SampleForKMeans`` / ``TrainKMeans`` (``TrainCentroids``): the corpus
   rows whose key hash is below a bound sized from the corpus count, about
   ``sample_size`` of them (``dedup.kmeans.sample_bound``: a filter, so no
   worker ranks or holds more than its share of the sample) -> faiss
   spherical k-means with a fixed seed on one worker -> the centroids, a
   small singleton side input.
2. ``ClusterIndex``: the evaluation index is put in the centroids' lists; the
   result is a singleton side input. Evaluation sets are small (~1e5 rows),
   so broadcasting them is cheap.
3. ``MatchBatches``: corpus rows in batches (``BatchElements``), matched
   against the side input; the corpus is never shuffled or collected.

``search`` says how step 2-3 find pairs (``SearchOptions``):

- ``"exact"`` (default): k-means lists with a triangle-inequality bound
  (``dedup.cluster_lists``). Finds every pair with cosine > threshold, so
  also every pair ALIGN's buckets find; the centroids only set the speed.
- ``"buckets"``: ALIGN's rule: an index row is compared only if it shares
  >= bucket_size of the query's nearest_clusters clusters, i.e. one of the
  C(n, b) buckets (``dedup.buckets``), then verified in blocks
  (``dedup.verify``). Can miss pairs across cluster boundaries (measured in
  benchmarks/RESULTS.md); centroids are thinned by default to keep that rare.

Counters (namespace ``dedup``): ``near_duplicate_eval/corpus_images``,
``.../compared_pairs`` (dot products) and ``.../near_duplicate_pairs`` (the
broadcast searches), ``near_duplicate_eval/rejected`` and
``near_duplicate_eval/<set>/rejected`` (the set named in the reason).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, Iterable, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from common.vectors import l2_normalize
from dedup import buckets as buckets_lib
from dedup import cluster_lists
from dedup import kmeans as kmeans_lib
from dedup import verify as verify_lib
from dedup.keyed_joins import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_BUCKET_MEMBERS,
    METRICS_NAMESPACE,
    check_threshold,
    stack_batch,
)
from filters import stages
from filters.stages import REJECTED

PAIRS = "pairs"

DEFAULT_SAMPLE_SIZE = 250_000


# ---------------------------------------------------------------------------
# The index as a light, picklable object
# ---------------------------------------------------------------------------


class IndexRows:
    """The four arrays of an IndexSet-like object that matching needs, nothing else.

    ``dedup.index_sets.IndexSet`` also carries previews (image bytes) for the
    audit; those stay out of the side input.
    """

    def __init__(self, vectors, keys, set_names, variants):
        vectors = np.asarray(vectors, np.float32)
        if vectors.ndim != 2:
            vectors = vectors.reshape(len(keys), -1) if len(keys) else np.zeros((0, 0), np.float32)
        self.vectors = l2_normalize(vectors)
        self.keys = np.asarray([str(k) for k in keys], dtype=object)
        self.set_names = np.asarray([str(s) for s in set_names], dtype=object)
        self.variants = np.asarray([str(v) for v in variants], dtype=object)
        if not (len(self.vectors) == len(self.keys) == len(self.set_names) == len(self.variants)):
            raise ValueError("index vectors, keys, set_names and variants must have the same length")

    @classmethod
    def of(cls, index) -> "IndexRows":
        if isinstance(index, cls):
            return index
        return cls(index.vectors, index.keys, index.set_names, index.variants)

    def __len__(self) -> int:
        return len(self.keys)

    def row_key(self, i: int) -> Tuple[str, str, str]:
        return self.set_names[i], self.keys[i], self.variants[i]


class ClusteredIndex:
    """The broadcast side input: index rows with what ``search`` matches them by.

    ``"exact"``: a ``cluster_lists.ClusterListIndex`` (``self.lists``);
    ``"buckets"``: the rows' top-n clusters as a
    ``buckets.SharedClusterIndex`` (``self.shared``) and the centroids'
    assigner for the queries.
    """

    def __init__(self, rows: IndexRows, centroids: np.ndarray, options: "SearchOptions"):
        self.rows = rows
        self.threshold = options.threshold
        num_clusters = len(centroids)
        self.nearest_clusters = kmeans_lib.nearest_clusters_for(num_clusters, options.nearest_clusters)
        self.bucket_size = buckets_lib.effective_bucket_size(options.bucket_size, self.nearest_clusters)
        if num_clusters and len(rows) and rows.vectors.shape[1] != centroids.shape[1]:
            raise ValueError(
                f"index vectors have dimension {rows.vectors.shape[1]}, corpus embeddings {centroids.shape[1]}"
            )
        digest = hashlib.sha256(np.ascontiguousarray(centroids, np.float32).tobytes())
        digest.update(rows.vectors.tobytes())
        digest.update(f"{options.search} {options.threshold} {self.nearest_clusters} {self.bucket_size}".encode())
        self.token = digest.hexdigest()
        self.lists = self.shared = self.assigner = None
        if num_clusters == 0:
            return
        if options.search == "exact":
            self.lists = cluster_lists.ClusterListIndex(rows.vectors, centroids, options.threshold, seed=options.seed)
            return
        self.assigner = kmeans_lib.CentroidAssigner(centroids)
        if len(rows):
            clusters = self.assigner.top_clusters(rows.vectors, self.nearest_clusters)
        else:
            clusters = np.zeros((0, self.nearest_clusters), np.int32)
        self.shared = buckets_lib.SharedClusterIndex(clusters, num_clusters, self.bucket_size)

    @property
    def empty(self) -> bool:
        return len(self.rows) == 0 or (self.lists is None and self.shared is None)

    def match(self, vectors: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Unit query rows -> (query rows, index rows, cosines) above the threshold, and pairs compared."""
        if self.lists is not None:
            found = self.lists.search(vectors, normalized=True)
            return found.query_rows, found.index_rows, found.cosines, found.compared_pairs
        clusters = self.assigner.top_clusters(vectors, self.nearest_clusters)
        query_rows, index_rows = self.shared.candidates(clusters)
        cosines = verify_lib.pair_cosines(vectors, self.rows.vectors, query_rows, index_rows, normalized=True)
        hit = verify_lib.above_threshold(cosines, self.threshold)
        return query_rows[hit], index_rows[hit], cosines[hit], len(query_rows)


def build_clustered_index(rows, centroids: np.ndarray, options: "SearchOptions") -> ClusteredIndex:
    return ClusteredIndex(IndexRows.of(rows), centroids, options)


# ---------------------------------------------------------------------------
# Shared per-element helpers
# ---------------------------------------------------------------------------


def reduce_matches(corpus_key: str, matches: Iterable[Tuple[Tuple[str, str, str], float]]):
    """One corpus key's verified matches -> (pair records, rejection reason).

    ``matches`` are ``((index_set, index_key, variant), cosine)``. One record
    per (index_set, index_key): the variant with the highest cosine (ties:
    smallest variant name). The reason names the set of the best match
    overall (ties: smallest set name, then key). Records are sorted by
    (index_set, index_key).
    """
    best: Dict[Tuple[str, str], Tuple[float, str]] = {}
    for (set_name, key, variant), cosine in matches:
        cosine = float(cosine)
        target = (set_name, key)
        current = best.get(target)
        if current is None or (-cosine, variant) < (-current[0], current[1]):
            best[target] = (cosine, variant)
    if not best:
        return [], None
    records = [
        dict(key=corpus_key, index_set=s, index_key=k, variant=v, cosine=c)
        for (s, k), (c, v) in sorted(best.items())
    ]
    top = min(records, key=lambda r: (-r["cosine"], r["index_set"], r["index_key"]))
    return records, stages.reason("near_duplicate_eval", top["index_set"])


SEARCHES = ("exact", "buckets")


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """How near-duplicates are searched; shared by the evaluation and the in-corpus dedup.

    ``threshold``: cosine above which (exclusive) a pair is a near-duplicate,
    the embedder's calibrated value (required). ``search``: see the module
    docstring. ``num_clusters`` (ALIGN: 4K; fewer on small corpora, see
    ``dedup.kmeans.effective_num_clusters``), ``nearest_clusters`` (ALIGN:
    10) and ``bucket_size`` (ALIGN: 3) are the paper's; the last two matter
    only for the bucket searches. ``sample_size``: corpus rows k-means trains
    on. ``centroid_merge_cosine``: centroids closer than this are merged
    after k-means (``dedup.kmeans.thin_centroids``); 0 automatic, -1 never,
    as in the preset (``dedup.kmeans.resolve_merge_cosine``).
    ``max_bucket_members``: hot buckets of
    the keyed join are salted into cells of at most this many per side.
    """

    threshold: float
    search: str = "exact"
    num_clusters: int = 4096
    nearest_clusters: int = 10
    bucket_size: int = 3
    sample_size: int = DEFAULT_SAMPLE_SIZE
    batch_size: int = DEFAULT_BATCH_SIZE
    kmeans_niter: int = kmeans_lib.DEFAULT_NITER
    seed: int = kmeans_lib.DEFAULT_SEED
    max_bucket_members: int = DEFAULT_MAX_BUCKET_MEMBERS
    centroid_merge_cosine: float = kmeans_lib.AUTOMATIC_MERGE

    def __post_init__(self):
        object.__setattr__(self, "threshold", check_threshold(self.threshold))
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {self.search!r}")
        if self.nearest_clusters < 1 or self.bucket_size < 1:
            raise ValueError("nearest_clusters and bucket_size must be >= 1")
        if self.num_clusters < 1 or self.sample_size < 1 or self.batch_size < 1:
            raise ValueError("num_clusters, sample_size and batch_size must be >= 1")
        self.merge_cosine  # validates centroid_merge_cosine

    @property
    def merge_cosine(self) -> Optional[float]:
        """The cosine k-means centroids are thinned at, None for plain k-means."""
        return kmeans_lib.resolve_merge_cosine(
            self.centroid_merge_cosine, self.threshold, buckets=self.search == "buckets"
        )

    def train_centroids(self) -> "TrainCentroids":
        return TrainCentroids(self.num_clusters, self.sample_size, self.kmeans_niter, self.seed, self.merge_cosine)

    def batch(self) -> beam.BatchElements:
        return beam.BatchElements(min_batch_size=min(256, self.batch_size), max_batch_size=self.batch_size)


# ---------------------------------------------------------------------------
# k-means centroids inside the job
# ---------------------------------------------------------------------------


class TrainCentroids(beam.PTransform):
    """``(key, embedding)`` -> singleton PCollection of unit centroids ``float32 [K, D]``.

    ``K = min(num_clusters, max(1, n // 39))`` for a sample of n rows (see
    ``dedup.kmeans``), fewer after ``merge_cosine`` thinning. The sample is
    the rows with ``sample_priority(key, seed) < sample_bound(count,
    sample_size)``, about ``sample_size`` rows: the same corpus always
    trains on the same rows in the same order, whatever the input order or
    runner. Only the drawn rows travel to the worker that trains.
    """

    def __init__(
        self,
        num_clusters: int,
        sample_size: int = DEFAULT_SAMPLE_SIZE,
        niter: int = kmeans_lib.DEFAULT_NITER,
        seed: int = kmeans_lib.DEFAULT_SEED,
        merge_cosine: Optional[float] = None,
    ):
        super().__init__()
        if sample_size < 1:
            raise ValueError("sample_size must be >= 1")
        self.num_clusters = int(num_clusters)
        self.sample_size = int(sample_size)
        self.niter = int(niter)
        self.seed = int(seed)
        self.merge_cosine = None if merge_cosine is None else float(merge_cosine)

    def expand(self, corpus):
        bound = (
            corpus
            | "CountForSample" >> beam.combiners.Count.Globally()
            | "SampleBound" >> beam.Map(kmeans_lib.sample_bound, self.sample_size)
        )
        return (
            corpus
            | "SampleKeys" >> beam.MapTuple(kmeans_lib.sample_element, seed=self.seed)
            | "SampleForKMeans" >> beam.Filter(kmeans_lib.in_sample, beam.pvalue.AsSingleton(bound))
            | "CollectSample" >> beam.combiners.ToList()
            | "TrainKMeans"
            >> beam.Map(
                kmeans_lib.train_from_sample,
                num_clusters=self.num_clusters,
                niter=self.niter,
                seed=self.seed,
                merge_cosine=self.merge_cosine,
            )
        )


# ---------------------------------------------------------------------------
# Broadcast index: match corpus batches against the side input
# ---------------------------------------------------------------------------


class _MatchBatchesFn(beam.DoFn):
    """A batch of ``(key, embedding)`` -> pair records and rejections for the keys that match."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.images = Metrics.counter(METRICS_NAMESPACE, "near_duplicate_eval/corpus_images")
        self.compared = Metrics.counter(METRICS_NAMESPACE, "near_duplicate_eval/compared_pairs")
        self.matched = Metrics.counter(METRICS_NAMESPACE, "near_duplicate_eval/near_duplicate_pairs")
        self.rejected = Metrics.counter(METRICS_NAMESPACE, "near_duplicate_eval/rejected")

    def setup(self):
        self._index = None

    def _prepared(self, index: ClusteredIndex) -> ClusteredIndex:
        # The side input may be decoded again for every bundle; keep the first
        # copy (its faiss index and inverted lists are built lazily, once).
        if self._index is None or self._index.token != index.token:
            self._index = index
        return self._index

    def process(self, batch, index):
        index = self._prepared(index)
        if not batch:
            return
        self.images.inc(len(batch))
        keys, vectors = stack_batch(batch)
        found = match_batch(index, keys, vectors)
        self.compared.inc(found.compared)
        self.matched.inc(found.matched)
        for record in found.pairs:
            yield beam.pvalue.TaggedOutput(PAIRS, record)
        for q, reason in found.rejected:
            key = keys[q]
            self.rejected.inc()
            Metrics.counter(METRICS_NAMESPACE, f"{reason}/rejected").inc()
            yield beam.pvalue.TaggedOutput(REJECTED, (key, reason))


@dataclasses.dataclass(frozen=True)
class Matches:
    """What ``match_batch`` found: pair records, ``(query row, reason)`` per matched row, and the work done."""

    pairs: list
    rejected: list
    compared: int
    matched: int


def match_batch(index: ClusteredIndex, keys: Sequence[str], vectors: np.ndarray) -> Matches:
    """Unit corpus vectors against the evaluation index: the pair records and one reason per matched key."""
    if index.empty or not len(keys):
        return Matches([], [], 0, 0)
    if vectors.shape[1] != index.rows.vectors.shape[1]:
        raise ValueError(f"corpus embeddings have dimension {vectors.shape[1]}, index {index.rows.vectors.shape[1]}")
    query_rows, index_rows, cosines, compared = index.match(vectors)
    per_query: Dict[int, list] = {}
    for q, r, c in zip(query_rows.tolist(), index_rows.tolist(), cosines.tolist()):
        per_query.setdefault(q, []).append((index.rows.row_key(r), c))
    pairs, rejected = [], []
    for q in sorted(per_query):
        records, reason = reduce_matches(keys[q], per_query[q])
        pairs += records
        rejected.append((q, reason))
    return Matches(pairs, rejected, int(compared), len(query_rows))


def index_centroids(rows: IndexRows, options: "SearchOptions") -> np.ndarray:
    """k-means centroids trained on the evaluation index itself, for matching corpus images as they are read.

    ALIGN trains its 4K clusters on the embedding model's own training images,
    not on the corpus it filters; here they come from the index, which the
    launcher has before the job starts. Exact search finds every pair above
    the threshold whatever the centroids; they set its speed.
    """
    sample = [kmeans_lib.sample_element(f"{s}/{k}/{v}", vector, options.seed)
              for (s, k, v), vector in zip(map(rows.row_key, range(len(rows))), rows.vectors)]
    return kmeans_lib.train_from_sample(sample, options.num_clusters, options.kmeans_niter, options.seed,
                                        options.merge_cosine, dim=rows.vectors.shape[1] if len(rows) else 0)


# ---------------------------------------------------------------------------
# The public composite
# ---------------------------------------------------------------------------


class RemoveNearDuplicates(beam.PTransform):
    """Corpus images that are near-duplicates of evaluation images (ALIGN appendix A).

    Args:
      index: an IndexSet-like object (numpy ``vectors [M, D]``, ``keys``,
        ``set_names``, ``variants`` of length M), or a PCollection holding one
        such object. Prefer the PCollection for real runs: an object is put in
        the job graph (``beam.Create``), and Dataflow rejects graphs over
        10 MB; ``pipeline.stages.eval_index.load_index_rows`` reads it from files
        on a worker.
      threshold, and keyword options: ``SearchOptions`` (``search="exact"``
        by default).

    Input: ``(corpus_key, embedding)``. Output: a dict with ``"pairs"``
    (``dict(key, index_set, index_key, variant, cosine)``, one per matched
    (corpus key, index set, index key), best variant) and ``"rejected"``
    (``(corpus_key, "near_duplicate_eval/<index_set>")``, one per matched
    corpus key). Corpus keys are expected to be unique.
    """

    def __init__(self, index, threshold: float, **options):
        super().__init__()
        self.options = SearchOptions(threshold=threshold, **options)
        self.index = index if isinstance(index, beam.pvalue.PCollection) else IndexRows.of(index)

    def _index_pcollection(self, pipeline):
        if isinstance(self.index, beam.pvalue.PCollection):
            return self.index | "IndexRows" >> beam.Map(IndexRows.of)
        return pipeline | "IndexRows" >> beam.Create([self.index])

    def expand(self, corpus):
        options = self.options
        centroids = corpus | "TrainCentroids" >> options.train_centroids()
        index_rows = self._index_pcollection(corpus.pipeline)
        clustered = index_rows | "ClusterIndex" >> beam.Map(
            build_clustered_index, beam.pvalue.AsSingleton(centroids), options=options
        )
        result = (
            corpus
            | "Batch" >> options.batch()
            | "MatchBatches"
            >> beam.ParDo(_MatchBatchesFn(options.threshold), beam.pvalue.AsSingleton(clustered)).with_outputs(
                PAIRS, REJECTED
            )
        )
        return {PAIRS: result[PAIRS], REJECTED: result[REJECTED]}
