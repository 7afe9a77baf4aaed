"""Synthetic embeddings with planted near-duplicates, for tests and benchmarks.

Real corpora cluster unevenly; these blob mixtures on the unit sphere (with
optional Zipf-skewed blob sizes) exercise the bucket scheme where it is
weakest, and the planted copies put pairs on both sides of the threshold.
"""

import numpy as np

from common.vectors import l2_normalize


def planted_embeddings(n_corpus, n_index, dim=64, blobs=1000, zipf=False, seed=0):
    """Blob mixture on the sphere (uniform or Zipf blob sizes, mixed tightness) with planted copies.

    A quarter of the index rows get a corpus copy at an angle drawn uniformly
    in [0, 20] degrees (cosine 0.94..1), so pairs fall on both sides of a
    0.975 threshold. Tight blobs add natural near-duplicates; under Zipf the
    largest blob holds about a quarter of all rows.
    """
    rng = np.random.default_rng(seed)
    centers = l2_normalize(rng.standard_normal((blobs, dim)))
    weights = 1.0 / np.arange(1, blobs + 1) ** 1.2 if zipf else np.ones(blobs)
    spread = rng.uniform(0.15, 0.6, blobs).astype(np.float32)

    def draw(n):
        g = rng.choice(blobs, n, p=weights / weights.sum())
        noise = rng.standard_normal((n, dim)).astype(np.float32) / np.sqrt(dim)
        return l2_normalize(centers[g] + spread[g, None] * noise)

    corpus, index = draw(n_corpus), draw(n_index)
    planted = n_index // 4
    src = rng.choice(n_index, planted, replace=False)
    dst = rng.choice(n_corpus, planted, replace=False)
    angle = np.deg2rad(rng.uniform(0, 20, planted)).astype(np.float32)
    corpus[dst] = at_angle(rng, index[src], angle)
    return l2_normalize(corpus), index


def at_angle(rng, y, angle):
    """Unit vectors at ``angle`` radians from unit vectors ``y`` ([D] or [N, D]), each in a random direction."""
    y = np.asarray(y, np.float32)
    noise = rng.standard_normal(y.shape).astype(np.float32)
    noise = noise - (noise * y).sum(-1, keepdims=True) * y
    noise /= np.linalg.norm(noise, axis=-1, keepdims=True)
    angle = np.asarray(angle, np.float32)[..., None] if y.ndim > 1 else angle
    return np.cos(angle) * y + np.sin(angle) * noise
