"""CPU per scored image of the NSFW stage inside the build: the sample built with the stage and without it.

    python -m benchmarks.nsfw_build_cost --sample S

``S`` is a sample of ``python -m samplegen`` (made with ``--num_candidates``
when absent). It is built as the demo builds it (``align`` with the
sample's overrides and its evaluation set) four times: with the default
NSFW stage and with ``nsfw_threshold=1.0`` (the stage off: no scorer
loaded), each in process (FnApiRunner) and with two worker processes
(``--direct_running_mode=multi_processing --direct_num_workers=2``, as
each Dataflow worker runs an SDK process per core). CPU is user + system of
the build and every process it reaped; per scored image it is the
difference between the two builds of a mode over the records the stage
scored (the histogram of ``stats/distributions.json``), so it includes
what the stage costs beyond the model: loading it once per process, the
image's preparation, the score on the light row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from benchmarks import harness, record

MODES = {"in process": [], "2 worker processes": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]}


def build(sample: str, output: str, extra) -> dict:
    args = harness.sample_build_args(sample, output) + list(extra)
    done = harness.run_command([sys.executable, "-m", "pipeline.build", *args], check=True, capture_output=True,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    from common.corpus_dir import resolve
    from pipeline.funnel.counts import NSFW_MEASURE

    stats = os.path.join(resolve(output), "stats")
    with open(os.path.join(stats, "funnel.json")) as handle:
        funnel = json.load(handle)
    with open(os.path.join(stats, "distributions.json")) as handle:
        scored = sum(json.load(handle).get(NSFW_MEASURE, {}).get("counts", []))
    return {"input": funnel["input"], "scored": scored, **done.cost(1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", required=True, help="a samplegen output directory (made when absent)")
    parser.add_argument("--num_candidates", type=int, default=3000, help="samplegen's, when it makes the sample")
    parser.add_argument("--json", default="", help="default benchmarks/results/nsfw_build_cost.json")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.sample, "sample_info.json")):
        harness.make_sample(args.sample, args.num_candidates)
    started = record.Run()
    modes = {}
    with tempfile.TemporaryDirectory(prefix="nsfw_build_cost_") as work:
        for mode, extra in MODES.items():
            runs = {}
            for stage, sets in (("on", []), ("off", ["--set", "nsfw_threshold=1.0"])):
                runs[stage] = build(args.sample, os.path.join(work, f"{len(modes)}{stage}"), [*extra, *sets])
                runs[stage]["load_after"] = record.load()
                print(json.dumps({"mode": mode, "nsfw": stage, **runs[stage]}), flush=True)
            scored = runs["on"]["scored"]
            per_image = 1000 * (runs["on"]["cpu_s"] - runs["off"]["cpu_s"]) / scored if scored else None
            modes[mode] = {**runs, "cpu_ms_per_scored_image": None if per_image is None else round(per_image, 1)}
            print(json.dumps({"mode": mode, "cpu_ms_per_scored_image": modes[mode]["cpu_ms_per_scored_image"]}),
                  flush=True)
    started.write("nsfw_build_cost", {"sample": os.path.basename(os.path.normpath(args.sample)), "modes": modes},
                  args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
