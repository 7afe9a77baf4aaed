"""k-means centroids and top-n assignment (dedup.kmeans)."""

import pickle

import numpy as np
import pytest

from common.vectors import l2_normalize
from dedup import kmeans


def _blobs(n, dim=16, centers=8, spread=0.05, seed=0):
    rng = np.random.default_rng(seed)
    c = l2_normalize(rng.standard_normal((centers, dim)))
    labels = rng.integers(0, centers, n)
    x = c[labels] + spread * rng.standard_normal((n, dim)).astype(np.float32)
    return l2_normalize(x), c, labels


def test_effective_num_clusters_rule():
    assert kmeans.effective_num_clusters(4096, 250_000) == 4096
    assert kmeans.effective_num_clusters(4096, 39 * 4096) == 4096
    assert kmeans.effective_num_clusters(4096, 39 * 4096 - 1) == 4095
    assert kmeans.effective_num_clusters(4096, 20_000) == 20_000 // 39
    assert kmeans.effective_num_clusters(4096, 77) == 1
    assert kmeans.effective_num_clusters(4096, 0) == 1
    with pytest.raises(ValueError):
        kmeans.effective_num_clusters(0, 100)


def test_sample_priority_is_a_deterministic_hash_of_the_key():
    assert kmeans.sample_priority("abc") == kmeans.sample_priority("abc")
    assert kmeans.sample_priority("abc") != kmeans.sample_priority("abd")
    assert kmeans.sample_priority("abc", seed=1) != kmeans.sample_priority("abc", seed=2)
    assert 0 <= kmeans.sample_priority("x") < 2**64


def test_sample_bound_draws_sample_size_rows_on_average():
    assert kmeans.sample_bound(10, 250_000) == kmeans.sample_bound(250_000, 250_000) == 1 << 64
    n, size = 100_000, 10_000
    bound = kmeans.sample_bound(n, size)
    drawn = sum(kmeans.sample_priority(f"key{i}") < bound for i in range(n))
    # Binomial(n, 0.1): standard deviation ~95; 5 sigma.
    assert abs(drawn - size) < 475
    with pytest.raises(ValueError):
        kmeans.sample_bound(10, 0)


def test_centroids_are_unit_vectors_near_the_true_centers():
    x, centers, _ = _blobs(8 * 200)
    # Twice as many centroids as blobs: Lloyd from a random start can leave a
    # centroid between two blobs when K equals their number.
    c = kmeans.train_spherical_kmeans(x, num_clusters=16, niter=20)
    assert c.shape == (16, 16) and c.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, atol=1e-5)
    # Every true center has a centroid within a small angle.
    assert (centers @ c.T).max(axis=1).min() > 0.99


def test_num_clusters_clamped_on_small_samples():
    x, _, _ = _blobs(39 * 5 + 3)
    assert kmeans.train_spherical_kmeans(x, num_clusters=4096, niter=5).shape == (5, 16)
    one = kmeans.train_spherical_kmeans(x[:50], num_clusters=4096)
    assert one.shape == (1, 16)
    assert kmeans.train_spherical_kmeans(np.zeros((0, 16), np.float32), 4096).shape == (0, 16)


def test_training_from_a_sample_ignores_its_order():
    x, _, _ = _blobs(600)
    sample = [kmeans.sample_element(f"k{i}", v) for i, v in enumerate(x)]
    a = kmeans.train_from_sample(sample, num_clusters=8, niter=10)
    b = kmeans.train_from_sample(list(reversed(sample)), num_clusters=8, niter=10)
    np.testing.assert_array_equal(a, b)
    assert kmeans.train_from_sample([], num_clusters=8).shape[0] == 0


def test_top_clusters_match_brute_force_and_batching():
    x, _, _ = _blobs(500, spread=0.3)
    c = kmeans.train_spherical_kmeans(x, num_clusters=12, niter=5)
    assigner = kmeans.CentroidAssigner(c)
    ids, scores = assigner.top_clusters(x * 3.0, 4, with_scores=True)  # scale does not matter
    sims = x @ c.T
    expected = np.argsort(-sims, axis=1)[:, :4]
    # Same sets (order may differ only on exact ties, which random data lacks).
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_allclose(scores / 3.0, np.take_along_axis(sims, expected, 1), rtol=1e-5, atol=1e-5)
    one_by_one = np.concatenate([assigner.top_clusters(x[i : i + 1], 4) for i in range(0, 500, 50)])
    np.testing.assert_array_equal(one_by_one, ids[::50])
    # n larger than K is capped; empty batches work; pickling drops the faiss index.
    assert assigner.top_clusters(x[:3], 50).shape == (3, 12)
    assert assigner.top_clusters(np.zeros((0, 16), np.float32), 4).shape == (0, 4)
    clone = pickle.loads(pickle.dumps(assigner))
    np.testing.assert_array_equal(clone.top_clusters(x, 4), ids)
    with pytest.raises(ValueError):
        assigner.top_clusters(np.zeros((2, 5), np.float32), 4)


def test_thin_centroids_keeps_large_clusters_and_a_minimum_angle():
    rng = np.random.default_rng(3)
    base = l2_normalize(rng.standard_normal((6, 16)))
    # Centroid 1 is a near copy of 0, 3 of 2; 2 is the bigger of that pair.
    near = lambda v: l2_normalize(v + 0.01 * rng.standard_normal(16).astype(np.float32))[0]
    c = np.stack([base[0], near(base[0][None]), base[2], near(base[2][None]), base[4], base[5]])
    sizes = np.array([10, 5, 1, 7, 3, 3])
    kept = kmeans.thin_centroids(c, sizes, merge_cosine=0.99)
    np.testing.assert_allclose(kept, l2_normalize(c[[0, 3, 4, 5]]), rtol=1e-6)
    sims = kept @ kept.T
    assert (sims[~np.eye(len(kept), dtype=bool)] <= 0.99).all()
    # Nothing is close: nothing is dropped.
    np.testing.assert_allclose(kmeans.thin_centroids(base, np.ones(6), 0.99), base, rtol=1e-6)
    assert abs(kmeans.merge_cosine_for(0.975) - np.cos(2 / 3 * np.arccos(0.975))) < 1e-9
    assert kmeans.merge_cosine_for(0.975) > 0.975
