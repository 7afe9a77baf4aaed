r"""What feature-cached accumulation trades: memory per device against step time, same global batch.

For each config and each K in ``--accumulation``, runs the real trainer
(``benchmarks.helpers.training.measure``: the input pipeline from JPEG
shards, the jitted step, the host checks) for a few steps at one global
batch with ``accumulation_steps=K``, and reports

* the compiled step's memory per device (XLA's memory analysis, which the
  trainer writes to ``metrics.jsonl`` as ``memory/*`` at its first step):
  ``peak`` = arguments + outputs - donated + temporaries; ``temp`` is the
  part that holds activations, gradients and the cached embeddings;
* the median step time after the compiling step, as pairs/s of wall clock
  and pairs per CPU-second of this process.

    python -m benchmarks.accumulation [--configs tiny,b3_bert_mini] [--accumulation 1,2,4,8]
        [--batch tiny=64] [--batch b3_bert_mini=8] [--steps 6] [--set b3_bert_mini:compute_dtype=float32]

On an accelerator the same command measures that device (the trainer uses
whatever JAX's default backend is); ``--batch NAME=B`` sets the global
batch, so the largest batch that fits per chip is found by raising B until
the first step fails to allocate.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os

from benchmarks import record
from benchmarks.helpers.training import corpus_for, measure

DEFAULT_BATCH = {"tiny": 64, "b3_bert_mini": 8}
MIB = 2 ** 20


def parse_value(text: str):
    """A ``--set`` value as the config field's type would take it: int, float, bool or string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def flop_counts(config, vocab_size: int) -> dict:
    """XLA's FLOP counts (of the lowered programs, before optimisation) of one forward pass
    of the towers and of the one-pass loss and gradients, at the config's global batch.

    Accumulation runs the one-pass work plus one more forward pass (the cache pass), so its
    compute per step is ``step + forward``; nothing is compiled or run here.
    """
    import jax
    import jax.numpy as jnp

    from trainer import accumulate, loss, models
    from trainer.configs import compute_dtype

    model = models.build(config.model, vocab_size=vocab_size, dtype=compute_dtype(config))
    shape = lambda n: {"image": jax.ShapeDtypeStruct((n, config.image_size, config.image_size, 3), jnp.float32),  # noqa: E731
                       "text": jax.ShapeDtypeStruct((n, config.max_text_len), jnp.int32)}
    rng = jax.random.key(0)
    variables = jax.eval_shape(lambda b: model.init({"params": rng, "dropout": rng}, b["image"], b["text"]), shape(2))
    params, stats = variables["params"], variables.get("batch_stats", {})

    def forward(params, stats, batch):
        (zimg, ztxt, _), _ = model.apply({"params": params, "batch_stats": stats}, batch["image"], batch["text"],
                                         train=True, mutable=["batch_stats"], rngs={"dropout": rng})
        return zimg, ztxt

    one_pass = accumulate.loss_and_grads(model, loss.contrastive_loss)
    count = lambda fn, *args: float(jax.jit(fn).lower(*args).cost_analysis()["flops"])  # noqa: E731
    batch = shape(config.batch_size)
    return {"flops_forward": count(forward, params, stats, batch),
            "flops_one_pass_step": count(one_pass, params, stats, batch, rng)}


