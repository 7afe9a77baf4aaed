"""The global batch's contrastive loss and its exact gradients, in one pass or K micro-batches.

``accumulation_steps`` (K) = 1 is the plain step: one forward and backward
pass over the batch each device holds. Its activations grow with the batch,
so the batch a run can use is bounded by the chips' memory; ALIGN's 16,384
pairs need 1,024 TPU cores that way.

K > 1 is feature-cached accumulation (GradCache, Gao et al. 2021; open_clip's
``--accum-freq``). The loss couples every pair with every other, so the
large batch's gradient is not an average of small batches' gradients; but
it depends on the towers' parameters only through the embeddings, and so
factors as

    dL/dtheta = sum_k (d z_k / d theta)^T (dL / d z_k)

over the micro-batches' embeddings z_k. The step therefore

1. embeds the K micro-batches one after another, keeping only the
   embeddings (no gradient is taken, so no activation outlives its
   micro-batch);
2. computes the loss over the whole global batch from those embeddings
   (negatives across every device, label smoothing, the learned
   temperature: the same function as K = 1) and its gradient with respect
   to the embeddings and the temperature;
3. runs each micro-batch forward again, this time under ``jax.vjp``, pulls
   its slice of the embedding gradient back to the parameters, and sums.

Both loops are ``jax.lax.scan``, so one micro-batch's activations are alive
at a time (an unrolled Python loop would let XLA merge the two forward
passes and keep every micro-batch's activations). The cost: a second
forward pass of the towers (a step of forward F and backward ~2F becomes
~4F, ~4/3 of the plain step's compute) and the cached embeddings,
2 x batch x embed_dim floats. The result is the large batch's loss and
gradient, not an approximation (tests/trainer check it on 8 devices
against the one-pass step). Two costs depend on the compiler: XLA:CPU runs
a convolution's weight gradient inside a loop body far slower than outside
one (benchmarks/RESULTS.md), and each micro-batch's recompute ends in the
gradient's all-reduce over the mesh, K per step where XLA does not move it
after the loop (XLA:CPU does not).

Micro-batches on the mesh: micro-batch k is the k-th of K equal blocks of
every device's rows, so it is spread over all devices (and all hosts) like
the batch itself and is sliced without moving data between devices; the
cached embeddings are put back in the batch's own order before the loss,
which therefore sees exactly the arrays (and the sharding) of K = 1. Each
device's rows must split into K blocks: ``trainer.configs.check_layout``.

BatchNorm (``tiny``'s CNN, EfficientNet's ``norm="batch"``) normalises each
micro-batch with its own statistics, over the B/K pairs it spreads across
the devices (ghost batch normalisation); that is the function whose loss and
gradient the step computes exactly. Its running averages take one update per
step, from the recompute pass: every micro-batch starts from the step's old
averages and the new ones are the mean of the K updates, i.e.
``m * old + (1 - m) * mean_k(stat_k)``: the running mean moves by exactly
the global batch's mean, the running variance by the mean of the
micro-batches' variances (what the forward passes normalised with). With
``norm="group"`` (no batch statistics) K changes nothing but float rounding.

Dropout and stochastic depth draw micro-batch k's masks from
``fold_in(step key, k)`` in both passes, so the recompute is the very
function whose embeddings were cached.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from trainer.models import two_tower


def micro_batch(x, k, steps: int, shards: int):
    """Rows of micro-batch ``k``: block ``k`` of ``steps`` equal blocks of each of ``shards`` shards.

    ``x`` is a global [B, ...] array whose rows are split into ``shards``
    contiguous shards (the devices of the ``data`` axis, in order), so the
    slice stays on the devices that hold it.
    """
    blocks = x.reshape(shards, steps, x.shape[0] // (shards * steps), *x.shape[1:])
    return jax.lax.dynamic_index_in_dim(blocks, k, axis=1, keepdims=False).reshape(-1, *x.shape[1:])


def merge_micro_batches(stacked, shards: int):
    """[K, B/K, ...] stacked per-micro-batch rows -> [B, ...] in the global batch's own row order."""
    steps, rows = stacked.shape[:2]
    blocks = stacked.reshape(steps, shards, rows // shards, *stacked.shape[2:])
    return jnp.swapaxes(blocks, 0, 1).reshape(steps * rows, *stacked.shape[2:])


def objective(contrastive_loss: Callable, zimg, ztxt, temperature, *, label_smoothing: float,
              directions: str = "both"):
    """(value, metrics) of the loss the run minimises over the global batch's embeddings."""
    value, metrics = contrastive_loss(zimg, ztxt, temperature, label_smoothing=label_smoothing)
    if directions == "image_retrieval":
        value = metrics["loss_t2i"]   # TOnICS's L_IR: each text retrieves its image
    return value, metrics


def loss_and_grads(model, contrastive_loss: Callable, *, steps: int = 1, shards: int = 1,
                   label_smoothing: float = 0.1, directions: str = "both"):
    """The step's loss and gradients: ``fn(params, batch_stats, batch, rng)``.

    ``fn`` returns ``(value, (batch_stats, metrics, temperature)), grads``,
    ``jax.value_and_grad``'s shape with the updated BatchNorm averages,
    the loss's metrics and the temperature as aux. ``steps`` is K, the
    number of micro-batches; ``shards`` the size of the mesh's ``data`` axis.
    ``batch`` holds global ``image`` and ``text`` arrays.
    """
    loss_of = lambda zimg, ztxt, temperature: objective(  # noqa: E731
        contrastive_loss, zimg, ztxt, temperature, label_smoothing=label_smoothing,
        directions=directions)

    def one_pass(params, batch_stats, batch, rng):
        def loss_fn(params):
            (zimg, ztxt, out), new_model_state = model.apply(
                {"params": params, "batch_stats": batch_stats}, batch["image"], batch["text"],
                train=True, mutable=["batch_stats"], rngs={"dropout": rng})
            value, metrics = loss_of(zimg, ztxt, out["temperature"])
            return value, (new_model_state.get("batch_stats", {}), metrics, out["temperature"])

        return jax.value_and_grad(loss_fn, has_aux=True)(params)

    if steps == 1:
        return one_pass

    def embed(params, batch_stats, batch, k, rng):
        """Micro-batch k's embeddings and BatchNorm averages after its statistics."""
        images, texts = (micro_batch(batch[name], k, steps, shards) for name in ("image", "text"))
        (zimg, ztxt, _), new_model_state = model.apply(
            {"params": params, "batch_stats": batch_stats}, images, texts, train=True,
            mutable=["batch_stats"], rngs={"dropout": jax.random.fold_in(rng, k)})
        return (zimg, ztxt), new_model_state.get("batch_stats", {})

    def accumulated(params, batch_stats, batch, rng):
        # 1. The embeddings alone, one micro-batch at a time.
        def cache(_, k):
            return None, embed(params, batch_stats, batch, k, rng)[0]

        _, (zimg, ztxt) = jax.lax.scan(cache, None, jnp.arange(steps))
        zimg, ztxt = merge_micro_batches(zimg, shards), merge_micro_batches(ztxt, shards)

        # 2. The global batch's loss; its gradient for the embeddings and the temperature.
        def loss_fn(params, zimg, ztxt):
            temperature = model.apply({"params": params}, method=two_tower.TwoTower.temperature)
            value, metrics = loss_of(zimg, ztxt, temperature)
            return value, (metrics, temperature)

        (value, (metrics, temperature)), (grads, dzimg, dztxt) = jax.value_and_grad(
            loss_fn, argnums=(0, 1, 2), has_aux=True)(params, zimg, ztxt)

        # 3. Each micro-batch again, its embeddings' gradient pulled back to the parameters.
        def recompute(carry, k):
            grads, stats = carry
            (_, pullback, new_stats) = jax.vjp(
                lambda p: embed(p, batch_stats, batch, k, rng), params, has_aux=True)
            cotangent = tuple(micro_batch(g, k, steps, shards) for g in (dzimg, dztxt))
            (micro_grads,) = pullback(cotangent)
            return (jax.tree.map(jnp.add, grads, micro_grads), jax.tree.map(jnp.add, stats, new_stats)), None

        zero_stats = jax.tree.map(jnp.zeros_like, batch_stats)
        (grads, stats_sum), _ = jax.lax.scan(recompute, (grads, zero_stats), jnp.arange(steps))
        new_batch_stats = jax.tree.map(lambda s: s / steps, stats_sum)
        return (value, (new_batch_stats, metrics, temperature)), grads

    return accumulated
