"""Feature-cached accumulation gives the large batch's loss and gradients, exactly.

The equalities that matter run in a subprocess with simulated CPU devices
(as ``test_sharded_loss.py``: this file is also that subprocess's script;
2 devices in the default run, 8 in the integration run):
K micro-batches on the mesh against one pass over the whole batch on one
device, for both loss implementations; with BatchNorm, against the
gradient of the same ghost-batch function written out by hand. In this
process: the micro-batch layout, bf16 compute, and the trainer end to end
(K = 2 against K = 1, and a SIGTERM-and-resume run against an uninterrupted one:
1 + 1 steps in the default run, 2 + 2 in the integration run).
"""

import json
import os
import signal
import sys

import numpy as np
import pytest

from tests.trainer import on_devices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = 8
PER_DEVICE = 4      # pairs per device: the batch is 4 * devices
BATCH = PER_DEVICE * DEVICES
TOTAL_STEPS = 4
STOP_AFTER = 2


def run_check(name: str, devices: int) -> dict:
    return on_devices.run_check(__file__, name, devices)


@pytest.fixture(scope="module", params=[pytest.param(2, id="2_devices"),
                                        pytest.param(DEVICES, id="8_devices", marks=pytest.mark.integration)])
def sharded(request):
    return run_check("sharded", request.param) | {"asked_devices": request.param}


def test_micro_batches_on_the_devices_equal_one_pass_on_one_device(sharded):
    r = sharded
    assert r["devices"] == r["asked_devices"]
    for case in ("plain_k4", "shard_map_k2"):   # K=4: one pair per device per micro-batch
        assert r[case]["loss_rel_diff"] < 1e-6, case
        assert r[case]["grad_rel_diff"] < 1e-5 and r[case]["max_leaf_diff"] < 1e-5, case
        assert r[case]["log_temperature_grad_rel_diff"] < 1e-5, case
        assert r[case]["metrics_max_diff"] < 1e-5, case
    # The micro-batches are sliced where they lie: no data moves between devices for them.
    assert r["plain_k4"]["all_to_all"] == 0 and r["plain_k4"]["collective_permute"] == 0
    # The check can fail: averaging the micro-batches' own losses (negatives from the
    # micro-batch only) is a different gradient.
    assert r["naive_grad_rel_diff"] > 0.05


def test_batchnorm_micro_batches_are_ghost_batches_with_exact_gradients(sharded):
    r = sharded["batchnorm"]
    # The step's loss and gradients are those of the function it documents:
    # each micro-batch normalised with its own statistics (written out by hand).
    assert r["loss_rel_diff"] < 1e-6
    assert r["grad_rel_diff"] < 1e-5 and r["max_leaf_diff"] < 1e-5
    # Running averages: one update per step, from the mean of the micro-batches' statistics.
    assert r["batch_stats_max_diff"] < 1e-6
    # ... which is not the one-pass function: BatchNorm sees B/K pairs, not B.
    assert r["one_pass_loss_rel_diff"] > 1e-2


def test_micro_batch_takes_block_k_of_every_shard_and_merge_undoes_it():
    from trainer import accumulate

    batch = np.arange(24).reshape(12, 2)         # 3 shards of 4 rows, K = 2
    micro = [np.asarray(accumulate.micro_batch(batch, k, 2, 3)) for k in range(2)]
    np.testing.assert_array_equal(micro[0][:, 0], [0, 2, 8, 10, 16, 18])
    np.testing.assert_array_equal(micro[1][:, 0], [4, 6, 12, 14, 20, 22])
    np.testing.assert_array_equal(accumulate.merge_micro_batches(np.stack(micro), 3), batch)


def _small_model(dtype="float32", norm="group"):
    import jax.numpy as jnp

    from trainer import models

    return models.build(dict(name="two_tower", embed_dim=16, temperature_init=0.1,
                             image=dict(tower="convnet", filters=(8, 16), norm=norm),
                             text=dict(size="tiny", max_len=8, dropout=0.0)),
                        vocab_size=30, dtype=jnp.dtype(dtype))


