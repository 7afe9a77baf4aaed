"""The build's near-duplicate stage on a multi-process runner.

    python -m benchmarks.keyed_joins                                  # index 10k and 100k, 3 repeats
    python -m benchmarks.keyed_joins --index-sizes 10000 --searches exact,buckets --repeats 1

``dedup.transforms.RemoveNearDuplicates`` with each ``--searches`` value
(default ``exact``: the index as a side input every worker holds), exactly
as ``pipeline.build`` wires
it with the ``align`` preset's defaults: k-means inside the job, the index
read on a worker from the files ``pipeline.stages.eval_index.write_index``
writes. Runner: FnApiRunner with ``direct_running_mode=multi_processing``
and ``direct_num_workers=2``.

Data: ``dedup.synthetic.planted_embeddings`` in 143 dimensions (the ``dct``
embedder's), ``--corpus`` corpus rows against each index size (a quarter of
the index rows planted in the corpus at 0-20 degrees), threshold 0.975 (the
data's design point). The corpus embeddings are read from ``.npy`` shards, so
embedding is not timed; the rejected keys and pairs are written as text.

Every run is a fresh process (``--run-one``), searches interleaved per
repeat. Per run:

- ``wall_s``; ``cpu_s``: the driver's CPU time plus that of its worker
  processes (reaped children);
- ``driver_peak_rss_mb`` and ``worker_peak_rss_mb`` (``VmHWM`` of every SDK
  worker process, polled every 0.2 s);
- ``shuffle_bytes`` / ``shuffle_elements``: what enters every GroupByKey
  (element count times the runner's sampled encoded size per element; the
  k-means sample's is the same for every search), per GroupByKey in
  ``shuffles``; ``side_input_bytes``: the PCollections read as side inputs
  (the clustered index for ``exact``, the centroids);
- ``rejected``, ``lost``, ``extra``: the rejected corpus keys against
  ``faiss.IndexFlatIP.range_search`` (keys within 1e-5 of the threshold do
  not count either way).

The JSON (``benchmarks/results/keyed_joins.json``) holds every run and the
medians per (index size, search). Two keyed joins, ``list_join`` and
``bucket_join`` (no worker holds the index), were measured against the side
input with this harness at commit 603c976 and removed (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import harness, record

DIM = 143  # dedup.embedders.DctEmbedder
SEARCHES = ("exact",)
CORPUS_SHARDS = 8
MARGIN = 1e-5


# ---------------------------------------------------------------------------
# Data (parent process, not timed)
# ---------------------------------------------------------------------------


def write_data(directory: str, num_corpus: int, num_index: int, threshold: float, seed: int = 0) -> dict:
    """Corpus shards, the index files as the build writes them, and the expected rejections."""
    import faiss

    from dedup.synthetic import planted_embeddings
    from dedup.transforms import IndexRows
    from pipeline.stages import eval_index

    corpus, index = planted_embeddings(num_corpus, num_index, dim=DIM, seed=seed)
    keys = np.array([f"c{i:08d}" for i in range(num_corpus)])
    os.makedirs(os.path.join(directory, "corpus"), exist_ok=True)
    for shard, rows in enumerate(np.array_split(np.arange(num_corpus), CORPUS_SHARDS)):
        np.save(os.path.join(directory, "corpus", f"vectors-{shard}.npy"), corpus[rows])
        np.save(os.path.join(directory, "corpus", f"keys-{shard}.npy"), keys[rows])
    rows = IndexRows(index, [f"i{i:08d}" for i in range(num_index)], ["bench"] * num_index, ["original"] * num_index)
    eval_index.write_index(rows, os.path.join(directory, "index"), {})

    flat = faiss.IndexFlatIP(DIM)
    flat.add(index)
    sure = set()
    possible = set()
    lims, cosines, _ = flat.range_search(corpus, threshold - MARGIN)
    for q in range(num_corpus):
        found = cosines[lims[q] : lims[q + 1]]
        if len(found):
            possible.add(str(keys[q]))
            if found.max() > threshold + MARGIN:
                sure.add(str(keys[q]))
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump({"sure": sorted(sure), "possible": sorted(possible)}, f)
    return {"corpus_rows": num_corpus, "index_rows": num_index, "expected_rejected": len(sure)}


# ---------------------------------------------------------------------------
# One run (child process)
# ---------------------------------------------------------------------------


def load_shard(path: str):
    vectors = np.load(path)
    keys = np.load(path.replace("vectors-", "keys-"))
    for key, vector in zip(keys.tolist(), vectors):
        yield key, vector


def _pair_line(pair: dict) -> str:
    return f"{pair['key']} {pair['index_key']} {pair['cosine']:.6f}"


def shuffle_and_side_inputs(pipeline, result) -> dict:
    """Bytes and elements entering each GroupByKey, and bytes of each side input, from the runner's metrics."""
    from apache_beam.metrics import monitoring_infos
    from apache_beam.portability.api import beam_runner_api_pb2

    counts, sizes = {}, {}
    for infos in result._monitoring_infos_by_stage.values():
        for info in infos:
            pcoll = info.labels.get("PCOLLECTION")
            if pcoll is None:
                continue
            if info.urn == monitoring_infos.ELEMENT_COUNT_URN:
                counts[pcoll] = counts.get(pcoll, 0) + monitoring_infos.extract_counter_value(info)
            elif info.urn == monitoring_infos.SAMPLED_BYTE_SIZE_URN:
                dist = monitoring_infos.extract_distribution(info)  # (count, sum, min, max)
                c, s = sizes.get(pcoll, (0, 0))
                sizes[pcoll] = (c + dist[0], s + dist[1])

    def volume(pcoll):
        if pcoll not in counts or pcoll not in sizes or sizes[pcoll][0] == 0:
            return None, None
        n = counts[pcoll]
        return n, int(round(n * sizes[pcoll][1] / sizes[pcoll][0]))

    proto = pipeline.to_runner_api()
    shuffles, side_inputs = {}, {}
    for transform in proto.components.transforms.values():
        if transform.spec.urn == "beam:transform:group_by_key:v1":
            (pcoll,) = transform.inputs.values()
            n, size = volume(pcoll)
            if n is not None:
                shuffles[transform.unique_name] = {"elements": n, "bytes": size}
        elif transform.spec.urn == "beam:transform:pardo:v1":
            payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            for tag in payload.side_inputs:
                pcoll = transform.inputs[tag]
                n, size = volume(pcoll)
                if n is not None:
                    side_inputs[pcoll] = {"read_by": transform.unique_name, "elements": n, "bytes": size}
    return {
        "shuffle_elements": sum(s["elements"] for s in shuffles.values()),
        "shuffle_bytes": sum(s["bytes"] for s in shuffles.values()),
        "side_input_bytes": sum(s["bytes"] for s in side_inputs.values()),
        "shuffles": shuffles,
        "side_inputs": list(side_inputs.values()),
    }


