"""CPU of writing a selection (``python -m pipeline.select``) against a full rebuild of the same records.

    python -m benchmarks.selection_cost [--photos 2000] [--seed 0] [--repeats 3] [--json PATH]

Input: ``benchmarks.photo_candidates`` photographs (400-800 px, ``--photos``
rows, seed ``--seed``), as Parquet. For each of two settings, NSFW off
(``--set nsfw_threshold=1.0``) and on (the ``align`` preset's open_nsfw at
0.5):

1. build: ``python -m pipeline.build --preset align`` (in one process,
   FnApiRunner); this is also the full rebuild the selection is compared to;
2. select: ``python -m pipeline.select`` of every written record
   (``--where "words >= 0"``): the same records, splits and bytes as the
   build wrote, by the second pass alone, pictures copied from the built
   shards, ``--repeats`` times (the median is the figure);
3. an empty selection (``--where "words < 0"``): what a selection costs
   whatever it selects (interpreter, Beam, reading the table, the commit).

CPU seconds are the command's process and every process it reaped (user +
system, ``RUSAGE_CHILDREN``), one build per setting; the ratio is the
median select / build.
Both include interpreter and Beam start-up (the same for both), so the
ratio of the work alone is lower than the ratio printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchmarks import harness, record
from benchmarks.helpers.images import write_candidates


def timed(argv, env) -> dict:
    done = harness.run_command([sys.executable, *argv], capture_output=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(argv[:2])} failed: {done.stderr.strip()[-500:]}")
    return {"cpu_s": round(done.cpu_s, 2), "wall_s": round(done.wall_s, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="", help="default benchmarks/results/selection_cost.json")
    args = parser.parse_args(argv)
    env = harness.python_env()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = {"command": "python -m benchmarks.selection_cost " + " ".join(sys.argv[1:] if argv is None else argv),
               "commit": commit, "machine": f"{record.cpu_model()}, {os.cpu_count()} cores", "photos": args.photos,
               "seed": args.seed,
               "load_before": record.load()[0], "settings": {}}
    with tempfile.TemporaryDirectory() as work:
        write_candidates(os.path.join(work, "in"), args.photos, args.seed)
        pattern = os.path.join(work, "in", "*.parquet")
        for setting, extra in (("nsfw_off", ["--set", "nsfw_threshold=1.0"]), ("nsfw_on", [])):
            corpus, selection = os.path.join(work, f"corpus_{setting}"), os.path.join(work, f"select_{setting}")
            build = timed(["-m", "pipeline.build", "--input", pattern, "--output", corpus, "--preset", "align",
                           *extra], env)
            selects = [timed(["-m", "pipeline.select", corpus, "--output", f"{selection}{i}", "--where", "words >= 0"],
                             env) for i in range(args.repeats)]
            select = sorted(selects, key=lambda t: t["cpu_s"])[len(selects) // 2]
            empty = timed(["-m", "pipeline.select", corpus, "--output", f"{selection}_none", "--where", "words < 0"],
                          env)
            selection = f"{selection}0"
            built, chosen = harness.funnel(corpus), harness.funnel(selection)
            results["settings"][setting] = {
                "input": built["input"], "written": sum(built["written"].values()),
                "selected_written": sum(chosen["written"].values()), "build": build, "select": select,
                "select_runs_cpu_s": [t["cpu_s"] for t in selects], "empty_select": empty,
                "ratio": round(select["cpu_s"] / build["cpu_s"], 3)}
            print(setting, json.dumps(results["settings"][setting]), flush=True)
    results["load_after"] = record.load()[0]
    path = args.json or os.path.join(record.RESULTS_DIR, "selection_cost.json")
    with open(path, "w") as handle:
        json.dump(results, handle, indent=1, sort_keys=True)
    print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
