r"""TOnICS ablation on the sample corpus: random minibatches vs TOnICS at equal steps, several seeds.

The paper aligns pre-trained towers; here the "pre-trained towers" are one
ordinary (random-minibatch) run of ``--pretrain-steps``. From its checkpoint
(``config.init_from``), each seed trains two arms for ``--steps`` more steps:
``random`` (TOnICS off) and ``tonics`` (on, refreshing every
``--refresh-every`` steps on 100 held-out pairs with ``--threshold``; alpha
0.9, beta 0.2 as in the paper). Both arms then report held-out retrieval on
the whole validation split, both directions (R@1, R@5).

    python -m samplegen --out S
    python -m pipeline.build --input 'S/candidates/*.parquet' --output C --preset align \
        --set vocab_size=0 --set min_ngram_count=2 --set num_clusters=16 \
        --eval_images sample_eval=S/eval/test --concepts benchmarks/tonics/shapes_ontology.json
    python -m trainer.vocab --data_dir C --vocab_size 2000
    python -m benchmarks.tonics_ablation --corpus C --work W [--seeds 0,1,2] [--steps 150]

Runs are sequential command-line trainings (``python -m trainer.train``);
results go to ``benchmarks/results/tonics_ablation.json`` and a Markdown
table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks import harness, record

KEYS = ("retrieval/i2t_R@1", "retrieval/i2t_R@5", "retrieval/t2i_R@1", "retrieval/t2i_R@5")


def train(workdir: str, corpus: str, cache: str, overrides: list) -> dict:
    """One command-line training run; returns its last metrics (merged over the final step's rows)."""
    if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        print(f"  reusing {workdir}", flush=True)
    else:
        args = [sys.executable, "-m", "trainer.train", "--config", "trainer/configs/tiny.py", "--workdir", workdir,
                f"--config.data_dir={corpus}", f"--config.compilation_cache_dir={cache}",
                "--config.evals.retrieval.every=0", *overrides]
        print("  " + " ".join(args[1:]), flush=True)
        subprocess.run(args, check=True, cwd=harness.REPO, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    last = max(r["step"] for r in rows)
    merged = {}
    for row in rows:
        if row["step"] == last:
            merged.update(row)
    tonics_steps = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith("tonics/steps/"):
                tonics_steps[key[len("tonics/steps/"):]] = tonics_steps.get(key[len("tonics/steps/"):], 0) + value
    merged["node_steps"] = tonics_steps
    return merged


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tonics_ablation")
    parser.add_argument("--corpus", required=True, help="corpus built with --concepts, with vocab.txt")
    parser.add_argument("--work", required=True, help="directory for the runs' workdirs")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--pretrain-steps", type=int, default=150)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--refresh-every", type=int, default=25)
    parser.add_argument("--threshold", type=float, default=0.1)
    parser.add_argument("--loss-directions", default="both", choices=("both", "image_retrieval"))
    parser.add_argument("--json", default="", help="where the results go (default benchmarks/results/tonics_ablation.json)")
    args = parser.parse_args(argv)
    run = record.Run()
    os.makedirs(args.work, exist_ok=True)
    cache = os.path.join(args.work, "jax_cache")
    common = [f"--config.batch_size={args.batch}", f"--config.log_every={args.refresh_every}",
              f"--config.checkpoint_every={args.steps}", f"--config.loss.directions={args.loss_directions}"]
    start = time.time()
    print(f"pretrain: {args.pretrain_steps} steps of random minibatches", flush=True)
    pretrain = os.path.join(args.work, "pretrain")
    train(pretrain, args.corpus, cache, common + [f"--config.total_steps={args.pretrain_steps}", "--config.seed=100",
                                                  f"--config.checkpoint_every={args.pretrain_steps}"])
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in ("random", "tonics"):
            print(f"seed {seed}, {arm}", flush=True)
            overrides = common + [f"--config.total_steps={args.steps}", f"--config.seed={seed}",
                                  f"--config.init_from={pretrain}", "--config.optim.warmup_steps=10"]
            if arm == "tonics":
                overrides += ["--config.tonics.enabled=true", f"--config.tonics.refresh_every={args.refresh_every}",
                              f"--config.tonics.refresh_threshold={args.threshold}"]
            metrics = train(os.path.join(args.work, f"{arm}-seed{seed}"), args.corpus, cache, overrides)
            runs.append({"seed": seed, "arm": arm, **{k: metrics.get(k) for k in KEYS},
                         "p_root": metrics.get("tonics/p_root"), "refreshes": metrics.get("tonics/refreshes"),
                         "node_steps": metrics["node_steps"]})
    summary = {}
    for arm in ("random", "tonics"):
        mine = [r for r in runs if r["arm"] == arm]
        summary[arm] = {k: (float(np.mean([r[k] for r in mine])), float(np.std([r[k] for r in mine]))) for k in KEYS}
    out = {"args": vars(args), "runs": runs, "summary": summary, "wall_seconds": time.time() - start,
           "chance_R@1": 1 / 163}
    result = run.write("tonics_ablation", out, args.json)
    print("| arm | seed | i2t R@1 | i2t R@5 | t2i R@1 | t2i R@5 | P_S(root) end | refreshes | class steps |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        class_steps = sum(v for k, v in r["node_steps"].items() if k != "root")
        print(f"| {r['arm']} | {r['seed']} | " + " | ".join(f"{r[k]:.3f}" for k in KEYS)
              + f" | {'-' if r['p_root'] is None else format(r['p_root'], '.3f')} | {r['refreshes'] or 0:.0f}"
              + f" | {class_steps:.0f} |")
    for arm, values in summary.items():
        print(f"| {arm} | mean±sd | " + " | ".join(f"{m:.3f}±{s:.3f}" for m, s in values.values()) + " | | | |")
    print(f"results: {result}")


if __name__ == "__main__":
    main()