def run_one(search: str, data_dir: str, out_dir: str, threshold: float, workers: int) -> dict:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from dedup.transforms import RemoveNearDuplicates
    from pipeline.stages.eval_index import load_index_rows

    shards = sorted(
        os.path.join(data_dir, "corpus", name)
        for name in os.listdir(os.path.join(data_dir, "corpus"))
        if name.startswith("vectors-")
    )
    memory = harness.WorkerMemory()
    memory.start()
    with harness.Timer() as timer:
        options = PipelineOptions(direct_num_workers=workers, direct_running_mode="multi_processing")
        p = beam.Pipeline(runner=FnApiRunner(), options=options)
        corpus = p | "CorpusShards" >> beam.Create(shards) | "LoadCorpus" >> beam.FlatMap(load_shard)
        index = p | "IndexDirectory" >> beam.Create([os.path.join(data_dir, "index")]) | "LoadIndexRows" >> beam.Map(
            load_index_rows)
        found = corpus | "RemoveNearDuplicates" >> RemoveNearDuplicates(index, threshold, search=search)
        _ = (found["rejected"] | "RejectedKey" >> beam.MapTuple(lambda key, reason: key)
             | "WriteRejected" >> beam.io.WriteToText(os.path.join(out_dir, "rejected")))
        _ = found["pairs"] | "PairLine" >> beam.Map(_pair_line) | "WritePairs" >> beam.io.WriteToText(
            os.path.join(out_dir, "pairs"))
        result = p.run()
        result.wait_until_finish()
    memory.stop()

    def lines(prefix):
        out = []
        for name in sorted(os.listdir(out_dir)):
            if name.startswith(prefix):
                with open(os.path.join(out_dir, name)) as f:
                    out.extend(line.rstrip("\n") for line in f if line.strip())
        return out

    rejected = set(lines("rejected"))
    with open(os.path.join(data_dir, "expected.json")) as f:
        expected = json.load(f)
    sure, possible = set(expected["sure"]), set(expected["possible"])
    figures = {
        "search": search,
        "wall_s": round(timer.wall_s, 2),
        "cpu_s": round(timer.cpu_s, 2),
        "driver_peak_rss_mb": harness.peak_rss_mb(),
        "worker_peak_rss_mb": sorted(round(kb / 1024, 1) for kb in memory.peak_kb.values()),
        "rejected": len(rejected),
        "pairs": len(lines("pairs")),
        "lost": len(sure - rejected),
        "extra": len(rejected - possible),
    }
    figures.update(shuffle_and_side_inputs(p, result))
    return figures


