"""Beam composites for near-duplicate removal (dedup.transforms) on a small planted set."""

import dataclasses

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from common.vectors import l2_normalize
from dedup import kmeans, transforms
from dedup.synthetic import at_angle

DIM = 16
THRESHOLD = 0.975


@dataclasses.dataclass
class FakeIndexSet:
    """What RemoveNearDuplicates reads from dedup.index_sets.IndexSet."""

    vectors: np.ndarray
    keys: np.ndarray
    set_names: np.ndarray
    variants: np.ndarray


def _unit(x):
    return l2_normalize(np.asarray(x, np.float32))


def _copy_at(rng, y, cosine):
    """A unit vector at exactly ``cosine`` from unit vector y."""
    return at_angle(rng, y, np.arccos(cosine))


def planted_case(seed=0, corpus_size=1200):
    """A corpus with planted near-copies of index rows, and the index.

    - corpus c0: copy of coco/a (original variant) at 0.995
    - corpus c1: closer to coco/b's flip (0.998) than to coco/b's original
    - corpus c2: copy of flickr/x and, as it happens, of coco/x (both sets)
    - corpus c3: at 0.96 from coco/a: below the threshold, kept
    Everything else is random (far from the index in 16 dimensions).
    """
    rng = np.random.default_rng(seed)
    base = _unit(rng.standard_normal((40, DIM)))
    keys, sets, variants, vectors = [], [], [], []
    for i in range(20):
        for variant, v in (("original", base[i]), ("flip", _copy_at(rng, base[i], 0.9))):
            keys.append(f"img{i}")
            sets.append("coco")
            variants.append(variant)
            vectors.append(v)
    keys[0] = keys[1] = "a"
    keys[2] = keys[3] = "b"
    keys[4] = keys[5] = "x"
    for i in range(20, 30):
        keys.append(f"f{i}")
        sets.append("flickr")
        variants.append("original")
        vectors.append(base[i])
    keys[40], vectors[40] = "x", _copy_at(rng, vectors[4], 0.999)
    index = FakeIndexSet(_unit(np.stack(vectors)), np.array(keys), np.array(sets), np.array(variants))

    corpus = {f"r{i:05d}": v for i, v in enumerate(_unit(rng.standard_normal((corpus_size, DIM))))}
    corpus["c0"] = _copy_at(rng, index.vectors[0], 0.995)
    corpus["c1"] = _copy_at(rng, index.vectors[3], 0.998)
    corpus["c2"] = _copy_at(rng, index.vectors[40], 0.997)
    corpus["c3"] = _copy_at(rng, index.vectors[0], 0.96)
    return corpus, index


def exhaustive_expectation(corpus, index, threshold):
    """What RemoveNearDuplicates must output, by brute force over all pairs."""
    keys = sorted(corpus)
    sims = _unit(np.stack([corpus[k] for k in keys])) @ index.vectors.T
    pairs, rejected = [], []
    for qi, key in enumerate(keys):
        matches = [
            ((index.set_names[r], index.keys[r], index.variants[r]), float(sims[qi, r]))
            for r in np.flatnonzero(sims[qi] > threshold)
        ]
        records, reason = transforms.reduce_matches(key, matches)
        pairs += records
        if reason:
            rejected.append((key, reason))
    return pairs, rejected


def _rounded(records):
    return [dict(r, cosine=round(r["cosine"], 4)) for r in records]


def test_reduce_matches_keeps_best_variant_and_names_best_set():
    records, reason = transforms.reduce_matches(
        "q",
        [
            (("coco", "a", "flip"), 0.99),
            (("coco", "a", "original"), 0.995),
            (("coco", "a", "center_crop_90"), 0.995),
            (("flickr", "z", "original"), 0.999),
        ],
    )
    assert records == [
        dict(key="q", index_set="coco", index_key="a", variant="center_crop_90", cosine=0.995),
        dict(key="q", index_set="flickr", index_key="z", variant="original", cosine=0.999),
    ]
    assert reason == "near_duplicate_eval/flickr"
    assert transforms.reduce_matches("q", []) == ([], None)


def test_planted_case_expectation():
    corpus, index = planted_case()
    pairs, rejected = exhaustive_expectation(corpus, index, THRESHOLD)
    assert sorted(k for k, _ in rejected) == ["c0", "c1", "c2"]
    by_key = {}
    for p in pairs:
        by_key.setdefault(p["key"], []).append((p["index_set"], p["index_key"], p["variant"]))
    assert by_key["c1"] == [("coco", "b", "flip")]
    assert {s for s, _, _ in by_key["c2"]} == {"coco", "flickr"}


@pytest.mark.parametrize(
    "search,nearest_clusters,bucket_size",
    [("exact", 10, 3), ("buckets", 10, 3)],
)
def test_remove_near_duplicates_matches_exhaustive_search(search, nearest_clusters, bucket_size):
    corpus, index = planted_case(corpus_size=700)
    expected_pairs, expected_rejected = exhaustive_expectation(corpus, index, THRESHOLD)
    items = sorted(corpus.items())
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        result = (
            p
            | beam.Create(items)
            | transforms.RemoveNearDuplicates(
                index,
                threshold=THRESHOLD,
                num_clusters=16,
                nearest_clusters=nearest_clusters,
                bucket_size=bucket_size,
                sample_size=800,
                batch_size=128,
                search=search,
                max_bucket_members=40,  # small: exercises hot-bucket salting
            )
        )
        assert_that(result["pairs"] | beam.Map(lambda r: dict(r, cosine=round(r["cosine"], 4))),
                    equal_to(_rounded(expected_pairs)), label="Pairs")
        assert_that(result["rejected"], equal_to(expected_rejected), label="Rejected")


