"""CPU cost of the whole build per input candidate, for the Dataflow cost estimate (docs/dataflow.md).

    python -m benchmarks.build_cost --sizes 400,3000

For each size, ``python -m samplegen --num_candidates N`` makes the embedded
sample (N ordinary rows plus the ~1,250 planted ones, images of a few
hundred pixels a side), then ``python -m pipeline.build`` builds it as the
demo does (``align`` with the sample's overrides, its evaluation set,
FnApiRunner with ``--direct_running_mode=multi_processing
--direct_num_workers=2``). CPU seconds are the build process's and every
process it reaped (the SDK workers): user + system. The marginal cost
``(cpu_b - cpu_a) / (input_b - input_a)`` between two sizes leaves out what
does not grow with the input (interpreter and Beam start-up, embedding the
evaluation set, k-means on a small sample), so it is the per-candidate
figure that scales to 10^8 candidates.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def build_once(size: int, work: str) -> dict:
    sample = os.path.join(work, f"sample{size}")
    subprocess.run([sys.executable, "-m", "samplegen", "--out", sample, "--num_candidates", str(size), "--seed", "0"],
                   check=True, capture_output=True)
    with open(os.path.join(sample, "sample_info.json")) as handle:
        info = json.load(handle)
    args = ["--input", os.path.join(sample, "candidates", "*.parquet"), "--output", os.path.join(work, f"corpus{size}"),
            "--preset", "align"]
    for override in info.get("build_overrides", []):
        args += ["--set", override]
    name, path = info["eval_images"].split("=", 1)
    args += ["--eval_images", f"{name}={os.path.join(sample, path)}",
             "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    subprocess.run([sys.executable, "-m", "pipeline.build", *args], check=True, capture_output=True,
                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    from common.corpus_dir import resolve

    with open(os.path.join(resolve(os.path.join(work, f"corpus{size}")), "stats", "funnel.json")) as handle:
        funnel = json.load(handle)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"num_candidates_arg": size, "input": funnel["input"], "written": sum(funnel["written"].values()),
            "cpu_s": round(cpu, 1), "wall_s": round(wall, 1), "cpu_ms_per_candidate": round(1000 * cpu / funnel["input"], 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="400,3000", help="two or more samplegen --num_candidates values")
    parser.add_argument("--json", default="", help="default benchmarks/results/build_cost.json")
    args = parser.parse_args(argv)
    from benchmarks import record

    started = record.Run()
    runs = []
    with tempfile.TemporaryDirectory(prefix="build_cost_") as work:
        for size in (int(s) for s in args.sizes.split(",")):
            figures = build_once(size, work)
            figures["load_after"] = record.load()
            print(json.dumps(figures), flush=True)
            runs.append(figures)
    small, large = runs[0], runs[-1]
    marginal = 1000 * (large["cpu_s"] - small["cpu_s"]) / (large["input"] - small["input"])
    summary = {"runs": runs, "marginal_cpu_ms_per_candidate": round(marginal, 2)}
    print(json.dumps({"marginal_cpu_ms_per_candidate": summary["marginal_cpu_ms_per_candidate"]}))
    started.write("build_cost", summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
