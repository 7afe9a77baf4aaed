"""The contrastive loss against an independent NumPy reference, and its basic properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer import loss

# One compilation per shape instead of dozens of op-by-op ones.
contrastive = jax.jit(loss.contrastive_loss, static_argnames=("label_smoothing",))


def numpy_reference(x, y, temperature, label_smoothing):
    """ALIGN's L_i2t + L_t2i, written from the paper's equations in float64."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    n = len(x)
    sims = x @ y.T / temperature
    targets = (1 - label_smoothing) * np.eye(n) + label_smoothing / n

    def softmax_xent(logits):
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return float(np.mean(-(targets * log_softmax).sum(axis=1)))

    return softmax_xent(sims) + softmax_xent(sims.T)


def random_embeddings(seed, n, d):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x + rng.normal(scale=1.5, size=(n, d))).astype(np.float32)  # correlated pairs
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return x, y


@pytest.mark.parametrize("n,d,temperature,smoothing", [
    (8, 4, 1.0, 0.1), (16, 32, 1 / 64, 0.1), (5, 3, 0.3, 0.0), (32, 16, 0.05, 0.5)])
def test_matches_numpy_reference(n, d, temperature, smoothing):
    x, y = random_embeddings(n * d, n, d)
    value, metrics = contrastive(x, y, temperature, label_smoothing=smoothing)
    expected = numpy_reference(x, y, temperature, smoothing)
    np.testing.assert_allclose(float(value), expected, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(float(metrics["loss_i2t"] + metrics["loss_t2i"]), expected, rtol=2e-5)


def test_directions_are_the_two_softmax_axes():
    x, y = random_embeddings(1, 12, 8)
    _, metrics = contrastive(x, y, 0.1)
    _, swapped = contrastive(y, x, 0.1)
    np.testing.assert_allclose(metrics["loss_i2t"], swapped["loss_t2i"], rtol=1e-6)
    np.testing.assert_allclose(metrics["loss_t2i"], swapped["loss_i2t"], rtol=1e-6)


def test_chance_level_and_perfect_alignment():
    n = 16
    # Identical embeddings for all pairs: every row is uniform, loss = 2 log N
    # whatever the smoothing.
    same = np.ones((n, 4), np.float32) / 2.0
    value, _ = contrastive(same, same, 1.0)
    np.testing.assert_allclose(float(value), 2 * np.log(n), rtol=1e-6)
    # Orthonormal pairs at a low temperature: near the smoothing floor, far below chance.
    eye = np.eye(n, dtype=np.float32)
    value, metrics = contrastive(eye, eye, 0.01, label_smoothing=0.0)
    assert float(value) < 1e-6
    assert float(metrics["i2t_top1"]) == 1.0 and float(metrics["t2i_top1"]) == 1.0


def test_label_smoothing_raises_the_floor():
    eye = np.eye(8, dtype=np.float32)
    plain, _ = contrastive(eye, eye, 0.01, label_smoothing=0.0)
    smoothed, _ = contrastive(eye, eye, 0.01, label_smoothing=0.1)
    assert float(smoothed) > float(plain) + 1.0   # smoothing penalises over-confidence


def test_temperature_gradient_matches_reference_finite_difference():
    x, y = random_embeddings(3, 10, 6)

    def loss_of_log_t(log_t):
        return loss.contrastive_loss(x, y, jnp.exp(log_t))[0]

    log_t = np.log(0.2)
    grad = float(jax.jit(jax.grad(loss_of_log_t))(log_t))
    eps = 1e-4
    numeric = (numpy_reference(x, y, np.exp(log_t + eps), 0.1)
               - numpy_reference(x, y, np.exp(log_t - eps), 0.1)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-5)


def test_embedding_gradients_match_reference_finite_difference():
    x, y = random_embeddings(4, 6, 3)
    gx, gy = jax.jit(jax.grad(lambda a, b: loss.contrastive_loss(a, b, 0.5)[0],
                              argnums=(0, 1)))(x, y)
    eps = 1e-3
    for array, grad, which in ((x, gx, 0), (y, gy, 1)):
        for index in [(0, 0), (2, 1), (5, 2)]:
            plus, minus = array.copy(), array.copy()
            plus[index] += eps
            minus[index] -= eps
            args_plus = (plus, y) if which == 0 else (x, plus)
            args_minus = (minus, y) if which == 0 else (x, minus)
            numeric = (numpy_reference(*args_plus, 0.5, 0.1)
                       - numpy_reference(*args_minus, 0.5, 0.1)) / (2 * eps)
            np.testing.assert_allclose(float(grad[index]), numeric, rtol=2e-3, atol=2e-4)


def test_registry():
    assert loss.get("plain") is loss.contrastive_loss
    assert loss.get("shard_map") is loss.sharded_contrastive_loss
    with pytest.raises(ValueError):
        loss.get("nope")