def test_counters_and_index_as_pcollection():
    corpus, index = planted_case(corpus_size=300)
    p = test_pipeline.TestPipeline(runner="FnApiRunner")
    index_pc = p | "Index" >> beam.Create([index])
    result = p | beam.Create(sorted(corpus.items())) | transforms.RemoveNearDuplicates(
        index_pc, threshold=THRESHOLD, num_clusters=8, sample_size=1000
    )
    assert_that(result["rejected"] | beam.Keys(), equal_to(["c0", "c1", "c2"]))
    run = p.run()
    run.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in run.metrics().query()["counters"]}
    assert counters["near_duplicate_eval/corpus_images"] == len(corpus)
    assert counters["near_duplicate_eval/rejected"] == 3
    assert counters["near_duplicate_eval/coco/rejected"] + counters.get("near_duplicate_eval/flickr/rejected", 0) == 3
    assert counters["near_duplicate_eval/near_duplicate_pairs"] >= 4
    # 304 rows train 304 // 39 = 7 lists in one block: the exact search
    # compares each query with all rows of the lists it probes, at most all.
    assert 0 < counters["near_duplicate_eval/compared_pairs"] <= len(corpus) * len(index.keys)


def test_empty_index_or_corpus_gives_no_output():
    corpus, index = planted_case(corpus_size=50)
    empty_index = FakeIndexSet(np.zeros((0, DIM), np.float32), np.array([]), np.array([]), np.array([]))
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        rows = p | "Corpus" >> beam.Create(sorted(corpus.items()))
        no_index = rows | "NoIndex" >> transforms.RemoveNearDuplicates(empty_index, threshold=THRESHOLD)
        no_corpus = (
            p
            | "NoRows" >> beam.Create([("k", np.zeros(DIM, np.float32))])
            | beam.Filter(lambda kv: False)
            | "NoCorpus" >> transforms.RemoveNearDuplicates(index, threshold=THRESHOLD)
        )
        for name, result in (("NoIndex", no_index), ("NoCorpus", no_corpus)):
            assert_that(result["pairs"], equal_to([]), label=f"{name}Pairs")
            assert_that(result["rejected"], equal_to([]), label=f"{name}Rejected")


def test_train_centroids_samples_the_rows_under_the_hash_bound_in_any_order():
    # 500 rows, sample_size 200: each row is drawn with probability 0.4 by
    # its key hash (not the 200 smallest hashes: a global top-N merges every
    # bundle's candidates on one worker).
    rng = np.random.default_rng(5)
    rows = [(f"k{i}", v) for i, v in enumerate(_unit(rng.standard_normal((500, DIM))))]
    sample_size = 200
    bound = kmeans.sample_bound(len(rows), sample_size)
    chosen = [e for e in (kmeans.sample_element(k, v) for k, v in rows) if e[0] < bound]
    smallest = sorted((kmeans.sample_element(k, v) for k, v in rows), key=kmeans.sample_order)[:sample_size]
    assert len(chosen) != sample_size and {e[1] for e in chosen} != {e[1] for e in smallest}
    expected = kmeans.train_from_sample(chosen, num_clusters=4, niter=5)

    def matches(actual):
        assert len(actual) == 1
        np.testing.assert_array_equal(actual[0], expected)

    for order in (rows, rows[::-1]):
        with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
            centroids = p | beam.Create(order) | transforms.TrainCentroids(4, sample_size=sample_size, niter=5)
            assert_that(centroids, matches)


def test_threshold_is_required_and_checked():
    _, index = planted_case(corpus_size=10)
    with pytest.raises(ValueError, match="embedder"):
        transforms.RemoveNearDuplicates(index, threshold=None)
    with pytest.raises(ValueError):
        transforms.RemoveNearDuplicates(index, threshold=0.0)
    with pytest.raises(ValueError, match="search"):
        transforms.RemoveNearDuplicates(index, threshold=0.9, search="nope")
    with pytest.raises(TypeError):
        transforms.RemoveNearDuplicates(index, threshold=0.9, join="buckets")  # not an option


def test_centroid_thinning_is_automatic_only_for_the_bucket_searches():
    exact = transforms.SearchOptions(threshold=0.975)
    assert exact.merge_cosine is None
    buckets = transforms.SearchOptions(0.975, search="buckets")
    assert buckets.merge_cosine == kmeans.merge_cosine_for(0.975)
    assert transforms.SearchOptions(0.975, search="buckets", centroid_merge_cosine=-1).merge_cosine is None
    for removed in ("bucket_join", "list_join"):  # measured and removed: benchmarks/RESULTS.md
        with pytest.raises(ValueError, match="search"):
            transforms.SearchOptions(0.975, search=removed)
    assert transforms.SearchOptions(0.975, centroid_merge_cosine=0.99).merge_cosine == 0.99
    for wrong in (1.5, 1.0, -0.5, "auto", None):
        with pytest.raises((ValueError, TypeError)):
            transforms.SearchOptions(0.975, centroid_merge_cosine=wrong)
