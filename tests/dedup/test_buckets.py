"""C(10,3) buckets, the shared-cluster identity, and candidate generation (dedup.buckets)."""

import itertools
import math
import pickle

import numpy as np
import pytest

from common.vectors import l2_normalize
from dedup import buckets, kmeans, verify
from dedup.synthetic import planted_embeddings


def _random_sets(rng, rows, num_clusters, n=10):
    return np.stack([rng.choice(num_clusters, n, replace=False) for _ in range(rows)]).astype(np.int32)


def _correlated_sets(rng, rows, num_clusters, n=10, dim=8):
    """Top-n clusters of random points: neighbouring rows share many clusters, as in real data."""
    centroids = l2_normalize(rng.standard_normal((num_clusters, dim)))
    points = l2_normalize(rng.standard_normal((rows, dim)))
    return kmeans.CentroidAssigner(centroids).top_clusters(points, n)


# ---------------------------------------------------------------------------
# Bucket keys and the identity
# ---------------------------------------------------------------------------


def test_bucket_ids_are_all_3_subsets_in_lexicographic_order():
    rng = np.random.default_rng(0)
    row = rng.choice(4096, 10, replace=False)
    ids = buckets.bucket_ids(row[None], 4096, 3)[0]
    assert ids.shape == (120,)
    expected = [buckets.encode_bucket(c, 4096) for c in itertools.combinations(sorted(row), 3)]
    assert ids.tolist() == expected
    assert ids.tolist() == sorted(ids.tolist())
    for bucket_id, combo in zip(ids.tolist(), itertools.combinations(sorted(row.tolist()), 3)):
        assert buckets.decode_bucket(bucket_id, 4096, 3) == combo
    with pytest.raises(ValueError):
        buckets.bucket_ids(row[None], 2**22, 3)


def test_sharing_a_bucket_iff_sharing_at_least_three_clusters():
    rng = np.random.default_rng(1)
    # Few clusters so that every overlap size 0..10 occurs.
    for _ in range(400):
        a, b = _random_sets(rng, 2, num_clusters=rng.integers(10, 25))
        buckets_a = set(buckets.bucket_ids(a[None], 64, 3)[0].tolist())
        buckets_b = set(buckets.bucket_ids(b[None], 64, 3)[0].tolist())
        shared_buckets = buckets_a & buckets_b
        s = buckets.shared_cluster_count(a, b)
        assert (len(shared_buckets) > 0) == (s >= 3)
        assert len(shared_buckets) == math.comb(s, 3)
        canonical = buckets.canonical_bucket(a, b, 3)
        if shared_buckets:
            assert buckets.encode_bucket(canonical, 64) == min(shared_buckets)
        else:
            assert canonical is None


@pytest.mark.parametrize("make_sets", [_random_sets, _correlated_sets])
def test_candidates_equal_explicit_120_bucket_join(make_sets):
    rng = np.random.default_rng(2)
    num_clusters = 40
    index = make_sets(rng, 300, num_clusters)
    queries = make_sets(rng, 200, num_clusters)
    shared = buckets.SharedClusterIndex(index, num_clusters, bucket_size=3)
    q, r = shared.candidates(queries)
    got = list(zip(q.tolist(), r.tolist()))
    assert len(got) == len(set(got)), "each pair exactly once"
    expected = buckets.enumerate_bucket_pairs(queries, index, num_clusters, 3)
    assert len(expected) > 100
    assert set(got) == expected
    assert np.all(np.diff(r) >= 0), "ordered by index row"
    # After pickling (the side input path) the answer is the same.
    q2, r2 = pickle.loads(pickle.dumps(shared)).candidates(queries)
    assert set(zip(q2.tolist(), r2.tolist())) == expected


def test_fewer_clusters_than_bucket_size_compares_everything():
    index = np.array([[0, 1], [1, 0], [0, 1]], np.int32)
    queries = np.array([[1, 0]], np.int32)
    shared = buckets.SharedClusterIndex(index, num_clusters=2, bucket_size=3)
    assert shared.bucket_size == 2
    q, r = shared.candidates(queries)
    assert sorted(r.tolist()) == [0, 1, 2]


