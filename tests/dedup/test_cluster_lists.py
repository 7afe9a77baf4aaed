"""Exact search over k-means lists (dedup.cluster_lists): no above-threshold pair is lost."""

import pickle

import numpy as np
import pytest

from common.vectors import l2_normalize
from dedup import buckets, cluster_lists, kmeans, verify
from dedup.synthetic import planted_embeddings

THRESHOLD = 0.975
#: Pairs this close to the threshold may fall either way between two
#: float32 dot-product implementations; they are not counted as lost or extra.
MARGIN = 1e-5


def _pairs(matches, offset=0):
    return set(zip((matches.query_rows + offset).tolist(), matches.index_rows.tolist()))


def _search_all(index, queries, batch=4096):
    found = set()
    for start in range(0, len(queries), batch):
        found |= _pairs(index.search(queries[start : start + batch], normalized=True), start)
    return found


def lost_and_extra(corpus, index, centroids, threshold=THRESHOLD, **kwargs):
    """Pairs of exhaustive search missing from the list search, and list-search pairs exhaustive search lacks."""
    import faiss

    found = _search_all(cluster_lists.ClusterListIndex(index, centroids, threshold, **kwargs), corpus)
    flat = faiss.IndexFlatIP(corpus.shape[1])
    flat.add(index)
    lims, sims, ids = flat.range_search(corpus, threshold)
    rows = np.repeat(np.arange(len(corpus)), np.diff(lims.astype(np.int64)))
    truth = {(a, b) for a, b, s in zip(rows.tolist(), ids.tolist(), sims.tolist()) if s > threshold + MARGIN}
    clear_found = {p for p in found if abs(float(corpus[p[0]] @ index[p[1]]) - threshold) > MARGIN}
    return truth - found, clear_found - set(zip(rows.tolist(), ids.tolist())), truth


@pytest.mark.parametrize("zipf", [False, True], ids=["uniform", "zipf"])
def test_no_pair_lost_20k(zipf):
    corpus, index = planted_embeddings(20_000, 4_000, zipf=zipf)
    centroids = kmeans.train_spherical_kmeans(corpus, 4096, niter=10)  # 512 clusters for 20k rows
    lost, extra, truth = lost_and_extra(corpus, index, centroids)
    assert len(truth) > 1000
    assert not lost, f"{len(lost)} of {len(truth)} above-threshold pairs lost"
    assert not extra


@pytest.mark.slow
@pytest.mark.parametrize("zipf", [False, True], ids=["uniform", "zipf"])
def test_no_pair_lost_100k(zipf):
    """The acceptance test: >= 100k embeddings, uniform and Zipf-skewed, plain k-means with 4096 clusters."""
    corpus, index = planted_embeddings(160_000, 20_000, zipf=zipf)
    centroids = kmeans.train_spherical_kmeans(corpus, 4096, niter=10)
    assert len(centroids) == 4096
    lost, extra, truth = lost_and_extra(corpus, index, centroids)
    print(f"160k zipf={zipf}: {len(truth)} pairs above threshold, {len(lost)} lost")
    assert len(truth) > 10_000
    assert not lost, f"{len(lost)} of {len(truth)} above-threshold pairs lost"
    assert not extra


def test_exact_whatever_the_centroids():
    """Random centroids (not k-means) only make the search slower; a single centroid too."""
    rng = np.random.default_rng(3)
    corpus, index = planted_embeddings(4_000, 2_000, zipf=True, seed=5)
    for centroids in (l2_normalize(rng.standard_normal((300, 64))), index[:1]):
        lost, extra, truth = lost_and_extra(corpus, index, centroids)
        assert len(truth) > 100
        assert not lost and not extra


