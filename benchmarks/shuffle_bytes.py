"""Bytes the build moves through shuffles, per shuffle, measured by the runner that runs it.

    python -m benchmarks.shuffle_bytes --input 'S/candidates/*.parquet' [--workers 1] [--json PATH] [-- BUILD FLAGS]

The real build through its real command line, on
``benchmarks.helpers.shuffles.ShuffleMeasuringRunner`` (Beam's FnApiRunner,
counting the encoded bytes every bundle appends to each grouping buffer:
exactly what crosses that shuffle; how, in that module), in process or with
``--workers`` ``multi_processing`` workers. Prints per shuffle its elements,
bytes per element and bytes per input candidate (the funnel's input count),
heaviest first.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from benchmarks import record
from benchmarks.helpers.shuffles import measured_build


def main(argv=None) -> None:
    from common import console

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="glob of the build's input (Parquet candidates)")
    parser.add_argument("--workers", type=int, default=1, help="1: in process; more: multi_processing workers")
    parser.add_argument("--json", default="", help="default benchmarks/results/shuffle_bytes.json")
    parser.add_argument("build_flags", nargs="*", help="more flags for pipeline.build (after --)")
    args = parser.parse_args(argv)
    run = record.Run()
    log = console.route_library_output("shuffle_bytes")
    with tempfile.TemporaryDirectory(prefix="shuffle-bytes-") as out:
        build_argv = ["--input", args.input, "--output", os.path.join(out, "corpus"), "--preset", "align",
                      *args.build_flags]
        if args.workers > 1:
            build_argv += ["--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"]
        funnel, shuffles = measured_build(build_argv)
    print(shuffles.describe(sorted(shuffles.shuffles, key=lambda s: -s.bytes)))
    print(f"{len(shuffles.shuffles)} shuffles, {shuffles.total_bytes / shuffles.candidates:,.0f} bytes per candidate "
          f"over {shuffles.candidates:,} candidates ({sum(funnel['written'].values()):,} written; log {log})",
          flush=True)
    run.write("shuffle_bytes", {"workers": args.workers, **shuffles.to_json()}, args.json)


if __name__ == "__main__":
    sys.exit(main())