def _inputs(n=BATCH, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.uniform(-1, 1, (n, 16, 16, 3)).astype(np.float32)
    texts = rng.integers(1, 30, (n, 8)).astype(np.int32)
    texts[:, 5:] = 0
    return {"image": images, "text": texts}


def test_bfloat16_towers_keep_float32_gradients_close_to_float32():
    import jax

    from trainer import accumulate, loss
    from trainer.configs import cpu_fast_compile_options

    batch = _inputs(16)
    f32, bf16 = _small_model("float32"), _small_model("bfloat16")
    jit = lambda fn: jax.jit(fn, compiler_options=cpu_fast_compile_options())  # noqa: E731
    variables = jit(lambda: f32.init(jax.random.key(0, impl="rbg"), batch["image"][:2], batch["text"][:2]))()
    key = jax.random.key(1)
    (v32, _), g32 = jit(accumulate.loss_and_grads(f32, loss.contrastive_loss))(variables["params"], {}, batch, key)
    (v16, (_, metrics, _)), g16 = jit(accumulate.loss_and_grads(bf16, loss.contrastive_loss, steps=2))(
        variables["params"], {}, batch, key)
    assert {x.dtype for x in jax.tree.leaves(g16)} == {np.dtype("float32")}
    assert v16.dtype == metrics["loss_i2t"].dtype == np.float32
    assert abs(float(v16) - float(v32)) < 1e-2 * abs(float(v32))
    flat32 = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g32)])
    flat16 = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g16)])
    cosine = flat16 @ flat32 / (np.linalg.norm(flat16) * np.linalg.norm(flat32))
    assert cosine > 0.99


# ---------------------------------------------------------------------------
# The trainer end to end (one device): K = 2 against K = 1, SIGTERM and resume.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def e2e(tiny_corpus, tmp_path_factory):
    """Config factory for short runs: ``tiny`` at 16 px, batch 8, a 2-layer CNN with GroupNorm
    (batch-independent, so K changes nothing but rounding), one compilation cache. Small
    convolutions: XLA:CPU runs their gradients inside the micro-batch loop ~10x slower."""
    from trainer.configs import tiny

    cache_dir = str(tmp_path_factory.mktemp("jax_cache_accumulation"))

    def config(**overrides):
        c = tiny.get_config()
        c.update(data_dir=tiny_corpus, total_steps=TOTAL_STEPS, batch_size=8, image_size=16, resize_size=18,
                 max_text_len=16, log_every=1, checkpoint_every=100, eval_batch_size=8, evals={},
                 compilation_cache_dir=cache_dir, xla_cpu_fast_compile=True)
        c.model.image.update(norm="group", filters=(8, 16))
        c.update(overrides)
        return c

    return config


def _metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def accumulated_run(e2e, tmp_path_factory):
    from trainer import train

    workdir = str(tmp_path_factory.mktemp("accumulated"))
    final = train.train_and_evaluate(e2e(accumulation_steps=2, evals={"retrieval": {"split": "validation"}}),
                                     workdir)
    return workdir, final


@pytest.mark.slow
def test_the_trainer_with_two_micro_batches_takes_the_one_pass_step(e2e, accumulated_run, tmp_path):
    from trainer import train

    workdir, final = accumulated_run
    assert final["step"] == TOTAL_STEPS and final["retrieval/num_pairs"] == 16.0
    one_pass_dir = str(tmp_path / "one_pass")
    train.train_and_evaluate(e2e(total_steps=1), one_pass_dir)
    first = {m["step"]: m for m in _metrics(workdir) if "train/loss" in m}[1]
    reference = [m for m in _metrics(one_pass_dir) if "train/loss" in m][0]
    for key in ("train/loss", "train/loss_i2t", "train/grad_norm", "train/param_norm"):
        assert first[key] == pytest.approx(reference[key], rel=1e-5), key
    # The run says what its compiled step holds per device.
    memory = [m for m in _metrics(workdir) if "memory/peak_bytes" in m]
    assert len(memory) == 1 and memory[0]["step"] == 1 and memory[0]["memory/temp_bytes"] > 0


