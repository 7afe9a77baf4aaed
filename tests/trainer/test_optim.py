"""LAMB chain: masks, trust ratio, weight decay and the warmup/decay schedule."""

import jax
import ml_collections
import numpy as np
import optax

from trainer import models, optim


def config(**optim_overrides):
    c = ml_collections.ConfigDict()
    c.total_steps = 100
    c.optim = ml_collections.ConfigDict(dict(
        name="lamb", peak_lr=1e-2, warmup_steps=10, weight_decay=0.1, b1=0.9, b2=0.999, eps=1e-6,
        grad_clip_norm=None))
    c.optim.update(optim_overrides)
    return c


def toy_params():
    rng = np.random.default_rng(0)
    return {
        "dense": {"kernel": rng.normal(size=(4, 3)).astype(np.float32),
                  "bias": rng.normal(size=(3,)).astype(np.float32)},
        "norm": {"scale": np.ones((3,), np.float32), "bias": np.zeros((3,), np.float32)},
        "log_temperature": np.float32(0.0),
    }


def test_decay_mask_on_the_real_model():
    model = models.build(
        dict(name="two_tower", embed_dim=16, image=dict(variant="tiny"), text=dict(size="tiny")),
        vocab_size=50)
    shapes = jax.eval_shape(lambda: model.init(
        jax.random.key(0), np.zeros((1, 32, 32, 3), np.float32), np.ones((1, 8), np.int32)))
    mask = optim.decay_mask(shapes["params"])
    flat = {jax.tree_util.keystr(path): value
            for path, value in jax.tree_util.tree_leaves_with_path(mask)}
    assert flat["['log_temperature']"] is False
    decayed = [k for k, v in flat.items() if v]
    excluded = [k for k, v in flat.items() if not v]
    assert all(k.endswith(("['kernel']", "['embedding']", "['position_embedding']")) for k in decayed)
    assert all(k.endswith(("['bias']", "['scale']", "['log_temperature']")) for k in excluded)
    # Every norm scale, every bias and the temperature are excluded; kernels are not.
    assert any("BatchNorm" in k or "_norm" in k for k in excluded)
    assert any("depthwise" in k for k in decayed) and any("token_embedding" in k for k in decayed)


def test_schedule_warmup_then_linear_decay_to_zero():
    schedule = optim.warmup_linear_decay(1e-3, 10, 110)
    np.testing.assert_allclose([float(schedule(s)) for s in (0, 5, 10, 60, 110)],
                               [0.0, 5e-4, 1e-3, 5e-4, 0.0], atol=1e-9)


def test_masked_leaves_get_plain_adam_and_weights_get_lamb():
    params = toy_params()
    rng = np.random.default_rng(1)
    grads = jax.tree.map(lambda p: rng.normal(size=np.shape(p)).astype(np.float32), params)
    tx, schedule = optim.make(config(), params)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(3):   # a few steps so the Adam moments are not trivial
        updates, state = update(grads, state, params)
    lr = float(schedule(2))

    adam = optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-6)
    adam_state = adam.init(params)
    adam_update = jax.jit(adam.update)
    for _ in range(3):
        adam_updates, adam_state = adam_update(grads, adam_state, params)

    # Excluded leaves: exactly -lr * adam (no decay, no trust ratio).
    for path in (("dense", "bias"), ("norm", "scale"), ("norm", "bias"), ("log_temperature",)):
        got, want = updates, adam_updates
        for key in path:
            got, want = got[key], want[key]
        np.testing.assert_allclose(got, -lr * np.asarray(want), rtol=1e-5, atol=1e-9)

    # Weights: -lr * trust_ratio * (adam + wd * w), trust = ||w|| / ||adam + wd * w||.
    w = params["dense"]["kernel"]
    direction = np.asarray(adam_updates["dense"]["kernel"]) + 0.1 * w
    trust = np.linalg.norm(w) / np.linalg.norm(direction)
    np.testing.assert_allclose(updates["dense"]["kernel"], -lr * trust * direction, rtol=1e-5)
    # The trust ratio makes the step size relative to the weight norm.
    np.testing.assert_allclose(np.linalg.norm(updates["dense"]["kernel"]), lr * np.linalg.norm(w),
                               rtol=1e-5)


def test_gradient_clipping_is_optional():
    params = toy_params()
    huge = jax.tree.map(lambda p: 1e6 * np.ones(np.shape(p), np.float32), params)
    # A large Adam epsilon makes the update depend on the gradient's scale:
    # unclipped, |g| >> eps gives steps of ~lr; clipped to norm 1, steps shrink.
    clipped, _ = optim.make(config(grad_clip_norm=1.0, eps=1.0, warmup_steps=0), params)
    unclipped, _ = optim.make(config(eps=1.0, warmup_steps=0), params)
    u_clipped, _ = jax.jit(clipped.update)(huge, clipped.init(params), params)
    u_plain, _ = jax.jit(unclipped.update)(huge, unclipped.init(params), params)
    leaves = 3 * 4 + 3 + 3 + 3 + 1
    g = 1.0 / np.sqrt(leaves)           # every clipped gradient entry
    ratio = np.asarray(u_clipped["norm"]["bias"]) / np.asarray(u_plain["norm"]["bias"])
    np.testing.assert_allclose(ratio, (g / (g + 1.0)) / (1e6 / (1e6 + 1.0)), rtol=1e-4)


def test_lamb_decreases_a_quadratic():
    target = toy_params()
    params = jax.tree.map(lambda p: np.zeros_like(p), target)
    params["dense"]["kernel"] = np.full((4, 3), 0.5, np.float32)   # trust ratio needs |w| > 0
    tx, _ = optim.make(config(weight_decay=0.0, peak_lr=0.05, warmup_steps=0), params)
    state = tx.init(params)
    update = jax.jit(tx.update)
    distance = lambda p: sum(float(np.sum((np.asarray(a) - b) ** 2))  # noqa: E731
                             for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(target)))
    start = distance(params)
    for _ in range(40):
        grads = jax.tree.map(lambda p, t: 2 * (p - t), params, target)
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    assert distance(params) < 0.2 * start


def test_adam_option_drops_only_the_trust_ratio():
    params = toy_params()
    grads = jax.tree.map(lambda p: np.full(np.shape(p), 0.5, np.float32), params)
    tx, schedule = optim.make(config(name="adam", warmup_steps=0), params)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    adam_updates, _ = optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-6).update(
        grads, optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-6).init(params))
    lr = float(schedule(0))
    w = params["dense"]["kernel"]
    np.testing.assert_allclose(updates["dense"]["kernel"],
                               -lr * (np.asarray(adam_updates["dense"]["kernel"]) + 0.1 * w), rtol=1e-5)
    np.testing.assert_allclose(updates["norm"]["scale"], -lr * np.asarray(adam_updates["norm"]["scale"]),
                               rtol=1e-5)
    try:
        optim.make(config(name="sgd"), params)
    except ValueError as error:
        assert "unknown optimizer" in str(error)
    else:
        raise AssertionError("an unknown optimizer name must be refused")
