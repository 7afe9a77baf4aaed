"""Negatives span all devices: sharded loss and gradients equal the single-device ones.

JAX fixes its device count at import, so the checks run in a subprocess with
8 simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``):
this file is also that subprocess's script (``python test_sharded_loss.py
CHECK``), which prints its measurements as JSON for the tests to assert on.
"""

import json
import os
import sys

import pytest

from tests.trainer import on_devices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = 8


def run_check(name: str) -> dict:
    return on_devices.run_check(__file__, name, DEVICES)


def test_loss_and_gradients_sharded_equal_single_device():
    r = run_check("loss")
    assert r["devices"] == DEVICES and r["shard_rows"] == r["batch"] // DEVICES
    assert r["loss_rel_diff"] < 1e-5
    assert r["grad_zimg_max_diff"] < 1e-6 and r["grad_ztxt_max_diff"] < 1e-6
    assert r["grad_log_t_rel_diff"] < 1e-5
    # shard_map variant (all-gather + local rows) equals the plain function.
    assert r["shard_map_loss_rel_diff"] < 1e-5
    assert r["shard_map_grad_max_diff"] < 1e-6
    # Sanity: a per-device loss (negatives only from the local shard) is very
    # different, so the checks above would catch local-only negatives.
    assert r["local_only_loss_diff"] > 0.5
    # The gradient reaches every row from every device: the gradient for a row
    # on device 0 depends on texts that live on device 7.
    assert r["cross_device_grad_norm"] > 1e-4


@pytest.mark.slow
def test_full_train_gradients_sharded_equal_single_device():
    """Whole two-tower model (BatchNorm over the global batch) + loss."""
    r = run_check("model")
    assert r["loss_rel_diff"] < 1e-5
    assert r["grad_rel_diff"] < 1e-5 and r["max_leaf_diff"] < 1e-5
    assert r["batch_stats_max_diff"] < 1e-5


# ---------------------------------------------------------------------------
# The subprocess side.
# ---------------------------------------------------------------------------


def _check_loss():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from trainer import loss

    n, d = 32, 16
    mesh = jax.make_mesh((DEVICES,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)
    zimg = rng.normal(size=(n, d)).astype(np.float32)
    ztxt = (zimg + rng.normal(size=(n, d))).astype(np.float32)
    zimg /= np.linalg.norm(zimg, axis=1, keepdims=True)
    ztxt /= np.linalg.norm(ztxt, axis=1, keepdims=True)
    log_t = np.float32(np.log(0.1))

    def plain(a, b, t):
        return loss.contrastive_loss(a, b, jnp.exp(t), label_smoothing=0.1)[0]

    def with_shard_map(a, b, t):
        return loss.sharded_contrastive_loss(a, b, jnp.exp(t), mesh=mesh, label_smoothing=0.1)[0]

    grad_all = lambda f: jax.value_and_grad(f, argnums=(0, 1, 2))  # noqa: E731
    single_device = jax.devices()[0]
    single = jax.jit(grad_all(plain))(*jax.device_put((zimg, ztxt, log_t), single_device))

    rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    sharded_inputs = (jax.device_put(zimg, rows), jax.device_put(ztxt, rows),
                      jax.device_put(log_t, whole))
    shard_rows = sharded_inputs[0].sharding.shard_shape(sharded_inputs[0].shape)[0]
    sharded = jax.jit(grad_all(plain), in_shardings=(rows, rows, whole))(*sharded_inputs)
    mapped = jax.jit(grad_all(with_shard_map), in_shardings=(rows, rows, whole))(*sharded_inputs)
    assert len(sharded[1][0].sharding.device_set) == DEVICES

    local = np.mean([float(plain(zimg[i:i + shard_rows], ztxt[i:i + shard_rows], log_t))
                     for i in range(0, n, shard_rows)])
    # d loss / d zimg[0] through the texts on the last device only.
    cross = jax.grad(lambda b: plain(zimg, b, log_t))(ztxt)[-shard_rows:]

    def rel(a, b):
        return float(abs(float(a) - float(b)) / max(abs(float(b)), 1e-12))

    def max_diff(a, b):
        return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))

    (v1, (gi1, gt1, gl1)), (v2, (gi2, gt2, gl2)), (v3, (gi3, gt3, gl3)) = single, sharded, mapped
    return {
        "devices": jax.device_count(), "batch": n, "shard_rows": int(shard_rows),
        "loss_rel_diff": rel(v2, v1), "grad_zimg_max_diff": max_diff(gi2, gi1),
        "grad_ztxt_max_diff": max_diff(gt2, gt1), "grad_log_t_rel_diff": rel(gl2, gl1),
        "shard_map_loss_rel_diff": rel(v3, v1),
        "shard_map_grad_max_diff": max(max_diff(gi3, gi1), max_diff(gt3, gt1),
                                       abs(float(gl3) - float(gl1))),
        "local_only_loss_diff": abs(local - float(v1)),
        "cross_device_grad_norm": float(np.linalg.norm(np.asarray(cross))),
    }


def _check_model():
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from trainer import loss, models

    n = 16
    mesh = jax.make_mesh((DEVICES,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    # No dropout: the comparison needs the same function on both sides.
    model = models.build(dict(name="two_tower", embed_dim=16,
                              image=dict(variant="tiny", dropout=0.0, drop_path=0.0),
                              text=dict(size="tiny", max_len=8, dropout=0.0)), vocab_size=30)
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (n, 32, 32, 3)).astype(np.float32)
    texts = rng.integers(1, 30, (n, 8)).astype(np.int32)
    texts[:, 5:] = 0
    variables = jax.jit(lambda: model.init(jax.random.key(0, impl="rbg"), images[:2], texts[:2]))()
    variables = jax.device_get(variables)

    def loss_fn(params, batch_stats, images, texts):
        (zimg, ztxt, out), new_state = model.apply(
            {"params": params, "batch_stats": batch_stats}, images, texts, train=True,
            mutable=["batch_stats"])
        value, _ = loss.contrastive_loss(zimg, ztxt, out["temperature"])
        return value, new_state["batch_stats"]

    step = jax.value_and_grad(loss_fn, has_aux=True)
    args = (variables["params"], variables["batch_stats"], images, texts)
    single = jax.jit(step)(*jax.device_put(args, jax.devices()[0]))
    rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    shardings = (whole, whole, rows, rows)
    sharded = jax.jit(step, in_shardings=shardings)(*jax.device_put(args, shardings))

    (v1, stats1), g1 = jax.device_get(single)
    (v2, stats2), g2 = jax.device_get(sharded)
    # Relative to the whole gradient: some leaves have a mathematically zero
    # gradient (a bias right before another BatchNorm) and are pure float noise.
    global_norm = np.sqrt(sum(np.sum(a ** 2) for a in jax.tree.leaves(g1)))
    leaf_diffs = [float(np.linalg.norm(a - b) / global_norm)
                  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2))]
    global_diff = float(np.sqrt(sum(d ** 2 for d in leaf_diffs)))
    stats_diff = max(float(np.max(np.abs(a - b)))
                     for a, b in zip(jax.tree.leaves(stats1), jax.tree.leaves(stats2)))
    return {"loss_rel_diff": float(abs(v1 - v2) / abs(v1)), "grad_rel_diff": global_diff,
            "max_leaf_diff": max(leaf_diffs), "batch_stats_max_diff": stats_diff}


if __name__ == "__main__":
    check = {"loss": _check_loss, "model": _check_model}[sys.argv[1]]
    print(json.dumps(check()))
