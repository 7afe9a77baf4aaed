"""Does Beam's local multi-process runner lose elements? A minimal reproduction, without this project's code.

    python -m benchmarks.multiprocess_loss [--records 1000000] [--hot 100000] [--runs 4] [--workers 2]

Each run generates ``--records`` key/value pairs on the workers (from 64
spans, so the job graph stays small), ``--hot`` of them under one key and
the rest under keys of their own, as a build's repeated (url, alt-text) pair
does; then counts them three ways in one job: a ``CombinePerKey`` summed per
key, a ``Flatten`` with an empty branch counted globally, and a
``GroupByKey`` whose groups are measured. Every count must equal
``--records``. Runs on ``FnApiRunner`` with
``--direct_running_mode=multi_processing --direct_num_workers=N`` (and
``in_memory`` for comparison with ``--in_memory``). Prints each run's
counts and exits 1 if any run lost or invented elements, so that the next
Beam version can be checked with one command; ``--json`` records the runs
(``benchmarks.record``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

SPANS = 64


def _records(span, records: int, hot: int):
    start, end = span
    for i in range(start, end):
        yield ("hot" if i < hot else f"key{i}"), 1


def _write(count, path):
    with open(path, "w") as handle:
        handle.write(str(count))


def run_once(records: int, hot: int, workers: int, in_memory: bool) -> dict:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    mode = "in_memory" if in_memory else "multi_processing"
    options = PipelineOptions(["--runner=FnApiRunner", f"--direct_running_mode={mode}",
                               f"--direct_num_workers={workers}"])
    step = -(-records // SPANS)
    spans = [(i, min(i + step, records)) for i in range(0, records, step)]
    out = tempfile.mkdtemp(prefix="multiprocess-loss-")
    started = time.perf_counter()
    with beam.Pipeline(options=options) as p:
        pairs = (p | "Spans" >> beam.Create(spans) | "Spread" >> beam.Reshuffle()
                 | "Records" >> beam.FlatMap(_records, records, hot))
        _ = (pairs | "PerKey" >> beam.CombinePerKey(sum) | "Values" >> beam.Values()
             | "SumPerKey" >> beam.CombineGlobally(sum) | "WritePerKey" >> beam.Map(_write, f"{out}/per_key"))
        empty = p | "Empty" >> beam.Create([])
        _ = ((pairs, empty) | "Flatten" >> beam.Flatten() | "CountFlattened" >> beam.combiners.Count.Globally()
             | "WriteFlattened" >> beam.Map(_write, f"{out}/flattened"))
        _ = (pairs | "Group" >> beam.GroupByKey() | "GroupSizes" >> beam.MapTuple(lambda _, values: len(list(values)))
             | "SumGroups" >> beam.CombineGlobally(sum) | "WriteGrouped" >> beam.Map(_write, f"{out}/grouped"))
    counts = {name: int(open(os.path.join(out, name)).read()) for name in ("per_key", "flattened", "grouped")}
    return {"counts": counts, "lost": {name: records - n for name, n in counts.items()},
            "wall_s": round(time.perf_counter() - started, 1)}


def main(argv=None) -> int:
    from benchmarks import record

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--hot", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--in_memory", action="store_true", help="the in-process runner instead, for comparison")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    run = record.Run()
    import apache_beam

    runs = []
    for index in range(args.runs):
        result = run_once(args.records, args.hot, args.workers, args.in_memory)
        runs.append(result)
        print(f"run {index + 1}: counts {result['counts']}, lost {result['lost']} ({result['wall_s']} s)", flush=True)
    lossy = sum(any(result["lost"].values()) for result in runs)
    print(f"apache-beam {apache_beam.__version__}: {lossy} of {len(runs)} runs lost or invented elements")
    run.write("multiprocess_loss", {"beam": apache_beam.__version__, "records": args.records, "hot": args.hot,
                                    "workers": args.workers, "in_memory": args.in_memory, "runs": runs}, args.json)
    return 1 if lossy else 0


if __name__ == "__main__":
    sys.exit(main())