def test_candidates_empty_inputs_and_shape_errors():
    shared = buckets.SharedClusterIndex(np.zeros((0, 10), np.int32), 64, 3)
    q, r = shared.candidates(np.arange(10, dtype=np.int32)[None])
    assert len(q) == len(r) == 0
    shared = buckets.SharedClusterIndex(np.arange(10, dtype=np.int32)[None], 64, 3)
    assert len(shared.candidates(np.zeros((0, 10), np.int32))[0]) == 0
    with pytest.raises(ValueError):
        shared.candidates(np.zeros((1, 9), np.int32))
    with pytest.raises(ValueError):
        buckets.SharedClusterIndex(np.array([[70] * 10]), 64, 3)


# ---------------------------------------------------------------------------
# Keyed join helpers: canonical bucket and salting
# ---------------------------------------------------------------------------


def _members_by_bucket(sets, num_clusters):
    table = {}
    for row, ids in enumerate(buckets.bucket_ids(sets, num_clusters, 3)):
        for bucket in ids.tolist():
            table.setdefault(bucket, []).append(row)
    return table


def test_canonical_rule_emits_each_cross_pair_exactly_once():
    rng = np.random.default_rng(3)
    num_clusters = 30
    left = _correlated_sets(rng, 150, num_clusters)
    right = _correlated_sets(rng, 120, num_clusters)
    left_table, right_table = _members_by_bucket(left, num_clusters), _members_by_bucket(right, num_clusters)
    emitted = []
    for bucket, lrows in left_table.items():
        rrows = right_table.get(bucket)
        if not rrows:
            continue
        i, j = buckets.canonical_pairs_in_bucket(
            buckets.decode_bucket(bucket, num_clusters, 3), left[lrows], right[rrows]
        )
        emitted += [(lrows[a], rrows[b]) for a, b in zip(i.tolist(), j.tolist())]
    expected = buckets.enumerate_bucket_pairs(left, right, num_clusters, 3)
    assert len(emitted) == len(set(emitted)) == len(expected)
    assert set(emitted) == expected


def test_canonical_rule_in_a_self_join():
    rng = np.random.default_rng(4)
    num_clusters = 30
    sets = _correlated_sets(rng, 150, num_clusters)
    emitted = []
    for bucket, rows in _members_by_bucket(sets, num_clusters).items():
        i, j = buckets.canonical_pairs_in_bucket(
            buckets.decode_bucket(bucket, num_clusters, 3), sets[rows], sets[rows], same_side=True
        )
        emitted += [(rows[a], rows[b]) for a, b in zip(i.tolist(), j.tolist())]
    expected = {(a, b) for a, b in buckets.enumerate_bucket_pairs(sets, sets, num_clusters, 3) if a < b}
    assert len(emitted) == len(expected) and set(emitted) == expected


@pytest.mark.parametrize("salts", [1, 2, 5])
def test_self_join_cells_meet_each_pair_once(salts):
    # Members of chunks a and b are compared in the one cell (min, max) both
    # join (the cell compares chunk a with chunk b, or chunk a with itself).
    for a in range(salts):
        for b in range(salts):
            common = set(buckets.self_join_cells(a, salts)) & set(buckets.self_join_cells(b, salts))
            assert (min(a, b), max(a, b)) in common
            if a != b:
                assert common == {(min(a, b), max(a, b))}
    assert len({c for s in range(salts) for c in buckets.self_join_cells(s, salts)}) == salts * (salts + 1) // 2
    assert buckets.num_salts(2500, 1000) == 3 and buckets.num_salts(10, 1000) == 1
    assert 0 <= buckets.salt_of("key", 7) < 7 and buckets.salt_of("key", 7) == buckets.salt_of("key", 7)


# ---------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------


