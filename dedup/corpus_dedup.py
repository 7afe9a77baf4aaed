"""In-corpus duplicate removal (optional stage; preset ``dedup_in_corpus``, off by default).

Three ways two corpus images count as the same image, checked in this order:

1. ``sha256``: identical bytes.
2. ``phash``: identical 64-bit perceptual hash (re-encodes, resizes).
3. ``embedding``: cosine > threshold between image embeddings, found with the
   same k-means C(n, b) buckets as the evaluation dedup, as a keyed self-join
   (``dedup.keyed_joins.BucketJoin``): each pair once (canonical bucket), hot
   buckets salted into cells of at most ``max_bucket_members`` per side, each
   cell verified by one matrix product. No cell grows with the corpus.

The rule is the same for all three: **an image is removed iff it is a
duplicate of an image with a smaller key**. For hash groups that keeps exactly
the smallest key of each group. For embeddings (not transitive) it keeps a set
in which no two images are near-duplicates (of any near-duplicate pair the
larger key goes), deterministic and independent of processing order; in a
chain a ~ b ~ c with a !~ c, both b and c go.

Methods are run independently over all inputs and each removed key is
reported once, with the first method (in the order above) that removes it.
This equals running them one after another on the survivors for the hash
methods (an image's sha256 group lies inside its phash group, and a group's
smallest key survives ``sha256``); for embeddings the smaller neighbour may
itself be a hash duplicate, which then has a byte-identical twin with an even
smaller key, or (for a phash twin) a near-identical one.

Output: ``(key, "near_duplicate_corpus/<method>")`` for every removed key.
"""

from __future__ import annotations

from typing import Iterable, Optional

import apache_beam as beam
from apache_beam.metrics import Metrics

from dedup import keyed_joins, transforms
from filters import stages

METHODS = ("sha256", "phash", "embedding")
STAGE = "near_duplicate_corpus"


def reason_for(method: str) -> str:
    return stages.reason(STAGE, method)


def _reason_rank(reason: str) -> int:
    return METHODS.index(reason.split("/", 1)[1])


def first_reason(reasons: Iterable[str]) -> str:
    """The reason of the earliest method (associative, for ``CombinePerKey``)."""
    return min(reasons, key=_reason_rank)


def non_representatives(keys: Iterable[str]) -> list:
    """Keys of one duplicate group minus its representative, the smallest key (sorted)."""
    unique = sorted(set(keys))
    return unique[1:]


def _hash_field(record, field: int):
    key, value = record[0], record[field]
    if value:  # images without a hash (not computed, undecodable) are never grouped
        yield str(value).lower(), str(key)


def _group_removals(group, method: str):
    _, keys = group
    removed = non_representatives(keys)
    if removed:
        Metrics.counter(transforms.METRICS_NAMESPACE, f"{STAGE}/{method}").inc(len(removed))
    for key in removed:
        yield key, reason_for(method)


class RemoveHashDuplicates(beam.PTransform):
    """``(key, sha256, phash_hex)`` -> ``(key, reason)`` for all but the smallest key per hash."""

    def __init__(self, method: str):
        super().__init__()
        if method not in ("sha256", "phash"):
            raise ValueError(f"method must be sha256 or phash, got {method!r}")
        self.method = method
        self.field = 1 if method == "sha256" else 2

    def expand(self, records):
        return (
            records
            | "ByHash" >> beam.FlatMap(_hash_field, self.field)
            | "GroupByHash" >> beam.GroupByKey()
            | "AllButSmallest" >> beam.FlatMap(_group_removals, self.method)
        )


def _larger_key(match):
    first, second, _ = match
    return max(first, second)


def _embedding_reason(key):
    Metrics.counter(transforms.METRICS_NAMESPACE, f"{STAGE}/embedding").inc()
    return key, reason_for("embedding")


class RemoveEmbeddingDuplicates(beam.PTransform):
    """``(key, embedding)`` -> ``(key, "near_duplicate_corpus/embedding")``.

    A key is removed iff some smaller key is within cosine > threshold and
    shares one of the C(n, b) buckets with it. k-means is trained inside the
    job as in ``RemoveNearDuplicates``; ``options`` are its
    ``SearchOptions``. The search is always ALIGN's bucket rule
    (``search="buckets"``, so centroids are thinned as for the bucket
    search), run as a keyed self-join of the whole corpus.
    """

    def __init__(self, threshold: float, **options):
        super().__init__()
        if options.setdefault("search", "buckets") != "buckets":
            raise ValueError(f"in-corpus dedup is a self-join on bucket keys (search='buckets'), got {options['search']!r}")
        self.options = transforms.SearchOptions(threshold=threshold, **options)
        self.threshold = self.options.threshold

    def expand(self, embeddings):
        options = self.options
        centroids = embeddings | "TrainCentroids" >> options.train_centroids()
        return (
            embeddings
            | "Assign" >> keyed_joins.AssignTopClusters(centroids, options.nearest_clusters, options.batch_size)
            | "SelfJoin"
            >> keyed_joins.BucketJoin(
                options.threshold,
                options.num_clusters,
                options.bucket_size,
                max_bucket_members=options.max_bucket_members,
            )
            | "LargerKey" >> beam.Map(_larger_key)
            | "OncePerKey" >> beam.Distinct()
            | "Reason" >> beam.Map(_embedding_reason)
        )


class RemoveCorpusDuplicates(beam.PTransform):
    """Union of the three methods, one reason per removed key (earliest method).

    Input: ``(key, sha256, phash_hex)`` records; ``embeddings`` (optional) a
    PCollection of ``(key, embedding)`` for the same keys, with ``threshold``
    (the embedder's). Without embeddings only the hash methods run.
    """

    def __init__(self, embeddings=None, threshold: Optional[float] = None, **embedding_options):
        super().__init__()
        if embeddings is not None and threshold is None:
            raise ValueError("embedding dedup needs the embedder's threshold")
        self.embeddings = embeddings
        self.threshold = threshold
        self.embedding_options = embedding_options

    def expand(self, records):
        removals = [
            records | "Sha256" >> RemoveHashDuplicates("sha256"),
            records | "Phash" >> RemoveHashDuplicates("phash"),
        ]
        if self.embeddings is not None:
            removals.append(
                self.embeddings
                | "Embedding" >> RemoveEmbeddingDuplicates(self.threshold, **self.embedding_options)
            )
        return (
            removals
            | "AllRemovals" >> beam.Flatten()
            | "FirstReason" >> beam.CombinePerKey(first_reason)
        )
