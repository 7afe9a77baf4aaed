"""Per-record filter throughput and end-to-end build throughput.

    python -m benchmarks.record_filters --sample out/sample [--repeats 5] [--build] [--json PATH]

Measures, on the JPEG/PNG bytes of a generated sample (``samplegen``):
- header-only checks (``read_header`` + ``check_header``) records/s,
- the first pass's per-record work (``judge_record``: header, text, the
  reduced decode, sha256 and pHash) records/s, and the second pass's stored
  picture (``stored_picture``: the source JPEG as is, or a re-encode),
- with ``--build``: the whole Beam job on the sample, in-process and with two
  worker processes (taking turns), records/s (input rows / wall time,
  including start-up).
Medians over ``--repeats`` runs; one core for the pure functions. Writes
``benchmarks/results/record_filters.json`` (``benchmarks.record``).
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import statistics
import tempfile

import pyarrow.parquet as pq

from benchmarks import harness, record
from common.schema import Candidate, make_key
from filters import image as image_rules
from filters.presets import get_preset
from filters.record import judge_record


def load_candidates(sample_dir: str, limit: int):
    out = []
    for path in sorted(glob.glob(os.path.join(sample_dir, "candidates", "*.parquet"))):
        table = pq.read_table(path)
        if "caption" not in table.column_names:
            continue
        for row in table.to_pylist():
            if row["jpg"] and row["caption"] is not None:
                out.append(Candidate(make_key(row["url"], row["caption"]), row["url"], row["caption"], bytes(row["jpg"])))
            if len(out) >= limit:
                return out
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", required=True)
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/record_filters.json)")
    args = parser.parse_args()
    run = record.Run()
    preset = get_preset("align")
    candidates = load_candidates(args.sample, args.limit)
    n = len(candidates)

    def headers():
        for c in candidates:
            header, reason = image_rules.read_header(c.image, preset)
            if header:
                image_rules.check_header(header, preset)

    def full():
        for c in candidates:
            judge_record(c, preset)

    def stored():
        for c in candidates:
            header, reason = image_rules.read_header(c.image, preset)
            if header:
                image_rules.stored_picture(c.image, header, preset)

    results = {"records": n, "loadavg_before": record.load()[0]}
    for name, fn, repeats in [("header_only", headers, args.repeats), ("full_per_record", full, max(1, args.repeats // 2)),
                              ("stored_picture", stored, max(1, args.repeats // 2))]:
        # Median wall and CPU seconds: on a shared machine CPU time is the stable one.
        timing = harness.timed(fn, repeats)
        results[f"{name}_records_per_s"] = n / timing.wall_s
        results[f"{name}_records_per_cpu_s"] = n / timing.cpu_s
    results["header_vs_full_ratio_cpu"] = results["header_only_records_per_cpu_s"] / results["full_per_record_records_per_cpu_s"]

    if args.build:
        from pipeline.build import launcher

        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in glob.glob(os.path.join(args.sample, "candidates", "*.parquet")))
        modes = {"in_process": [], "two_workers": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]}

        def build(extra):
            with tempfile.TemporaryDirectory() as tmp, harness.Timer() as timer:
                launcher.run(harness.sample_build_args(args.sample, os.path.join(tmp, "c"), eval_images=False) + extra)
            return timer.wall_s

        walls = harness.interleaved({label: functools.partial(build, extra) for label, extra in modes.items()},
                                    max(1, args.repeats // 2))
        for label, times in walls.items():
            results[f"build_{label}_records_per_s"] = rows / statistics.median(times)
            results[f"build_{label}_seconds"] = statistics.median(times)
        results["build_rows"] = rows
    results = {k: round(v, 2) if isinstance(v, float) else v for k, v in results.items()}
    print(json.dumps(results, indent=1))
    run.write("record_filters", results, args.json)


if __name__ == "__main__":
    main()