def conv_gradient_in_loop(repeats: int = 3) -> dict:
    """CPU-seconds of a 3x3 convolution's weight gradient over 2 micro-batches, unrolled and in ``lax.scan``.

    XLA:CPU leaves a convolution's weight gradient inside a loop body in a slow generic form
    (outside one, it is rewritten for its fast convolution kernels), which is what the CPU
    step times of K > 1 pay; accelerators' compilers do not have this gap.
    """
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 32, 32, 32)).astype(np.float32))
    w = jnp.full((3, 3, 32, 32), 0.01, jnp.float32)

    def weight_grad(w, x):
        conv = lambda w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",  # noqa: E731
                                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.grad(lambda w: jnp.sum(conv(w) ** 2))(w)

    def cpu_seconds(fn):
        compiled = jax.jit(fn).lower(w, x).compile()
        jax.block_until_ready(compiled(w, x))
        start = time.process_time()
        for _ in range(repeats):
            jax.block_until_ready(compiled(w, x))
        return (time.process_time() - start) / repeats

    return {"unrolled_cpu_s": cpu_seconds(lambda w, x: sum(weight_grad(w, x[i]) for i in range(2))),
            "scan_cpu_s": cpu_seconds(lambda w, x: jax.lax.scan(
                lambda total, xi: (total + weight_grad(w, xi), None), jnp.zeros_like(w), x)[0])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="tiny,b3_bert_mini")
    parser.add_argument("--accumulation", default="1,2,4,8", help="values of accumulation_steps")
    parser.add_argument("--steps", type=int, default=6, help="timed steps after the first")
    parser.add_argument("--batch", action="append", default=[], help="NAME=B global batch")
    parser.add_argument("--set", action="append", default=[], help="NAME:FIELD=VALUE config override")
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/accumulation.json)")
    args = parser.parse_args(argv)
    run = record.Run()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    batches = dict(DEFAULT_BATCH, **{k: int(v) for k, v in (b.split("=") for b in args.batch)})
    overrides = {}
    for item in args.set:
        name, assignment = item.split(":", 1)
        field, value = assignment.split("=", 1)
        overrides.setdefault(name, {})[field] = parse_value(value)

    results, flops = [], {}
    for name in args.configs.split(","):
        config = importlib.import_module(f"trainer.configs.{name}").get_config()
        config.update(overrides.get(name, {}))
        data_dir = corpus_for(config, batches[name])
        config.batch_size = batches[name]
        with open(os.path.join(data_dir, "vocab.txt")) as f:
            flops[name] = flop_counts(config, vocab_size=sum(1 for _ in f))
        print(json.dumps({"config": name, **flops[name]}), flush=True)
        for steps in (int(k) for k in args.accumulation.split(",")):
            result = measure(name, batches[name], args.steps, data_dir,
                             overrides={**overrides.get(name, {}), "accumulation_steps": steps},
                             run_name=f"{name}_k{steps}")
            result.update(accumulation_steps=steps, compute_dtype=config.compute_dtype)
            results.append(result)
            print(json.dumps(result), flush=True)

    print(f"\nmachine: {os.cpu_count()} cores, {record.cpu_model()}, "
          f"load average {' '.join(f'{x:.1f}' for x in record.load())}")
    print("| config | compute | global batch | K | micro-batch | peak MiB/device | temp MiB | "
          "median step (s) | pairs/s | pairs per CPU-s | CPU-s per step / K=1's |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    one_pass = {r["config"]: r for r in results if r["accumulation_steps"] == 1}
    for r in results:
        base = one_pass.get(r["config"])
        ratio = f"{r['median_step_cpu_s'] / base['median_step_cpu_s']:.2f}" if base else "-"
        print(f"| {r['config']} | {r['compute_dtype']} | {r['batch']} | {r['accumulation_steps']} | "
              f"{r['batch'] // r['accumulation_steps']} | {r.get('memory/peak_bytes', float('nan')) / MIB:,.1f} | "
              f"{r.get('memory/temp_bytes', float('nan')) / MIB:,.1f} | {r['median_step_s']:.3f} | "
              f"{r['pairs_per_s']:.2f} | {r['pairs_per_cpu_s']:.2f} | {ratio} |")
    print("\nXLA's FLOP counts per global batch (the lowered programs): forward F, one-pass step S; "
          "accumulation computes S + F")
    print("| config | global batch | forward F (GFLOP) | one-pass step S (GFLOP) | S / F | (S + F) / S |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, f in flops.items():
        forward, step = f["flops_forward"], f["flops_one_pass_step"]
        print(f"| {name} | {batches[name]} | {forward / 1e9:,.2f} | {step / 1e9:,.2f} | {step / forward:.2f} | "
              f"{(step + forward) / step:.2f} |")
    loop = conv_gradient_in_loop()
    print(f"\nXLA:CPU, a 3x3 convolution's weight gradient over 2 micro-batches: unrolled "
          f"{loop['unrolled_cpu_s']:.3f} CPU-s, in lax.scan {loop['scan_cpu_s']:.3f} CPU-s")
    run.write("accumulation", {"configs": results, "flops": flops, "conv_gradient_in_loop": loop}, args.json)


if __name__ == "__main__":
    main()
