"""LAMB with ALIGN's schedule, as an explicit optax chain.

    scale_by_adam -> add_decayed_weights(wd, mask) -> scale_by_trust_ratio (masked)
                  -> scale by -schedule(step)

This is optax.lamb with one difference that matters for this model: optax.lamb
masks only the weight decay, while here the *same* mask also removes the
layer-wise trust ratio from normalisation scales, biases and the temperature.
Those are small or scalar tensors whose norm says nothing about a sensible
step size (the log-temperature starts at exactly 0, which would make its trust
ratio meaningless), so they get plain Adam steps, as in LARS/LAMB practice.

``optim.name = "adam"`` drops the trust ratio (Adam with the same masked
weight decay and schedule): for short runs of small models from scratch,
where Adam's per-element steps move the few-channel layers of a tiny
EfficientNet faster than LAMB's per-layer ones (the tiny config's demo).

Schedule: linear warmup from 0 to the peak over ``warmup_steps`` then linear
decay to 0 at ``total_steps`` (ALIGN: 1e-3, 10k, 1.2M).
"""

from __future__ import annotations

from typing import Optional

import jax
import optax

#: Leaf names that are never decayed nor trust-ratio scaled.
NO_DECAY_NAMES = ("bias", "scale", "log_temperature")


def decay_mask(params):
    """True for weights (kernels, embeddings), False for norm scales, biases, temperature."""

    def is_weight(path, leaf):
        name = path[-1].key if hasattr(path[-1], "key") else str(path[-1])
        return name not in NO_DECAY_NAMES and getattr(leaf, "ndim", 0) > 1

    return jax.tree_util.tree_map_with_path(is_weight, params)


def warmup_linear_decay(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
    warmup_steps = max(0, min(warmup_steps, total_steps))
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup_steps),
         optax.linear_schedule(peak, 0.0, max(1, total_steps - warmup_steps))],
        boundaries=[warmup_steps])


def make(config, params) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Builds the optimizer from ``config.optim`` and ``config.total_steps``.

    Fields of ``config.optim``: name ("lamb" or "adam"), peak_lr,
    warmup_steps, weight_decay, b1, b2, eps, and optional grad_clip_norm (clip
    by global norm first, off by default).
    """
    oc = config.optim
    schedule = warmup_linear_decay(oc.peak_lr, oc.warmup_steps, config.total_steps)
    mask = decay_mask(params)
    clip: Optional[float] = oc.grad_clip_norm
    name = oc.name
    if name not in ("lamb", "adam"):
        raise ValueError(f"unknown optimizer {name!r}: use 'lamb' or 'adam'")
    tx = optax.chain(
        optax.clip_by_global_norm(clip) if clip else optax.identity(),
        optax.scale_by_adam(b1=oc.b1, b2=oc.b2, eps=oc.eps),
        optax.add_decayed_weights(oc.weight_decay, mask),
        optax.masked(optax.scale_by_trust_ratio(), mask) if name == "lamb" else optax.identity(),
        optax.scale_by_learning_rate(schedule),
    )
    return tx, schedule
