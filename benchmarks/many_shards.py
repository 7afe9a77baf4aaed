"""A build of one record per shard: peak memory as the shard count grows.

    python -m benchmarks.photo_candidates --out S --num_candidates 103000 --longer_side 216,240 --aspect 1,1.05
    python -m benchmarks.many_shards --input small10k='S10/*.parquet' --input small103k='S/*.parquet'

Each input is built by ``pipeline.build --preset align --set
max_records_per_shard=1 --set validation_fraction=0`` (in process, the
runner the README uses), so every written record is a shard of its own and
the build's shard count is its record count. The writers keep one open
shard per split and file, so peak memory per process should not follow the
shard count: the figures are wall and CPU seconds, the peak resident size
(``VmHWM``) of the build's process, the shards and records the committed
version lists, and the largest number of records in a shard (1 by
construction, checked). The build's outputs are deleted after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import record
from benchmarks.keyed_joins import WorkerMemory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _shards(corpus: str) -> dict:
    """Shard count, records and the largest shard of the committed version, from the shard lists it carries."""
    sys.path.insert(0, REPO)
    from common.corpus_dir import resolve

    version = resolve(corpus)
    shards, records, largest = 0, 0, 0
    with open(os.path.join(version, "stats", "_shards.json")) as handle:
        listing = json.load(handle)
    for split in listing.values():
        shards += len(split["records"])
        records += sum(split["records"])
        largest = max([largest, *split["records"]])
    return {"shards": shards, "records": records, "largest_shard_records": largest}


def build(name: str, pattern: str) -> dict:
    from common.console import LOG_DIR_ENV

    out = tempfile.mkdtemp(prefix="many-shards-")
    corpus = os.path.join(out, "corpus")
    argv = [sys.executable, "-m", "pipeline.build", "--input", pattern, "--output", corpus, "--preset", "align",
            "--set", "max_records_per_shard=1", "--set", "validation_fraction=0"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", LOG_DIR_ENV: out}
    memory = WorkerMemory(markers=(b"pipeline.build",))
    try:
        cpu_before, start = _children_cpu(), time.perf_counter()
        memory.start()
        process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        _, stderr = process.communicate()
        wall, cpu = time.perf_counter() - start, _children_cpu() - cpu_before
        memory.stop()
        if process.returncode != 0:
            last = stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise SystemExit(f"error: the {name} build failed ({process.returncode}): {last} (log in {out})")
        shards = _shards(corpus)
    finally:
        if memory.is_alive():
            memory.stop()
        shutil.rmtree(out, ignore_errors=True)
    peak_kb = memory.peak_kb.get(process.pid, 0)
    return {"input": name, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "peak_rss_mb": round(peak_kb / 1024, 1), **shards}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", required=True, help="NAME=GLOB of Parquet candidates")
    parser.add_argument("--json", default="", help="where to write the figures (default benchmarks/results/many_shards.json)")
    args = parser.parse_args(argv)
    inputs = []
    for spec in args.input:
        name, _, pattern = spec.partition("=")
        if not name or not pattern:
            raise SystemExit(f"error: --input {spec}: expected NAME=GLOB")
        inputs.append((name, pattern))
    run = record.Run()
    figures = []
    for name, pattern in inputs:
        result = build(name, pattern)
        figures.append(result)
        print(f"{name}: {result['records']:,} records in {result['shards']:,} shards (largest "
              f"{result['largest_shard_records']}), {result['wall_s']} s wall, {result['cpu_s']} CPU-s, "
              f"peak {result['peak_rss_mb']} MB", flush=True)
    if any(f["largest_shard_records"] > 1 for f in figures):
        print("error: a shard holds more than max_records_per_shard records", file=sys.stderr)
        return 1
    run.write("many_shards", figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