@pytest.mark.parametrize("total_steps, stop_after", [
    pytest.param(2, 1, id="light"), pytest.param(TOTAL_STEPS, STOP_AFTER, id="heavy", marks=pytest.mark.integration)])
def test_sigterm_then_resume_with_accumulation_equals_uninterrupted(total_steps, stop_after, e2e, request, tmp_path):
    import jax

    from trainer import checkpoint, train

    if total_steps == TOTAL_STEPS:
        reference_dir, _ = request.getfixturevalue("accumulated_run")
    else:   # light: a reference run of its own, without the evaluator
        reference_dir = str(tmp_path / "reference")
        train.train_and_evaluate(e2e(accumulation_steps=2, total_steps=total_steps), reference_dir)
    workdir = str(tmp_path / "preempted")
    config = e2e(accumulation_steps=2, total_steps=total_steps)

    def preempt(step):
        if step == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)

    first = train.train_and_evaluate(config, workdir, after_step=preempt)
    assert first["preempted"] and first["step"] == stop_after
    second = train.train_and_evaluate(config, workdir)
    assert second["step"] == total_steps and not second["preempted"]
    losses = lambda d: [m["train/loss"] for m in _metrics(d) if "train/loss" in m]  # noqa: E731
    assert losses(workdir) == losses(reference_dir)
    _, want, _ = checkpoint.load_model(reference_dir)
    _, got, _ = checkpoint.load_model(workdir)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=jax.tree_util.keystr(path))


# ---------------------------------------------------------------------------
# The subprocess side.
# ---------------------------------------------------------------------------