def test_pair_cosines_equal_plain_dot_products_across_blocks():
    rng = np.random.default_rng(6)
    queries = rng.standard_normal((50, 12)).astype(np.float32) * 3  # not normalised
    index = rng.standard_normal((80, 12)).astype(np.float32)
    q = rng.integers(0, 50, 1000)
    r = rng.integers(0, 80, 1000)
    expected = np.einsum("ij,ij->i", l2_normalize(queries)[q], l2_normalize(index)[r])
    for block in (7, 64, 4096):
        np.testing.assert_allclose(verify.pair_cosines(queries, index, q, r, block_pairs=block), expected, atol=1e-6)
    dense = verify.block_cosines(queries, index)
    np.testing.assert_allclose(dense[q, r], expected, atol=1e-6)
    assert len(verify.pair_cosines(queries, index, q[:0], r[:0])) == 0
    with pytest.raises(IndexError):
        verify.pair_cosines(queries, index, np.array([50]), np.array([0]))
    with pytest.raises(IndexError):
        verify.pair_cosines(queries, index, np.array([0]), np.array([-1]))


def test_threshold_is_exclusive():
    t = np.float32(0.975)
    assert verify.above_threshold(np.array([t, np.nextafter(t, np.float32(1))], np.float32), 0.975).tolist() == [False, True]


# ---------------------------------------------------------------------------
# Acceptance: candidate generation loses no above-threshold pair
# ---------------------------------------------------------------------------


def lost_pairs(corpus, index, threshold, num_clusters=4096, niter=10, merge_cosine=None):
    """Run k-means -> top-10 -> shared >= 3 -> verify; compare with faiss exhaustive search."""
    import faiss

    centroids = kmeans.train_spherical_kmeans(corpus, num_clusters, niter=niter)
    if merge_cosine is not None:
        sizes = np.bincount(kmeans.CentroidAssigner(centroids).top_clusters(corpus, 1)[:, 0], minlength=len(centroids))
        centroids = kmeans.thin_centroids(centroids, sizes, merge_cosine)
    assigner = kmeans.CentroidAssigner(centroids)
    shared = buckets.SharedClusterIndex(assigner.top_clusters(index, 10), len(centroids), 3)
    q, r = shared.candidates(assigner.top_clusters(corpus, 10))
    cos = verify.pair_cosines(corpus, index, q, r, normalized=True)
    hit = verify.above_threshold(cos, threshold)
    found = set(zip(q[hit].tolist(), r[hit].tolist()))

    exhaustive = faiss.IndexFlatIP(corpus.shape[1])
    exhaustive.add(index)
    lims, sims, ids = exhaustive.range_search(corpus, threshold)
    rows = np.repeat(np.arange(len(corpus)), np.diff(lims.astype(np.int64)))
    # Pairs within float rounding of the threshold may fall either way between
    # two dot-product implementations; compare only clear cases.
    margin = 1e-5
    expected = {(a, b) for a, b, s in zip(rows.tolist(), ids.tolist(), sims.tolist()) if s > threshold + margin}
    clear_found = {p for p in found if abs(float(corpus[p[0]] @ index[p[1]]) - threshold) > margin}
    assert clear_found <= set(zip(rows.tolist(), ids.tolist())), "verification found a pair exhaustive search did not"
    return expected - found, expected, len(q)


@pytest.mark.parametrize("zipf", [False, True], ids=["uniform", "zipf"])
def test_bucket_rule_loses_no_pair_at_20k(zipf):
    """ALIGN's rule with thinned centroids; the exact search is tested in test_cluster_lists."""
    corpus, index = planted_embeddings(20_000, 4_000, zipf=zipf)
    threshold = 0.975
    lost, expected, candidates = lost_pairs(corpus, index, threshold, merge_cosine=kmeans.merge_cosine_for(threshold))
    assert len(expected) > 1000
    assert not lost, f"{len(lost)} of {len(expected)} above-threshold pairs lost"


@pytest.mark.slow
@pytest.mark.parametrize("zipf", [False, True], ids=["uniform", "zipf"])
def test_bucket_rule_loses_at_most_1e4_of_pairs_at_100k(zipf):
    corpus, index = planted_embeddings(100_000, 20_000, zipf=zipf)
    threshold = 0.975
    lost, expected, candidates = lost_pairs(corpus, index, threshold, merge_cosine=kmeans.merge_cosine_for(threshold))
    print(f"100k zipf={zipf}: {len(expected)} pairs above threshold, {len(lost)} lost, {candidates} candidates")
    assert len(expected) > 10_000
    assert len(lost) <= len(expected) * 1e-4, f"{len(lost)} of {len(expected)} above-threshold pairs lost"
