r"""Training throughput (image-text pairs per second) of the real trainer on CPU.

Runs ``trainer.train.train_and_evaluate`` (input pipeline, jitted train step,
host checks) for a few steps on a synthetic shard directory and reports the
median step time after the first (compiling) step, as pairs/s of wall clock
and pairs per CPU-second of this process (the fairer number on a shared
machine).

    python -m benchmarks.train_throughput [--configs tiny,b3_bert_mini] [--steps 8]
        [--batch b3_bert_mini=8]

Paper-scale configs keep their architecture and image size; only the batch
is lowered to something a CPU can hold (``--batch NAME=B``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os

from benchmarks import record
from benchmarks.helpers.training import corpus_for, measure

DEFAULT_BATCH = {"tiny": 128, "b3_bert_mini": 8}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="tiny,b3_bert_mini")
    parser.add_argument("--steps", type=int, default=8, help="timed steps after the first")
    parser.add_argument("--batch", action="append", default=[], help="NAME=B batch override")
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/train_throughput.json)")
    args = parser.parse_args(argv)
    run = record.Run()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    batches = dict(DEFAULT_BATCH, **{k: int(v) for k, v in (b.split("=") for b in args.batch)})

    results = []
    for name in args.configs.split(","):
        config = importlib.import_module(f"trainer.configs.{name}").get_config()
        data_dir = corpus_for(config, batches[name])
        result = measure(name, batches[name], args.steps, data_dir)
        results.append(result)
        print(json.dumps(result), flush=True)

    print(f"\nmachine: {os.cpu_count()} cores, {record.cpu_model()}, "
          f"load average {' '.join(f'{x:.1f}' for x in record.load())}")
    print("| config | batch | image | text len | median step (s) | pairs/s | "
          "pairs per CPU-s | first run incl. compile (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['config']} | {r['batch']} | {r['image_size']} | {r['max_text_len']} | "
              f"{r['median_step_s']:.3f} | {r['pairs_per_s']:.1f} | {r['pairs_per_cpu_s']:.1f} | "
              f"{r['run_including_compile_s']:.0f} |")
    run.write("train_throughput", {"configs": results}, args.json)


if __name__ == "__main__":
    main()