def test_finds_a_superset_of_the_bucket_pairs():
    corpus, index = planted_embeddings(10_000, 3_000, zipf=True, seed=2)
    centroids = kmeans.train_spherical_kmeans(corpus, 256, niter=10)
    assigner = kmeans.CentroidAssigner(centroids)
    shared = buckets.SharedClusterIndex(assigner.top_clusters(index, 10), len(centroids), 3)
    q, r = shared.candidates(assigner.top_clusters(corpus, 10))
    cos = verify.pair_cosines(corpus, index, q, r, normalized=True)
    keep = cos > THRESHOLD + MARGIN
    bucket_pairs = set(zip(q[keep].tolist(), r[keep].tolist()))
    found = _search_all(cluster_lists.ClusterListIndex(index, centroids, THRESHOLD), corpus)
    assert len(bucket_pairs) > 1000
    assert bucket_pairs <= found


@pytest.fixture(scope="module")
def default_plan():
    """(corpus, index, centroids, the default plan's search of the corpus), for both plans' test."""
    corpus, index = planted_embeddings(6_000, 3_000, zipf=True, seed=4)
    centroids = kmeans.train_spherical_kmeans(corpus, 4096, niter=5)  # 153 lists, 3 blocks
    return corpus, index, centroids, cluster_lists.ClusterListIndex(index, centroids, THRESHOLD).search(corpus)


@pytest.mark.parametrize("call_overhead", [0, 10**12], ids=["list_by_list", "whole_blocks"])
def test_both_plans_give_the_same_pairs_and_cosines(call_overhead, default_plan):
    corpus, index, centroids, a = default_plan
    plan = cluster_lists.ClusterListIndex(index, centroids, THRESHOLD, call_overhead=call_overhead)
    b = plan.search(corpus)
    assert len(a) > 100
    np.testing.assert_array_equal(a.query_rows, b.query_rows)
    np.testing.assert_array_equal(a.index_rows, b.index_rows)
    np.testing.assert_allclose(a.cosines, b.cosines, atol=1e-6)
    expected = np.einsum("ij,ij->i", corpus[a.query_rows], index[a.index_rows])
    np.testing.assert_allclose(a.cosines, expected, atol=1e-6)
    assert (np.diff(a.query_rows) >= 0).all()
    if call_overhead == 0:
        assert b.compared_pairs <= a.compared_pairs  # list by list compares only probed lists


def test_a_querys_matches_and_cosines_do_not_depend_on_what_is_searched_beside_it():
    """Each query alone and all of them in one search: the same pairs and bit-identical cosines (a float32
    matrix product's row moves with its batch; the verified cosine is the pair's own), which a rebuild that
    searches only some rows again (--reuse) needs to write a full build's pairs report."""
    corpus, index = planted_embeddings(600, 300, zipf=True, seed=5)
    centroids = kmeans.train_spherical_kmeans(corpus, 64, niter=5)
    search = cluster_lists.ClusterListIndex(index, centroids, THRESHOLD)
    together = search.search(corpus, normalized=True)
    assert len(together) > 20
    for q in np.unique(together.query_rows)[:40]:
        alone = search.search(corpus[q:q + 1], normalized=True)
        mine = together.query_rows == q
        np.testing.assert_array_equal(alone.index_rows, together.index_rows[mine])
        np.testing.assert_array_equal(alone.cosines, together.cosines[mine])


def test_rows_sorted_results_probes_and_counts():
    corpus, index = planted_embeddings(3_000, 1_000, seed=6)
    centroids = kmeans.train_spherical_kmeans(corpus, 4096, niter=5)
    lists = cluster_lists.ClusterListIndex(index, centroids, THRESHOLD)
    found = lists.search(corpus)
    order = np.lexsort((found.index_rows, found.query_rows))
    np.testing.assert_array_equal(order, np.arange(len(found)))
    assert found.probed_lists == int(lists.probes(l2_normalize(corpus)).sum())
    assert len(found) <= found.compared_pairs <= len(corpus) * len(index)
    list_by_list = cluster_lists.ClusterListIndex(index, centroids, THRESHOLD, call_overhead=0).search(corpus)
    assert list_by_list.compared_pairs < len(corpus) * len(index) / 2
    assert lists.num_rows == len(index)


