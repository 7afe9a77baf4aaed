"""Hot keys at scale: per-worker peak memory as one key grows (one pair, caption or image on most rows).

    python -m benchmarks.scale --cases pair,text,image --total 1000000 --rows 100000,1000000
    python -m benchmarks.scale --cases kmeans --total 1000000 --rows 1000000

Each case runs the build's own composite on FnApiRunner with
``--direct_running_mode=multi_processing --direct_num_workers=2`` over
``--total`` generated rows of which ``--rows`` share one hot key and the
rest have keys of their own: the input size stays the same while the hot key
grows, so a step that holds a key's values in one list shows up as growth
(this runner hands each worker half of a stage's input as one bundle and
buffers it, so worker memory also follows the total, whatever the keys).
The rows are made on the workers (the job graph stays small); they are
light rows, as the corpus stages see them:

- ``text``: one alt-text on the hot rows, each its own image; the other rows
  each their own alt-text and image -> ``filters.frequency.ApplyCorpusFilters``
  (align; the hot caption is rejected by ``images_per_text``);
- ``image``: one image (sha256 and pHash) on the hot rows, each its own
  alt-text -> ``ApplyCorpusFilters`` (``texts_per_image``);
- ``pair``: one (url, alt-text) pair repeated on the hot rows, distinct pairs
  otherwise -> ``pipeline.stages.verdicts.DropKeys`` (light rows) and
  ``JoinVerdicts`` (one record per key written, the repeats
  ``duplicate_pair/repeat``);
- ``kmeans``: ``--total`` embedded rows (64 dimensions),
  ``kmeans_sample_size`` 250,000 -> ``dedup.transforms.TrainCentroids``
  (the sample by hash bound; ``--rows`` unused).

Per run: wall and CPU seconds (driver plus reaped workers), the peak
resident size (``VmHWM``) of each SDK worker process and of the driver (the
runner's in-memory shuffle lives there), and the outcome counted in the job,
which must be what the case's rows make (``expected_outcomes``): a run that
lost records makes the command exit 1. Each run is a process of its own
(``--run_case``), so the driver's peak is that run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import typing

from benchmarks import harness, record

CASES = ("text", "image", "pair", "kmeans")
CHUNK = 10_000


def _chunks(n: int, offset: int = 0):
    return [(offset + start, offset + min(n, start + CHUNK)) for start in range(0, n, CHUNK)]


def _text_rows(span):
    start, end = span
    for i in range(start, end):
        yield (f"hot{i:08d}", f"sha-{i}", f"ph{i:014x}", "click here to enlarge")


def _image_rows(span):
    start, end = span
    for i in range(start, end):
        yield (f"img{i:08d}", "sha-placeholder", "ph-placeholder00", f"product photo number {i}")


def _ordinary_rows(span):
    start, end = span
    for i in range(start, end):
        yield (f"ord{i:08d}", f"sha-o{i}", f"pho{i:013x}", f"an ordinary caption number {i}")


def _pair_records(span, hot: bool = True):
    from common.schema import make_key
    from pipeline.stages.light_rows import LightRow

    start, end = span
    for i in range(start, end):
        url, text = ("https://example.com/logo.png", "company logo") if hot else (f"https://e.x/{i}.png", f"pair {i}")
        yield LightRow(make_key(url, text), url, text, "", True, f"sha{i % 16}", "", 32, 32, "PNG",
                       f"page-{i // 1000}.parquet", "parquet", i % 1000)


def _embedded_rows(span):
    import numpy as np

    start, end = span
    rng = np.random.default_rng(start)
    vectors = rng.standard_normal((end - start, 64)).astype(np.float32)
    for i, vector in zip(range(start, end), vectors):
        yield f"e{i:08d}", vector


def build_case(p, case: str, rows: int, total: int):
    """Adds the case to ``p``; returns a PCollection of (outcome, count)."""
    import apache_beam as beam

    rows = min(rows, total)
    spans = p | "Spans" >> beam.Create(_chunks(rows))
    others = p | "OtherSpans" >> beam.Create(_chunks(total - rows, offset=rows))
    if case in ("text", "image"):
        from filters.frequency import ApplyCorpusFilters
        from filters.presets import get_preset

        hot = spans | "HotRows" >> beam.FlatMap(_text_rows if case == "text" else _image_rows)
        ordinary = others | "Ordinary" >> beam.FlatMap(_ordinary_rows)
        survivors = (hot, ordinary) | "Survivors" >> beam.Flatten()
        empty = p | "NoCountedOnly" >> beam.Create([])
        out = {"survivors": survivors, "counted_only": empty} | ApplyCorpusFilters(get_preset("align", ["vocab_size=0"]))
        return out["rejected"] | "Reasons" >> beam.Values() | "Count" >> beam.combiners.Count.PerElement()
    if case == "pair":
        from pipeline.stages.verdicts import DropKeys, JoinVerdicts

        records = (
            spans | "Repeats" >> beam.FlatMap(_pair_records).with_output_types(typing.Any),
            others | "Distinct" >> beam.FlatMap(_pair_records, hot=False).with_output_types(typing.Any),
        ) | "Records" >> beam.Flatten()
        no_verdicts = p | "NoVerdicts" >> beam.Create([])
        light = (records, no_verdicts) | "DropKeys" >> DropKeys(lambda row: row.key)
        joined = (records, no_verdicts) | "JoinVerdicts" >> JoinVerdicts()
        return (
            (light | "LightKept" >> beam.Map(lambda _: "light_kept"),
             joined["survivors"] | "Written" >> beam.Map(lambda _: "written"),
             joined["rejected"] | "Why" >> beam.Map(lambda r: r.reason))
            | "Outcomes" >> beam.Flatten()
            | "Count" >> beam.combiners.Count.PerElement()
        )
    if case == "kmeans":
        from dedup.transforms import TrainCentroids

        everything = (spans, others) | "AllSpans" >> beam.Flatten()
        embedded = everything | "Embedded" >> beam.FlatMap(_embedded_rows).with_output_types(typing.Any)
        centroids = embedded | TrainCentroids(64, sample_size=250_000, niter=5)
        return centroids | "Shape" >> beam.Map(lambda c: (f"centroids {c.shape[0]}x{c.shape[1]}", 1))
    raise ValueError(case)


def expected_outcomes(case: str, rows: int, total: int) -> dict:
    """What each case must count when nothing is lost (``main`` fails the run otherwise)."""
    from filters.frequency import SHARED_TEXT, TOO_MANY_TEXTS

    rows = min(rows, total)
    if case == "text":
        return {SHARED_TEXT: rows}
    if case == "image":
        return {TOO_MANY_TEXTS: rows}
    if case == "pair":
        return {"light_kept": total, "written": 1 + total - rows, "duplicate_pair/repeat": rows - 1}
    return None  # kmeans: a shape, not a count


def run_case(case: str, rows: int, total: int) -> dict:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
                               "--direct_num_workers=2"])
    outcomes = {}
    memory = harness.WorkerMemory()
    memory.start()
    with harness.Timer() as timer:
        p = beam.Pipeline(options=options)
        counted = build_case(p, case, rows, total)
        out_dir = tempfile.mkdtemp(prefix="scale_bench_")
        _ = counted | "Format" >> beam.MapTuple(lambda k, v: f"{k}\t{v}") | "Write" >> beam.io.WriteToText(
            os.path.join(out_dir, "outcomes"), shard_name_template="")
        p.run().wait_until_finish()
    memory.stop()
    with open(os.path.join(out_dir, "outcomes")) as handle:
        for line in handle:
            name, value = line.rstrip("\n").split("\t")
            outcomes[name] = int(value)
    return {
        "case": case,
        "hot_rows": rows,
        "total_rows": total,
        "wall_s": round(timer.wall_s, 1),
        "cpu_s": round(timer.cpu_s, 1),
        "worker_peak_rss_mb": sorted(round(kb / 1024, 1) for kb in memory.peak_kb.values()),
        "driver_peak_rss_mb": harness.peak_rss_mb(),
        "outcomes": dict(sorted(outcomes.items())),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="text,image,pair")
    parser.add_argument("--rows", default="100000,1000000", help="comma-separated sizes of the hot key")
    parser.add_argument("--total", type=int, default=1_000_000, help="rows in the input, hot key included")
    parser.add_argument("--json", default="", help="where to write the figures (default benchmarks/results/scale.json)")
    parser.add_argument("--label", default="", help="a name for this tree in the JSON (e.g. before)")
    parser.add_argument("--run_case", nargs=2, metavar=("CASE", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_case:
        print(json.dumps(run_case(args.run_case[0], int(args.run_case[1]), args.total)), flush=True)
        return 0
    started = record.Run()
    runs = []
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"unknown case {case!r}: {', '.join(CASES)}")
        for rows in (int(r) for r in args.rows.split(",")):
            # Each run in its own process: the driver's peak is per run.
            done = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--run_case", case, str(rows),
                                   "--total", str(args.total)], capture_output=True, text=True,
                                  env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            figures["load_after"] = record.load()
            figures["label"] = args.label
            expected = expected_outcomes(case, rows, args.total)
            figures["outcomes_add_up"] = expected is None or figures["outcomes"] == expected
            print(json.dumps(figures), flush=True)
            if not figures["outcomes_add_up"]:
                print(f"error: {case} with {rows:,} hot rows counted {figures['outcomes']}, expected {expected}: "
                      "records were lost", file=sys.stderr)
            runs.append(figures)
    started.write("scale", {"runs": runs}, args.json)
    return 0 if all(run["outcomes_add_up"] for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
