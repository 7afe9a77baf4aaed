"""The NSFW stage's share of a default build's CPU: photographs and the sample, built with the stage and without.

    python -m benchmarks.nsfw_build_cost [--photos 2000] [--sample 3000] [--repeats 3] [--workers]

Inputs: ``benchmarks.photo_candidates`` photographs (400-800 px, the
``align`` preset) and the ``samplegen`` sample (built as the demo builds it:
``align`` with the sample's overrides and its evaluation set). Each is built
with the default NSFW stage ("on": the precision the machine chooses, named
in the funnel's note) and with ``nsfw_threshold=1.0`` ("off": no scorer
loaded), in turns (on, off, on, off ...: ``harness.interleaved``), in process
(FnApiRunner); ``--workers`` adds two worker processes
(``--direct_running_mode=multi_processing --direct_num_workers=2``, as each
Dataflow worker runs an SDK process per core). CPU is user + system of the
build and every process it reaped, medians over the repeats. The stage's
share is (on - off) / on; per scored record it is (on - off) over the
records the stage scored (the histogram of ``stats/distributions.json``), so
it includes what the stage costs beyond the model: loading it once per
process, the image's preparation, the score on the light row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from benchmarks import harness, record
from benchmarks.helpers.images import write_candidates

MODES = {"in process": [], "2 worker processes": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]}
OFF = ["--set", "nsfw_threshold=1.0"]


def read_outcome(output: str) -> dict:
    """Input records, records the stage scored, and the stage's note from a build's stats."""
    from common.corpus_dir import resolve
    from pipeline.funnel.counts import NSFW_MEASURE

    with open(os.path.join(resolve(output), "stats", "distributions.json")) as handle:
        scored = sum(json.load(handle).get(NSFW_MEASURE, {}).get("counts", []))
    funnel = harness.funnel(output)
    return {"input": funnel["input"], "scored": scored, "note": harness.stage_note(funnel, "nsfw")}


def inputs(work: str, photos: int, sample: int) -> dict:
    """``{name: build arguments without --output}`` of the inputs asked for."""
    found = {}
    if photos:
        directory = os.path.join(work, "photos")
        write_candidates(directory, photos, seed=0, rows_per_file=max(1, photos // 5))
        found["photographs"] = ["--input", os.path.join(directory, "*.parquet"), "--preset", "align"]
    if sample:
        directory = os.path.join(work, "sample")
        harness.make_sample(directory, sample)
        args = harness.sample_build_args(directory, "unused")
        at = args.index("--output")
        found["sample"] = args[:at] + args[at + 2:]
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=2000, help="photographs (0: none)")
    parser.add_argument("--sample", type=int, default=3000, help="samplegen --num_candidates (the demo: 3000; 0: none)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", action="store_true", help="also with two worker processes")
    parser.add_argument("--json", default="", help="default benchmarks/results/nsfw_build_cost.json")
    args = parser.parse_args(argv)
    started = record.Run()
    results = {}
    modes = MODES if args.workers else {"in process": []}
    with tempfile.TemporaryDirectory(prefix="nsfw_build_cost_") as work:
        for name, base in inputs(work, args.photos, args.sample).items():
            for mode, extra in modes.items():
                outcomes = {}

                def arm(stage, sets):
                    def go():
                        out = os.path.join(work, "out", f"{name}_{len(outcomes)}_{stage}".replace(" ", "_"))
                        cpu = harness.run_build(base + extra + sets + ["--output", out],
                                                os.path.join(work, "logs"))["cpu_s"]
                        outcomes[out] = read_outcome(out)
                        outcomes[stage] = outcomes[out]
                        return cpu
                    return go

                runs = harness.interleaved({"on": arm("on", []), "off": arm("off", OFF)}, args.repeats,
                                           report=lambda arm_, i, cpu: print(json.dumps(
                                               {"input": name, "mode": mode, "nsfw": arm_, "repeat": i,
                                                "cpu_s": round(cpu, 2)}), flush=True))
                on, off = (sorted(runs[a])[len(runs[a]) // 2] for a in ("on", "off"))
                scored = outcomes["on"]["scored"]
                figures = {"input_records": outcomes["on"]["input"], "scored": scored,
                           "cpu_s_on": round(on, 2), "cpu_s_off": round(off, 2),
                           "share": round((on - off) / on, 3),
                           "cpu_ms_per_scored_record": round(1000 * (on - off) / scored, 1) if scored else None,
                           "runs": runs, "note": outcomes["on"]["note"]}
                results[f"{name}, {mode}"] = figures
                print(json.dumps({"input": name, "mode": mode,
                                  **{k: v for k, v in figures.items() if k != "runs"}}), flush=True)
    started.write("nsfw_build_cost", {"photos": args.photos, "sample": args.sample, "repeats": args.repeats,
                                      "results": results}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
