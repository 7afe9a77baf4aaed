"""ALIGN's normalised-softmax contrastive loss, with negatives from the global batch.

For L2-normalised image and text embeddings x, y of a batch of N pairs and a
temperature sigma, logits[i, j] = x_i . y_j / sigma and

    L = L_i2t + L_t2i

where L_i2t is the softmax cross-entropy of each image row against all N texts
(target: its own text) and L_t2i the same for each text column. Following the
paper's equations each direction is *averaged* over its N rows and the two
directions are *summed* (so a chance-level model starts near 2 log N).

Label smoothing (ALIGN: 0.1) uses the usual definition (optax.smooth_labels):
target = (1 - a) * one_hot + a / N over the N candidates of a row.

``contrastive_loss`` is a plain function of the *global* [N, D] arrays. Called
inside ``jax.jit`` on arrays sharded over the ``data`` mesh axis, the compiler
turns ``zimg @ ztxt.T`` into all-gathers, so every device's pairs see every
other device's pairs as negatives, exactly like ALIGN's cross-core
concatenation. ``sharded_contrastive_loss`` spells the same thing out with
``jax.shard_map``: gather the other shards' embeddings and compute only the
local rows, which keeps the per-device logits at [N/devices, N] instead of
[N, N]. Both give the same value and gradients (tests/trainer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def _smoothed_cross_entropy(logits, positive_index, label_smoothing):
    """Mean over rows of -sum_j target_j log softmax(logits)_j.

    ``positive_index[r]`` is the column of row r's positive pair.
    """
    n_candidates = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    positive = jnp.take_along_axis(log_probs, positive_index[:, None], axis=-1)[:, 0]
    # target = (1 - a) one_hot + a / C  =>  loss = -(1 - a) lp[pos] - (a / C) sum_j lp[j]
    per_row = (-(1.0 - label_smoothing) * positive
               - (label_smoothing / n_candidates) * jnp.sum(log_probs, axis=-1))
    return per_row


def contrastive_loss(zimg, ztxt, temperature, *, label_smoothing: float = 0.1):
    """Symmetric contrastive loss over the global batch.

    Args:
      zimg: [N, D] L2-normalised image embeddings (global batch).
      ztxt: [N, D] L2-normalised text embeddings; pair i is (zimg[i], ztxt[i]).
      temperature: scalar sigma > 0 (logits are similarities / sigma).
      label_smoothing: ALIGN uses 0.1.

    Returns:
      (loss, metrics): loss = L_i2t + L_t2i (each a mean over N), metrics with
      both directions and the in-batch top-1 accuracies.
    """
    zimg = zimg.astype(jnp.float32)
    ztxt = ztxt.astype(jnp.float32)
    logits = zimg @ ztxt.T / temperature
    labels = jnp.arange(logits.shape[0])
    i2t = jnp.mean(_smoothed_cross_entropy(logits, labels, label_smoothing))
    t2i = jnp.mean(_smoothed_cross_entropy(logits.T, labels, label_smoothing))
    metrics = {
        "loss_i2t": i2t,
        "loss_t2i": t2i,
        "i2t_top1": jnp.mean(jnp.argmax(logits, axis=1) == labels),
        "t2i_top1": jnp.mean(jnp.argmax(logits, axis=0) == labels),
    }
    return i2t + t2i, metrics


def sharded_contrastive_loss(zimg, ztxt, temperature, *, mesh, axis: str = "data",
                             label_smoothing: float = 0.1):
    """Same loss as ``contrastive_loss``, computed as local rows with shard_map.

    Each device all-gathers the other devices' embeddings (the gather's
    transpose, a reduce-scatter, routes the negatives' gradients back) and
    computes the loss rows of its own pairs against the whole global batch.
    """

    def local_rows(zimg_local, ztxt_local, temperature):
        zimg_local = zimg_local.astype(jnp.float32)
        ztxt_local = ztxt_local.astype(jnp.float32)
        zimg_all = jax.lax.all_gather(zimg_local, axis, tiled=True)
        ztxt_all = jax.lax.all_gather(ztxt_local, axis, tiled=True)
        n_local = zimg_local.shape[0]
        n_global = zimg_all.shape[0]
        positives = jax.lax.axis_index(axis) * n_local + jnp.arange(n_local)
        i2t_logits = zimg_local @ ztxt_all.T / temperature      # my images vs all texts
        t2i_logits = ztxt_local @ zimg_all.T / temperature      # my texts vs all images
        i2t = jax.lax.psum(jnp.sum(
            _smoothed_cross_entropy(i2t_logits, positives, label_smoothing)), axis) / n_global
        t2i = jax.lax.psum(jnp.sum(
            _smoothed_cross_entropy(t2i_logits, positives, label_smoothing)), axis) / n_global
        i2t_top1 = jax.lax.psum(jnp.sum(jnp.argmax(i2t_logits, 1) == positives), axis) / n_global
        t2i_top1 = jax.lax.psum(jnp.sum(jnp.argmax(t2i_logits, 1) == positives), axis) / n_global
        metrics = {"loss_i2t": i2t, "loss_t2i": t2i, "i2t_top1": i2t_top1, "t2i_top1": t2i_top1}
        return i2t + t2i, metrics

    fn = jax.shard_map(local_rows, mesh=mesh, in_specs=(P(axis), P(axis), P()),
                       out_specs=(P(), P()))
    return fn(zimg, ztxt, jnp.asarray(temperature, jnp.float32))


def get(name: str):
    """Loss registry: "plain" (let the compiler shard it) or "shard_map"."""
    if name == "plain":
        return contrastive_loss
    if name == "shard_map":
        return sharded_contrastive_loss
    raise ValueError(f"unknown loss implementation {name!r}: use 'plain' or 'shard_map'")
