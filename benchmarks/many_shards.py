"""A build of one record per shard: peak memory as the shard count grows.

    python -m benchmarks.photo_candidates --out S --num_candidates 103000 --longer_side 216,240 --aspect 1,1.05
    python -m benchmarks.many_shards --input small10k='S10/*.parquet' --input small103k='S/*.parquet' \
        [--max_records_per_shard 1,2000]

Each input is built by ``pipeline.build --preset align --set
max_records_per_shard=N --set validation_fraction=0`` (in process, the
runner the README uses) for each N; with N = 1 every written record is a
shard of its own and the build's shard count is its record count. The
writers keep one open shard per split and file, so peak memory should not
follow the shard count: the same input at N = 1 and N = 2000 should peak
alike (the in-process runner's own buffers of light rows grow with the
input, whatever N). The figures are wall and CPU seconds, the peak resident
size (``VmHWM``) of the build's process, the shards and records the
committed version lists, and the largest number of records in a shard
(checked against N). The build's outputs are deleted after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from benchmarks import harness, record


def _shards(corpus: str) -> dict:
    """Shard count, records and the largest shard of the committed version, from the shard lists it carries."""
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


def build(name: str, pattern: str, per_shard: int) -> dict:
    out = tempfile.mkdtemp(prefix="many-shards-")
    corpus = os.path.join(out, "corpus")
    argv = ["--input", pattern, "--output", corpus, "--preset", "align",
            "--set", f"max_records_per_shard={per_shard}", "--set", "validation_fraction=0"]
    try:
        run = harness.run_build(argv, out, markers=(b"pipeline.build",))
        shards = _shards(corpus)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"input": name, "max_records_per_shard": per_shard, "wall_s": round(run["wall_s"], 1),
            "cpu_s": round(run["cpu_s"], 1), "peak_rss_mb": round(run["driver_kb"] / 1024, 1), **shards}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", required=True, help="NAME=GLOB of Parquet candidates")
    parser.add_argument("--max_records_per_shard", default="1", help="comma-separated values to build each input with")
    parser.add_argument("--json", default="", help="where to write the figures (default benchmarks/results/many_shards.json)")
    args = parser.parse_args(argv)
    inputs = []
    for spec in args.input:
        name, _, pattern = spec.partition("=")
        if not name or not pattern:
            raise SystemExit(f"error: --input {spec}: expected NAME=GLOB")
        inputs.append((name, pattern))
    try:
        bounds = [int(v) for v in args.max_records_per_shard.split(",")]
    except ValueError:
        raise SystemExit("error: --max_records_per_shard: comma-separated integers (e.g. 1,2000)") from None
    if not bounds or min(bounds) < 1:
        raise SystemExit("error: --max_records_per_shard: each value at least 1")
    run = record.Run()
    figures = []
    for name, pattern in inputs:
        for per_shard in bounds:
            result = build(name, pattern, per_shard)
            figures.append(result)
            print(f"{name} at {per_shard} per shard: {result['records']:,} records in {result['shards']:,} "
                  f"shards (largest {result['largest_shard_records']}), {result['wall_s']} s wall, "
                  f"{result['cpu_s']} CPU-s, peak {result['peak_rss_mb']} MB", flush=True)
    if any(f["largest_shard_records"] > f["max_records_per_shard"] for f in figures):
        print("error: a shard holds more than max_records_per_shard records", file=sys.stderr)
        return 1
    run.write("many_shards", figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
