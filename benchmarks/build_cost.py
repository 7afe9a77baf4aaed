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
import sys
import tempfile

from benchmarks import harness, record


def build_once(size: int, work: str) -> dict:
    sample = os.path.join(work, f"sample{size}")
    harness.make_sample(sample, size)
    args = harness.sample_build_args(sample, os.path.join(work, f"corpus{size}"))
    args += ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    build = harness.run_command([sys.executable, "-m", "pipeline.build", *args], check=True, capture_output=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    funnel = harness.funnel(os.path.join(work, f"corpus{size}"))
    cpu, wall = build.cpu_s, build.wall_s
    return {"num_candidates_arg": size, "input": funnel["input"], "written": sum(funnel["written"].values()),
            "cpu_s": round(cpu, 1), "wall_s": round(wall, 1), "cpu_ms_per_candidate": round(1000 * cpu / funnel["input"], 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="400,3000", help="two or more samplegen --num_candidates values")
    parser.add_argument("--json", default="", help="default benchmarks/results/build_cost.json")
    args = parser.parse_args(argv)
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
