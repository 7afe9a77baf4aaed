"""In-corpus duplicate removal (dedup.corpus_dedup) and the bucket self-join under it."""

import apache_beam as beam
import numpy as np
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from common.vectors import l2_normalize
from dedup import corpus_dedup, keyed_joins, kmeans
from dedup.synthetic import at_angle

THRESHOLD = 0.975
DIM = 16


def _copy_at(rng, y, cosine):
    """A unit vector at exactly ``cosine`` from unit vector y."""
    return at_angle(rng, y, np.arccos(cosine))


def near_duplicate_corpus(size=600, seed=0):
    """Random unit vectors plus planted near-duplicate groups and a chain.

    Groups: n0 with 2 copies; n1 with 4 copies (some copies are mutual
    near-duplicates too); a chain c0 ~ c1 ~ c2 where c0 and c2 are not.
    """
    rng = np.random.default_rng(seed)
    vectors = {f"r{i:04d}": v for i, v in enumerate(l2_normalize(rng.standard_normal((size, DIM))))}
    for group, copies in (("n0", 2), ("n1", 4)):
        base = vectors[f"r{rng.integers(size):04d}"]
        for j in range(copies):
            vectors[f"{group}_{j}"] = _copy_at(rng, base, 0.99)
    c0 = l2_normalize(rng.standard_normal((1, DIM)))[0]
    c1 = _copy_at(rng, c0, 0.98)
    # c2 continues away from c0 in the c0-c1 plane: cos(c1, c2) = 0.98, cos(c0, c2) ~ 0.92.
    angle = np.arccos(0.98)
    direction = (c1 - np.cos(angle) * c0) / np.linalg.norm(c1 - np.cos(angle) * c0)
    c2 = np.cos(2 * angle) * c0 + np.sin(2 * angle) * direction
    vectors.update(c0=c0, c1=c1, c2=c2.astype(np.float32))
    return vectors


def exhaustive_removed(vectors, threshold):
    keys = sorted(vectors)
    x = l2_normalize(np.stack([vectors[k] for k in keys]))
    sims = x @ x.T
    removed = set()
    for j, key in enumerate(keys):
        if np.any(sims[:j, j] > threshold):
            removed.add(key)
    return removed


def test_representatives_and_reason_order():
    assert corpus_dedup.non_representatives(["b", "a", "c", "a"]) == ["b", "c"]
    assert corpus_dedup.non_representatives(["a"]) == []
    assert corpus_dedup.first_reason(
        ["near_duplicate_corpus/embedding", "near_duplicate_corpus/phash"]
    ) == "near_duplicate_corpus/phash"
    assert corpus_dedup.reason_for("sha256") == "near_duplicate_corpus/sha256"


def test_planted_expectation_includes_the_chain():
    vectors = near_duplicate_corpus()
    removed = exhaustive_removed(vectors, THRESHOLD)
    assert {"c1", "c2"} <= removed and "c0" not in removed
    assert float(vectors["c0"] @ vectors["c2"]) < THRESHOLD


def test_hash_groups_keep_the_smallest_key():
    records = [
        ("k1", "AA", "p1"),
        ("k0", "aa", "p1"),  # same sha256 (case-insensitive) as k1
        ("k2", "bb", "p1"),  # same phash as k0/k1
        ("k3", "cc", "p2"),
        ("k4", "dd", "p2"),
        ("k5", "ee", ""),  # no phash: never grouped on phash
        ("k6", "", ""),
        ("k7", "", ""),  # no hashes at all: never grouped
    ]
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        removed = p | beam.Create(records) | corpus_dedup.RemoveCorpusDuplicates()
        assert_that(
            removed,
            equal_to(
                [
                    ("k1", "near_duplicate_corpus/sha256"),
                    ("k2", "near_duplicate_corpus/phash"),
                    ("k4", "near_duplicate_corpus/phash"),
                ]
            ),
        )


def test_embedding_self_join_equals_exhaustive():
    vectors = near_duplicate_corpus(size=300)
    expected = sorted((k, "near_duplicate_corpus/embedding") for k in exhaustive_removed(vectors, THRESHOLD))
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        removed = (
            p
            | beam.Create(sorted(vectors.items()))
            | corpus_dedup.RemoveEmbeddingDuplicates(
                THRESHOLD,
                num_clusters=12,
                nearest_clusters=5,
                bucket_size=2,  # C(5, 2) = 10 keys per image keeps the test fast
                sample_size=1000,
                max_bucket_members=7,  # hot buckets split into salted cells
            )
        )
        assert_that(removed, equal_to(expected))


def test_self_join_pairs_once_each():
    """BucketJoin returns each near-duplicate pair exactly once, smaller key first."""
    vectors = near_duplicate_corpus(size=200)
    keys = sorted(vectors)
    x = l2_normalize(np.stack([vectors[k] for k in keys]))
    sims = x @ x.T
    expected = [
        (keys[i], keys[j])
        for i in range(len(keys))
        for j in range(i + 1, len(keys))
        if sims[i, j] > THRESHOLD
    ]
    centroids = kmeans.train_spherical_kmeans(x, 5)
    clusters = kmeans.CentroidAssigner(centroids).top_clusters(x, 3)
    members = [(k, x[i], tuple(int(c) for c in clusters[i])) for i, k in enumerate(keys)]
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        pairs = (
            p
            | beam.Create(members)
            | keyed_joins.BucketJoin(THRESHOLD, radix=5, bucket_size=2, max_bucket_members=5)
            | beam.Map(lambda m: (m[0], m[1]))
        )
        assert_that(pairs, equal_to(expected))


def test_union_reports_each_key_once_with_its_first_reason():
    vectors = near_duplicate_corpus(size=100)
    keys = sorted(vectors)
    # c1 has the bytes of c0 (sha256) and is also c0's embedding near-duplicate.
    records = [(k, "same" if k in ("c0", "c1") else f"sha{k}", f"ph{k}") for k in keys]
    expected_embedding = exhaustive_removed(vectors, THRESHOLD)
    assert "c1" in expected_embedding
    expected = {k: "near_duplicate_corpus/embedding" for k in expected_embedding}
    expected["c1"] = "near_duplicate_corpus/sha256"
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        embeddings = p | "Embeddings" >> beam.Create(sorted(vectors.items()))
        removed = (
            p
            | "Records" >> beam.Create(records)
            | corpus_dedup.RemoveCorpusDuplicates(
                embeddings, THRESHOLD, num_clusters=4, nearest_clusters=3, bucket_size=2, sample_size=1000
            )
        )
        assert_that(removed, equal_to(sorted(expected.items())))
