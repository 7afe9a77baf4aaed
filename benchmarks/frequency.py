"""Throughput and memory of ApplyCorpusFilters against the in-memory reference.

    python -m benchmarks.frequency                       # 10k, 30k, 100k rows, 3 repeats
    python -m benchmarks.frequency --sizes 10000 --repeats 1 --modes reference,inmemory

Synthetic text rows: alt-texts of 3-20 words drawn from a Zipf(1.1) law over
200k word types (so the n-gram table grows with the corpus, as real alt-text
does), 2% re-encoded image copies, 1% boilerplate texts shared by many
images, 15% extra texts of records rejected earlier (they count n-grams only).
The ALIGN preset with ``vocab_size`` = a tenth of the distinct n-grams, so the
vocabulary join does real work.

Every (mode, size, repeat) runs in a fresh process, so peak RSS
(``getrusage``) is that run's own; per size the modes take turns, repeat
after repeat. Modes:

- ``multi``: FnApiRunner, ``direct_running_mode=multi_processing``,
  ``direct_num_workers=2`` (the 2 cores). Peak memory is the driver's plus the
  largest worker's (getrusage reports the largest child).
- ``inmemory``: FnApiRunner, one process.
- ``reference``: ``tests/filters/reference.py`` in one process.

The timed part is reading the inputs from files, filtering and writing the
rejected keys (Beam: ReadFromText -> ApplyCorpusFilters -> WriteToText,
including pipeline construction); generating the data is not timed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import harness, record

REPO = harness.REPO
MODES = ("multi", "inmemory", "reference")
BOILERPLATE = ["alt img", "image may contain", "click to enlarge", "product photo", "1920x1080"]


def synthetic_corpus(num_candidates: int, seed: int = 0, word_types: int = 200_000):
    """``(survivors, counted_only)``: ``num_candidates`` rows, about 85% survivors.

    ``counted_only`` are the rows a per-record stage rejected, which the raw
    counting base still counts (``filters.frequency``).
    """
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, word_types + 1)
    p = 1.0 / ranks**1.1
    p /= p.sum()
    lengths = rng.integers(3, 21, size=num_candidates)
    words = rng.choice(word_types, size=int(lengths.sum()), p=p)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    texts = [" ".join(f"w{w}" for w in words[starts[i]:starts[i + 1]]) for i in range(num_candidates)]
    roll = rng.random(num_candidates)
    survivors, counted_only = [], []
    for i, text in enumerate(texts):
        if roll[i] < 0.01:
            text = BOILERPLATE[i % len(BOILERPLATE)]
        sha = f"{rng.integers(2**63):016x}" * 4
        phash = sha[:16]
        if roll[i] > 0.85:
            counted_only.append((f"k{i:08d}", sha, phash, text))  # rejected by a per-record stage
            continue
        if roll[i] > 0.83 and survivors:
            phash = survivors[int(rng.integers(len(survivors)))][2]  # a re-encoded copy
        survivors.append((f"k{i:08d}", sha, phash, text))
    return survivors, counted_only


def write_inputs(survivors, counted_only, directory):
    for name, rows in (("survivors", survivors), ("counted_only", counted_only)):
        with open(os.path.join(directory, f"{name}.jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def preset_for(survivors, counted_only):
    from filters.presets import get_preset
    from filters.text import ngrams

    distinct = set()
    for row in survivors + counted_only:
        distinct.update(ngrams(row[3]))
    return get_preset("align", vocab_size=len(distinct) // 10)


def run_beam(directory, preset, mode, transform_kw=None):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from filters.frequency import ApplyCorpusFilters

    if mode == "multi":
        options = PipelineOptions(direct_num_workers=2, direct_running_mode="multi_processing")
    else:
        options = PipelineOptions()
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        read = {
            name: p | f"Read{name}" >> beam.io.ReadFromText(os.path.join(directory, f"{name}.jsonl"))
            | f"Parse{name}" >> beam.Map(json.loads)
            for name in ("survivors", "counted_only")
        }
        read = {name: rows | f"AsTuple{name}" >> beam.Map(tuple) for name, rows in read.items()}
        out = read | ApplyCorpusFilters(preset, **(transform_kw or {}))
        (out["rejected"] | beam.Map(json.dumps)
         | beam.io.WriteToText(os.path.join(directory, "out", "rejected")))


def run_reference(directory, preset):
    from tests.filters import reference

    with open(os.path.join(directory, "survivors.jsonl")) as f:
        survivors = [tuple(json.loads(line)) for line in f]
    with open(os.path.join(directory, "counted_only.jsonl")) as f:
        counted_only = [tuple(json.loads(line)) for line in f]
    rejected, _ = reference.corpus_filters(survivors, counted_only, preset)
    os.makedirs(os.path.join(directory, "out"), exist_ok=True)
    with open(os.path.join(directory, "out", "rejected-reference"), "w") as f:
        for item in rejected.items():
            f.write(json.dumps(item) + "\n")


def one_run(mode, size, seed, transform_kw):
    """Child process: generate (untimed), run one mode (timed), print JSON."""
    survivors, counted_only = synthetic_corpus(size, seed)
    preset = preset_for(survivors, counted_only)
    with tempfile.TemporaryDirectory() as directory:
        write_inputs(survivors, counted_only, directory)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with harness.Timer() as timer:
            if mode == "reference":
                run_reference(directory, preset)
            else:
                run_beam(directory, preset, mode, transform_kw)
        out_dir = os.path.join(directory, "out")
        rejected = sum(sum(1 for _ in open(os.path.join(out_dir, f))) for f in os.listdir(out_dir))
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)  # the largest reaped child's peak
    print(json.dumps({
        "mode": mode, "size": size, "survivors": len(survivors), "rejected": rejected,
        "seconds": timer.wall_s, "driver_cpu_seconds": timer.self_s, "worker_cpu_seconds": timer.children_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": rss_before / 1024,
        "largest_worker_rss_mb": workers.ru_maxrss / 1024,
    }))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,30000,100000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--transform-kw", default="{}",
                        help='JSON keyword arguments for ApplyCorpusFilters, e.g. \'{"hot_key_fanout": 8}\'')
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/frequency.json)")
    parser.add_argument("--one", nargs=3, metavar=("MODE", "SIZE", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        one_run(args.one[0], int(args.one[1]), int(args.one[2]), json.loads(args.transform_kw))
        return
    run = record.Run()
    all_runs = []
    env = harness.python_env()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    results = {}

    def one(mode, size):
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.frequency", "--one", mode, str(size), "0",
             "--transform-kw", args.transform_kw],
            cwd=REPO, env=env, capture_output=True, text=True, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    for size in sizes:
        by_mode = harness.interleaved({mode: functools.partial(one, mode, size) for mode in modes}, args.repeats)
        for mode, runs in by_mode.items():
            all_runs.extend(runs)
            med = harness.medians(runs, [k for k in runs[0] if isinstance(runs[0][k], float)])
            med.update({k: runs[0][k] for k in ("survivors", "rejected")})
            results[(mode, size)] = med
            mem = med["peak_rss_mb"] + (med["largest_worker_rss_mb"] if mode == "multi" else 0)
            cpu = med["driver_cpu_seconds"] + med["worker_cpu_seconds"]
            print(f"{mode:9s} {size:>7d} candidates  {med['seconds']:7.1f} s  cpu {cpu:6.1f} s  "
                  f"{size / med['seconds']:7.0f} candidates/s  peak {mem:6.0f} MB  "
                  f"(driver {med['peak_rss_mb']:.0f}, worker {med['largest_worker_rss_mb']:.0f})  "
                  f"rejected {med['rejected']}", flush=True)
    print()

    def cpu(r):
        return r["driver_cpu_seconds"] + r["worker_cpu_seconds"]

    for mode in modes:
        for size in sizes:
            ref = results.get(("reference", size))
            if ref and mode != "reference":
                r = results[(mode, size)]
                print(f"{mode:9s} {size:>7d}: {r['seconds'] / ref['seconds']:5.1f}x the reference's wall time, "
                      f"{cpu(r) / cpu(ref):5.1f}x its CPU time")
        if len(sizes) > 1:
            lo, hi = results[(mode, sizes[0])], results[(mode, sizes[-1])]
            print(f"{mode:9s} growth {sizes[0]} -> {sizes[-1]} ({sizes[-1] / sizes[0]:.0f}x rows): "
                  f"wall {hi['seconds'] / lo['seconds']:.1f}x, CPU {cpu(hi) / cpu(lo):.1f}x, "
                  f"driver peak RSS {hi['peak_rss_mb'] / lo['peak_rss_mb']:.2f}x, "
                  f"peak RSS above baseline {(hi['peak_rss_mb'] - hi['rss_before_mb']) / (lo['peak_rss_mb'] - lo['rss_before_mb']):.2f}x")
    medians = [dict(mode=mode, size=size, **med) for (mode, size), med in results.items()]
    run.write("frequency", {"transform_kw": json.loads(args.transform_kw), "medians": medians, "runs": all_runs}, args.json)


if __name__ == "__main__":
    main()