def _check_sharded():
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from trainer import accumulate, loss
    from trainer.configs import cpu_fast_compile_options
    from trainer.models import two_tower

    fast = cpu_fast_compile_options()   # LLVM's cheap passes: these programs run once
    devices = jax.device_count()
    mesh = jax.make_mesh((devices,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    batch = _inputs(PER_DEVICE * devices)
    key = jax.random.key(1)
    losses = {"plain": loss.contrastive_loss,
              "shard_map": lambda *a, **k: loss.sharded_contrastive_loss(*a, mesh=mesh, **k)}

    def init(model):   # RngBitGenerator keys: the initialisers compile faster than threefry's
        return jax.device_get(jax.jit(lambda: model.init(
            jax.random.key(0, impl="rbg"), batch["image"][:2], batch["text"][:2]), compiler_options=fast)())

    def on_one_device(fn, *args):
        return jax.device_get(jax.jit(fn, compiler_options=fast)(*jax.device_put(args, jax.devices()[0])))

    def on_mesh(fn, *args, text=False):
        jitted = jax.jit(fn, in_shardings=(whole, whole, rows, whole), compiler_options=fast)
        compiled = jitted.lower(*args).compile()
        return jax.device_get(compiled(*args)), (compiled.as_text() if text else "")

    def compare(reference, got):
        (v1, (_, m1, _)), g1 = reference
        (v2, (_, m2, _)), g2 = got
        # Relative to the whole gradient: some leaves are mathematically zero (float noise).
        norm = np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree.leaves(g1)))
        leaf = [float(np.linalg.norm(a - b) / norm) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2))]
        t1, t2 = float(g1["log_temperature"]), float(g2["log_temperature"])
        return {"loss_rel_diff": float(abs(v2 - v1) / abs(v1)), "grad_rel_diff": float(np.sqrt(np.sum(np.square(leaf)))),
                "max_leaf_diff": max(leaf), "log_temperature_grad_rel_diff": abs(t2 - t1) / abs(t1),
                "metrics_max_diff": max(abs(float(m1[k]) - float(m2[k])) for k in ("loss_i2t", "loss_t2i"))}

    out = {"devices": jax.device_count()}
    variables = init(_small_model(norm="batch"))   # GroupNorm's parameters have the same names and shapes
    model = _small_model()
    params = variables["params"]
    reference = on_one_device(accumulate.loss_and_grads(model, loss.contrastive_loss), params, {}, batch, key)
    for impl, steps in (("plain", 4), ("shard_map", 2)):
        fn = accumulate.loss_and_grads(model, losses[impl], steps=steps, shards=devices)
        got, hlo = on_mesh(fn, params, {}, batch, key, text=True)
        out[f"{impl}_k{steps}"] = dict(compare(reference, got), all_to_all=hlo.count("all-to-all("),
                                       collective_permute=hlo.count("collective-permute("))

    def naive(params):   # the mean of 2 micro-batches' own losses
        micro = [{name: accumulate.micro_batch(x, k, 2, devices) for name, x in batch.items()} for k in range(2)]
        values = [loss.contrastive_loss(*model.apply({"params": params}, m["image"], m["text"], train=True)[:2],
                                        model.apply({"params": params}, method=two_tower.TwoTower.temperature))[0]
                  for m in micro]
        return sum(values) / 2

    naive_grads = on_one_device(jax.grad(naive), params)
    norm = np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree.leaves(reference[1])))
    out["naive_grad_rel_diff"] = float(np.sqrt(sum(np.sum(np.square(a - b)) for a, b in zip(
        jax.tree.leaves(reference[1]), jax.tree.leaves(naive_grads)))) / norm)

    # BatchNorm: K=2 on the mesh against the ghost-batch function written out. Micro-batch 1's
    # images are brighter, so its statistics (and the loss) differ from the whole batch's.
    model = _small_model(norm="batch")
    stats = variables["batch_stats"]
    batch = dict(batch, image=batch["image"] + (np.arange(len(batch["image"])) % PER_DEVICE >= 2)[:, None, None, None])

    def ghost(params, stats, batch, rng):
        def loss_fn(params):
            zimg, ztxt, new_stats = [], [], []
            for k in range(2):
                (zi, zt, _), state = model.apply(
                    {"params": params, "batch_stats": stats},
                    *(accumulate.micro_batch(batch[n], k, 2, devices) for n in ("image", "text")),
                    train=True, mutable=["batch_stats"])
                zimg.append(zi), ztxt.append(zt), new_stats.append(state["batch_stats"])
            temperature = model.apply({"params": params}, method=two_tower.TwoTower.temperature)
            value, metrics = loss.contrastive_loss(accumulate.merge_micro_batches(jax.numpy.stack(zimg), devices),
                                                   accumulate.merge_micro_batches(jax.numpy.stack(ztxt), devices),
                                                   temperature)
            mean_stats = jax.tree.map(lambda a, b: (a + b) / 2, *new_stats)
            return value, (mean_stats, metrics, temperature)

        return jax.value_and_grad(loss_fn, has_aux=True)(params)

    want = on_one_device(ghost, params, stats, batch, key)
    got, _ = on_mesh(accumulate.loss_and_grads(model, loss.contrastive_loss, steps=2, shards=devices),
                     params, stats, batch, key)
    one_pass, _ = on_mesh(accumulate.loss_and_grads(model, loss.contrastive_loss), params, stats, batch, key)
    bn = compare(want, got)
    bn["batch_stats_max_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
        jax.tree.leaves(want[0][1][0]), jax.tree.leaves(got[0][1][0])))
    bn["one_pass_loss_rel_diff"] = float(abs(one_pass[0][0] - got[0][0]) / abs(got[0][0]))
    out["batchnorm"] = bn
    return out


if __name__ == "__main__":
    print(json.dumps({"sharded": _check_sharded}[sys.argv[1]]()))