def test_zero_rows_empty_inputs_and_errors():
    rng = np.random.default_rng(7)
    centroids = l2_normalize(rng.standard_normal((20, 16)))
    index = l2_normalize(rng.standard_normal((50, 16)))
    index[3] = 0.0
    lists = cluster_lists.ClusterListIndex(index, centroids, 0.9)
    assert lists.num_rows == 49 and 3 not in lists.row_ids.tolist()
    queries = np.concatenate([index[:10], np.zeros((1, 16), np.float32)])
    found = lists.search(queries)
    assert _pairs(found) >= {(i, i) for i in range(10) if i != 3}
    assert 10 not in found.query_rows.tolist()  # a zero query matches nothing
    assert len(lists.search(np.zeros((0, 16), np.float32))) == 0
    empty = cluster_lists.ClusterListIndex(np.zeros((0, 16), np.float32), centroids, 0.9)
    assert empty.num_rows == 0 and len(empty.search(index)) == 0
    with pytest.raises(ValueError):
        lists.search(np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError):
        cluster_lists.ClusterListIndex(index, centroids, 1.0)
    with pytest.raises(ValueError):
        cluster_lists.ClusterListIndex(index[:, :8], centroids, 0.9)


def test_threshold_is_exclusive():
    x = l2_normalize(np.array([[1.0, 0.0, 0.0]], np.float32))
    angle = np.arccos(0.9)
    y = l2_normalize(np.array([[np.cos(angle), np.sin(angle), 0.0]], np.float32))
    cosine = float((x @ y.T)[0, 0])
    at = cluster_lists.ClusterListIndex(y, x, cosine)
    just_below = cluster_lists.ClusterListIndex(y, x, float(np.nextafter(np.float32(cosine), np.float32(0))))
    assert len(at.search(x, normalized=True)) == 0
    assert len(just_below.search(x, normalized=True)) == 1


def test_pickle_round_trip_searches_the_same():
    corpus, index = planted_embeddings(3_000, 1_000, seed=8)
    centroids = kmeans.train_spherical_kmeans(corpus, 4096, niter=5)
    lists = cluster_lists.ClusterListIndex(index, centroids, THRESHOLD)
    copy = pickle.loads(pickle.dumps(lists))
    a, b = lists.search(corpus), copy.search(corpus)
    assert len(a) > 10
    np.testing.assert_array_equal(a.query_rows, b.query_rows)
    np.testing.assert_array_equal(a.index_rows, b.index_rows)


def test_exhaustive_reference_matches_plain_products():
    rng = np.random.default_rng(9)
    q = l2_normalize(rng.standard_normal((40, 4)))
    x = l2_normalize(rng.standard_normal((30, 4)))
    ref = cluster_lists.exhaustive_pairs(q, x, 0.8)
    sims = q @ x.T
    assert _pairs(ref) == set(zip(*[a.tolist() for a in np.nonzero(sims > 0.8)]))


def test_a_pair_across_a_list_boundary_on_a_circle():
    """Row x at theta/2 from its centroid c1; query q almost theta further on, nearer c2, which lies almost 2 theta from x.

    The pair is a near-duplicate although q's nearest list (c2) is not x's;
    the search must probe x's list from q all the same.
    """
    theta = float(np.arccos(THRESHOLD))
    eps = 1e-3 * theta

    def point(angle):
        return np.array([[np.cos(angle), np.sin(angle), 0.0]], np.float32)

    a = theta / 2
    x, q = point(a), point(a + theta - eps)
    centroids = np.concatenate([point(0.0), point(a + 2 * theta - 2 * eps), point(np.pi)])
    assert float((q @ x.T)[0, 0]) > THRESHOLD
    assert int(np.argmax(x @ centroids.T)) == 0
    assert int(np.argmax(q @ centroids.T)) == 1
    assert _pairs(cluster_lists.ClusterListIndex(x, centroids, THRESHOLD, lists_per_block=1).search(q)) == {(0, 0)}