# ---------------------------------------------------------------------------
# Parent: data per index size, fresh process per run, medians
# ---------------------------------------------------------------------------


def child(search, data_dir, threshold, workers, timeout):
    out_dir = tempfile.mkdtemp(prefix="out-", dir=data_dir)
    cmd = [
        sys.executable, "-m", "benchmarks.keyed_joins", "--run-one", search, "--data", data_dir,
        "--out", out_dir, "--threshold", str(threshold), "--workers", str(workers),
    ]
    log = os.path.join(data_dir, f"{search}.log")
    load_before = record.load()
    try:
        with open(log, "a") as f:
            done = harness.run_command(cmd, cwd=harness.REPO, stdout=subprocess.PIPE, stderr=f, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"search": search, "timed_out_after_s": timeout, "load_before": load_before}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"{search} failed (exit {done.returncode}); see {log}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["load_before"], figures["load_after"] = done.load_before, done.load_after
    return figures


MEDIAN_FIELDS = ("wall_s", "cpu_s", "driver_peak_rss_mb", "shuffle_bytes", "shuffle_elements", "side_input_bytes")


def medians(runs: list) -> dict:
    done = [r for r in runs if "wall_s" in r]
    if not done:
        return {"runs": 0, "timed_out": len(runs)}
    out = {"runs": len(done), "timed_out": len(runs) - len(done)}
    out.update(harness.medians(done, MEDIAN_FIELDS))
    out["max_worker_peak_rss_mb"] = statistics.median(max(r["worker_peak_rss_mb"] or [0]) for r in done)
    for field in ("rejected", "pairs", "lost", "extra"):
        out[field] = sorted({r[field] for r in done})
    out["load_1min"] = [r["load_before"][0] for r in done]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=int, default=40_000, help="corpus rows")
    parser.add_argument("--index-sizes", default="10000,100000")
    parser.add_argument("--searches", default=",".join(SEARCHES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=0.975)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a run is abandoned")
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/keyed_joins.json)")
    parser.add_argument("--run-one", default="", help=argparse.SUPPRESS)
    parser.add_argument("--data", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.run_one:
        print(json.dumps(run_one(args.run_one, args.data, args.out, args.threshold, args.workers)), flush=True)
        return None

    run = record.Run()
    searches = args.searches.split(",")
    sizes = []
    with tempfile.TemporaryDirectory(prefix="keyed_joins-") as tmp:
        for size in (int(s) for s in args.index_sizes.split(",")):
            data_dir = os.path.join(tmp, f"index-{size}")
            data = write_data(data_dir, args.corpus, size, args.threshold)
            print(f"index {size:,} rows, corpus {args.corpus:,}: {data['expected_rejected']:,} corpus rows to reject "
                  f"(load {record.load()[0]})", flush=True)

            def report(search, repeat, figures):
                shown = {k: figures.get(k) for k in ("wall_s", "cpu_s", "worker_peak_rss_mb", "shuffle_bytes",
                                                      "side_input_bytes", "rejected", "lost", "extra",
                                                      "timed_out_after_s")}
                print(f"  {search:<11} repeat {repeat + 1}: {shown} load {figures['load_before'][0]}", flush=True)

            runs = harness.interleaved(
                {search: functools.partial(child, search, data_dir, args.threshold, args.workers, args.timeout)
                 for search in searches}, args.repeats, report)
            sizes.append(dict(data, threshold=args.threshold, dim=DIM, workers=args.workers,
                              medians={s: medians(r) for s, r in runs.items() if r}, runs=runs))
    run.write("keyed_joins", {"index_sizes": sizes}, args.json)
    return sizes


if __name__ == "__main__":
    main()
