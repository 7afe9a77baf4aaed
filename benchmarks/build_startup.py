"""What a build costs before its first record: imports, graph construction, runner start-up (a 20-record build).

    python -m benchmarks.build_startup [--rounds 5] [--builds 3] [--json PATH]

Each round runs, interleaved, one process per mode; each process imports the
launcher, then builds the same 20 records ``--builds`` times in process
(model scorers off: ``nsfw_threshold=1.0``; ``vocab_size=0``), and reports
the CPU of its imports and of each build. Modes: ``remembered`` (the
launcher as it runs: ``common.beam_construction`` installed) and ``plain``
(Beam's SDK as shipped). A third process per round runs the command itself,
``python -m pipeline.build`` on the same records, and reports its whole CPU
(the fixed cost a user pays per build). Medians over rounds; the first
in-process build of a process pays Python's first-call costs, the later ones
are the graph and runner alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks import harness, record

RECORDS = 20
FLAGS = ["--set", "vocab_size=0", "--set", "nsfw_threshold=1.0"]

# The child measures itself with nothing imported but the standard library: the harness's own imports would
# be counted out of the launcher's.
CHILD = """
import json, os, resource, shutil, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
start = cpu()
from pipeline.build import launcher
if sys.argv[1] == "plain":
    launcher.beam_construction.install = lambda: None  # Beam's SDK as shipped
imported = cpu() - start
builds = []
for i in range(int(sys.argv[3])):
    out = os.path.join(sys.argv[4], f"out{i}")
    before = cpu()
    launcher.run(["--input", sys.argv[2], "--output", out, *json.loads(sys.argv[5])])
    builds.append(cpu() - before)
    shutil.rmtree(out)
print(json.dumps({"import": imported, "builds": builds}))
"""


def write_records(directory: str) -> str:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    def jpeg(i):
        buffer = io.BytesIO()
        Image.new("RGB", (320, 240), (i * 11 % 256, 90, 160)).save(buffer, "JPEG", quality=90)
        return buffer.getvalue()

    os.makedirs(directory, exist_ok=True)
    table = pa.table({"url": [f"https://e.x/{i}.jpg" for i in range(RECORDS)],
                      "caption": [f"a small test picture number {i} of a blue wall" for i in range(RECORDS)],
                      "jpg": [jpeg(i) for i in range(RECORDS)]})
    pq.write_table(table, os.path.join(directory, "part-0.parquet"))
    return os.path.join(directory, "*.parquet")


def in_process(mode: str, pattern: str, builds: int, work: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, pattern, str(builds), work, json.dumps(FLAGS)],
                          cwd=harness.REPO, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": harness.REPO})
    return json.loads(done.stdout.strip().splitlines()[-1])


def command(pattern: str, work: str) -> float:
    out = os.path.join(work, "command")
    done = harness.run_command([sys.executable, "-m", "pipeline.build", "--input", pattern, "--output", out, *FLAGS],
                               cwd=harness.REPO, capture_output=True, check=True)
    shutil.rmtree(out)
    return done.cpu_s


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--builds", type=int, default=3, help="in-process builds per process")
    parser.add_argument("--json", default="", help="default benchmarks/results/build_startup.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.builds < 2:
        parser.error("--rounds at least 1, --builds at least 2 (the first in-process build is told from the later ones)")
    run = record.Run()
    with tempfile.TemporaryDirectory(prefix="build-startup-") as work:
        pattern = write_records(os.path.join(work, "in"))
        def report(arm, round_, result):
            if arm == "command":
                print(f"round {round_ + 1}/{args.rounds}: command {result:.2f} CPU-s", flush=True)

        found = harness.interleaved({"remembered": lambda: in_process("remembered", pattern, args.builds, work),
                                     "plain": lambda: in_process("plain", pattern, args.builds, work),
                                     "command": lambda: command(pattern, work)}, args.rounds, report)
    median = statistics.median
    summary = {mode: {"import": median(r["import"] for r in found[mode]),
                      "first_build": median(r["builds"][0] for r in found[mode]),
                      "later_builds": median(b for r in found[mode] for b in r["builds"][1:])}
               for mode in ("remembered", "plain")}
    summary["command"] = median(found["command"])
    for mode in ("remembered", "plain"):
        s = summary[mode]
        print(f"{mode:>10}: import {s['import']:.2f}, first build {s['first_build']:.2f}, "
              f"later builds {s['later_builds']:.2f} CPU-s")
    print(f"python -m pipeline.build, whole process: {summary['command']:.2f} CPU-s")
    run.write("build_startup", {"records": RECORDS, "rounds": args.rounds, "builds": args.builds,
                          "summary": summary, "runs": found}, args.json)


if __name__ == "__main__":
    main()
