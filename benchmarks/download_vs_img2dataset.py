"""Download throughput: ``pipeline.build --download`` against img2dataset, same URL list, same loopback server.

    python -m benchmarks.download_vs_img2dataset [--images 6000] [--baseline-images 1500]
        [--workers 2] [--our-workers 1,2] [--threads 32] [--repeats 1]
        [--content photo|smooth] [--output_max_side 512] [--download_only]

The server runs in its own process and is not the bottleneck: every image
is a distinct JPEG generated before the clock starts and served from
memory by a threaded server on 127.0.0.1 (its CPU time is reported beside
each run). ``--content photo`` (default): crops of real photographs,
400-800 px, ~40 kB (``benchmarks.helpers.images.make_photos``); ``smooth``: blurred
noise of the same sizes (~27 kB, decodes faster). The URL list is written as
``--shards`` TSV files, as URL lists usually come (img2dataset shards its
input the same way).

- **This project**: the real build, ``python -m pipeline.build --input
  'urls/*.tsv' --download --download_allow_loopback`` on FnApiRunner, once
  per ``--our-workers`` count: 1 runs in the launcher's process
  (``in_memory``), more as ``multi_processing`` worker processes, with the
  per-host bounds off (``--download_per_host 0 --download_per_host_rate
  0``: the list is one loopback host, and img2dataset has none). Download,
  every ALIGN filter (header, format, size, aspect, text rules, full
  decode, sha256 and pHash, the downscale to ``--output_max_side``, the
  frequency filters), TFRecord shards and the stats. ``min_ngram_count=0``
  so the synthetic captions are not rare.
- **img2dataset 1.47** (its own venv): ``--processes_count WORKERS
  --thread_count THREADS``, its default resize (``border`` to 256x256,
  re-encode to JPEG), Parquet output, ``--retries 0``.
- **img2dataset, then this build on its output** (the two-step path users
  take today): the img2dataset run above, then ``pipeline.build --input
  'OUT/*.parquet'`` (no ``--download``) with each ``--our-workers`` count;
  CPU of both steps, per image the build wrote. Its images are 256x256
  already, so the build re-encodes nothing at ``output_max_side`` >= 256.

Each row of the JSON says what its output is (``output``): the fair
comparison is at the same output size, so pass ``--output_max_side 256`` for
this project's one-step build to store what img2dataset stores (longer side
256; img2dataset also pads to a square).

Each is run on the full list (``--images``) and on a smaller one
(``--baseline-images``): the difference in CPU seconds over the difference
in images is the marginal cost of an image, without start-up costs (a
Beam job's imports, worker processes and per-stage set-up are several
CPU-seconds that a long list amortises).

A second set isolates the download itself: this project's download stage
without the image judge (``ReadCandidates``, then ``DownloadImages``' own
steps: distinct URLs, the resume plan, the crawl routed by host into
staging files; on the same runners, URLs whose bytes came counted) against
img2dataset with ``--resize_mode no --disable_all_reencoding True``
(download and write the bytes as they came). ``--download_only`` runs this
set alone.

Figures per run: wall seconds, images written, images/s (wall), CPU
seconds of the tool's processes (``RUSAGE_CHILDREN``) and images per
CPU-second; the ratios are ours/img2dataset (for the marginal cost:
img2dataset's CPU-ms per image over ours) and ours/two-step (CPU per
written image of the two-step path over ours). The machine is shared, so
the load (``os.getloadavg``) is recorded before and after each run. Writes
``benchmarks/results/download_vs_img2dataset.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile

from benchmarks import harness, record
from benchmarks.helpers import loopback
from benchmarks.helpers.images import make_images, make_photos

REPO = harness.REPO
IMG2DATASET = os.environ.get("IMG2DATASET") or os.path.join(REPO, ".venv-img2dataset", "bin", "img2dataset")
WORDS = ("red", "blue", "green", "old", "small", "tall", "quiet", "bright", "wooden", "stone", "river", "garden",
         "bridge", "house", "mountain", "street", "market", "harbour", "forest", "field")


def caption(i: int) -> str:
    words = [WORDS[(i >> (2 * k)) % len(WORDS)] for k in range(5)]
    return f"a photo of the {words[0]} {words[1]} {words[2]} near the {words[3]} {words[4]} number {i}"


def write_url_lists(directory: str, port: int, count: int, shards: int) -> str:
    os.makedirs(directory)
    for shard in range(shards):
        with open(os.path.join(directory, f"urls-{shard:03d}.tsv"), "w") as handle:
            handle.write("url\tcaption\n")
            for i in range(shard, count, shards):
                handle.write(f"http://127.0.0.1:{port}/{i}.jpg\t{caption(i)}\n")
    return directory


def timed(command, env=None) -> dict:
    """Run ``command``; wall seconds and the CPU seconds of its processes."""
    done = harness.run_command(command, env=env, capture_output=True, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    figures = {**done.cost(), "load_before": done.load_before, "load_after": done.load_after}
    for line in done.stdout.splitlines():  # a job may report its own count as one JSON line
        if line.startswith("{") and "downloaded" in line:
            figures.update(json.loads(line))
    return figures


def _build_env(out: str) -> dict:
    from common.console import LOG_DIR_ENV

    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **{LOG_DIR_ENV: os.path.dirname(out)})


def _runner_flags(workers: int) -> list:
    # One worker: the runner in this process (no data plane between processes).
    return [f"--direct_running_mode={'multi_processing' if workers > 1 else 'in_memory'}",
            f"--direct_num_workers={workers}"]


def _written(out: str) -> dict:
    funnel = harness.funnel(out)
    return {"images": sum(funnel["written"].values()), "rejected": funnel["rejected_total"]}


def run_ours(urls: str, out: str, workers: int, threads: int, max_side: int) -> dict:
    command = [
        sys.executable, "-m", "pipeline.build", "--input", os.path.join(urls, "*.tsv"), "--output", out,
        "--download", "--download_allow_loopback", "--download_threads", str(threads),
        "--download_per_host", "0", "--download_per_host_rate", "0", "--set", "min_ngram_count=0", "--set", f"output_max_side={max_side}",
        *_runner_flags(workers),
    ]
    figures = timed(command, _build_env(out))
    figures.update(_written(out))
    figures["output"] = f"JPEG as downloaded, re-encoded where the longer side > {max_side} (output_max_side {max_side})"
    return figures


def run_two_step(urls: str, out: str, workers: int, threads: int, img2dataset_workers: int) -> dict:
    """img2dataset (its defaults), then this build on its Parquet output with ``workers``: both steps' CPU."""
    download = run_img2dataset(urls, out + "-img2dataset", img2dataset_workers, threads)
    command = [sys.executable, "-m", "pipeline.build", "--input", os.path.join(out + "-img2dataset", "*.parquet"),
               "--output", out, "--set", "min_ngram_count=0", *_runner_flags(workers)]
    build = timed(command, _build_env(out))
    build.update(_written(out))
    return {
        "wall_s": round(download["wall_s"] + build["wall_s"], 2), "cpu_s": round(download["cpu_s"] + build["cpu_s"], 2),
        "load_before": download["load_before"], "load_after": build["load_after"],
        "images": build["images"], "rejected": build["rejected"], "img2dataset_images": download["images"],
        "steps": {"img2dataset": download, "build": build},
        "output": "img2dataset's 256x256 JPEGs (border resize); the build re-encodes none (output_max_side 512)",
    }


def run_img2dataset(urls: str, out: str, workers: int, threads: int, extra=()) -> dict:
    command = [
        IMG2DATASET, "--url_list", urls, "--input_format", "tsv", "--url_col", "url", "--caption_col", "caption",
        "--output_folder", out, "--output_format", "parquet", "--processes_count", str(workers),
        "--thread_count", str(threads), "--retries", "0", "--timeout", "10", *extra,
    ]
    figures = timed(command, dict(os.environ, NO_ALBUMENTATIONS_UPDATE="1", WANDB_MODE="disabled"))
    successes = 0
    for name in os.listdir(out):
        if name.endswith("_stats.json"):
            with open(os.path.join(out, name)) as handle:
                successes += json.load(handle)["successes"]
    figures["images"] = successes
    figures["output"] = ("JPEG as downloaded" if "--resize_mode" in extra else
                         "JPEG re-encoded at 256x256 (img2dataset's default: border resize, padded to a square)")
    return figures


def download_job(pattern: str, threads: int, workers: int) -> None:
    """The download stage alone (run in a subprocess by ``run_ours_download_only``).

    The build's reading of the URL list, then ``DownloadImages``' own steps
    without the image judge: distinct URLs, the resume plan against an
    empty ``_downloads``, the crawl routed by host into staging files; the
    URLs whose bytes came are counted.
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.download import crawl, resume
    from pipeline.download.fetch import FetchOptions
    from pipeline.download.settings import DownloadOptions
    from pipeline.download.politeness import HostPolicy
    from pipeline.publish.output_contract import new_version_id
    from pipeline.readers.file_records import ReadCandidates
    from pipeline.readers.rows import Columns

    options = DownloadOptions(FetchOptions(allow_loopback=True), threads=threads, hosts=HostPolicy(0, 0))
    mode = "multi_processing" if workers > 1 else "in_memory"
    beam_options = PipelineOptions(["--runner=FnApiRunner", f"--direct_running_mode={mode}",
                                    f"--direct_num_workers={workers}"])
    staging_dir = tempfile.mkdtemp(prefix="staging-")
    with beam.Pipeline(options=beam_options) as p:
        read = p | ReadCandidates(pattern, None, Columns(download=True))
        plan = (read["survivors"] | "Needs" >> beam.Map(lambda c: (c.url, 0))
                | "DistinctUrls" >> beam.CombinePerKey(max)
                | resume.PlanDownloads(staging_dir))
        fetched = plan[resume.TO_FETCH] | crawl.Crawl(options, staging_dir, new_version_id("0bench00"))
        _ = (fetched | beam.Filter(lambda facts: not facts.reason) | beam.combiners.Count.Globally()
             | beam.Map(lambda n: print(json.dumps({"downloaded": n}), flush=True)))
    shutil.rmtree(staging_dir, ignore_errors=True)


def run_ours_download_only(urls: str, out: str, workers: int, threads: int) -> dict:
    command = [sys.executable, "-m", "benchmarks.download_vs_img2dataset", "--download_job", os.path.join(urls, "*.tsv"),
               "--workers", str(workers), "--threads", str(threads)]
    figures = timed(command, dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    figures["images"] = figures.pop("downloaded")
    return figures


def run_img2dataset_download_only(urls: str, out: str, workers: int, threads: int) -> dict:
    return run_img2dataset(urls, out, workers, threads, ["--resize_mode", "no", "--disable_all_reencoding", "True"])


def per_second(figures: dict) -> dict:
    return dict(figures, images_per_s=round(figures["images"] / figures["wall_s"], 1),
                images_per_cpu_s=round(figures["images"] / figures["cpu_s"], 1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--baseline-images", type=int, default=0,
                        help="a second, smaller list for the marginal cost per image (default: --images / 4)")
    parser.add_argument("--workers", type=int, default=2, help="img2dataset's processes; the most of ours")
    parser.add_argument("--our-workers", default="1,2", help="worker counts of this project's build (1 = in process)")
    parser.add_argument("--threads", type=int, default=32, help="download threads per worker process")
    parser.add_argument("--shards", type=int, default=4, help="TSV files the URL list is split into")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--content", choices=("photo", "smooth"), default="photo",
                        help="photo: crops of photographs (~40 kB); smooth: blurred noise (~27 kB)")
    parser.add_argument("--output_max_side", type=int, default=512,
                        help="this project's one-step build stores images up to this side (the preset's 512; "
                             "256 stores what img2dataset stores)")
    parser.add_argument("--no_two_step", action="store_true", help="skip img2dataset followed by this build")
    parser.add_argument("--download_only", action="store_true",
                        help="run only the download-only pair (img2dataset without resizing, our download stage)")
    parser.add_argument("--json", default="")
    parser.add_argument("--download_job", default="", help=argparse.SUPPRESS)  # internal: the download-only job
    args = parser.parse_args(argv)
    if args.download_job:
        download_job(args.download_job, args.threads, args.workers)
        return
    if not os.path.exists(IMG2DATASET):
        sys.exit(f"img2dataset not installed at {IMG2DATASET} (scripts/setup_env.sh creates it)")
    small = args.baseline_images or args.images // 4
    our_workers = [int(w) for w in args.our_workers.split(",")]

    run = record.Run()
    print(f"generating {args.images:,} JPEGs ({args.content})", flush=True)
    images = (make_photos if args.content == "photo" else make_images)(args.images)
    server, (port,) = loopback.start(images)
    work = tempfile.mkdtemp(prefix="download_bench_")
    tools = [("img2dataset", run_img2dataset, args.workers)]
    tools += [(f"ours_{w}w", functools.partial(run_ours, max_side=args.output_max_side), w) for w in our_workers]
    if not args.no_two_step:
        tools += [(f"two_step_{w}w", functools.partial(run_two_step, img2dataset_workers=args.workers), w)
                  for w in our_workers]
    jobs = [(name, runner, workers, count) for count in (small, args.images) for name, runner, workers in tools]
    if args.download_only:
        tools, jobs = [], []
    jobs += [("img2dataset_download_only", run_img2dataset_download_only, args.workers, args.images)]
    jobs += [(f"ours_download_only_{w}w", run_ours_download_only, w, args.images) for w in our_workers]
    runs = {f"{name}@{count}": [] for name, _, _, count in jobs}
    try:
        lists = {count: write_url_lists(os.path.join(work, f"urls-{count}"), port, count, args.shards)
                 for count in (small, args.images)}
        for repeat in range(args.repeats):
            for name, runner, workers, count in jobs:
                out = os.path.join(work, f"{name}-{count}-{repeat}", "out")
                os.makedirs(os.path.dirname(out))
                server_cpu = harness.process_cpu_seconds(server.pid)
                figures = per_second(runner(lists[count], out, workers, args.threads))
                figures["server_cpu_s"] = round(harness.process_cpu_seconds(server.pid) - server_cpu, 2)
                runs[f"{name}@{count}"].append(figures)
                print(f"{name:28s} {figures['images']:,} of {count:,} images in {figures['wall_s']} s: "
                      f"{figures['images_per_s']} images/s, {figures['images_per_cpu_s']} per CPU-s "
                      f"(server {figures['server_cpu_s']} CPU-s; load {figures['load_before'][0]})", flush=True)
                shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    finally:
        server.terminate()
        shutil.rmtree(work, ignore_errors=True)

    def median(key, field):
        return statistics.median(r[field] for r in runs[key])

    summary = {
        "images": args.images, "baseline_images": small, "workers": args.workers, "our_workers": our_workers,
        "threads": args.threads, "shards": args.shards, "mean_image_bytes": round(sum(map(len, images)) / len(images)),
        "content": args.content, "our_output_max_side": args.output_max_side,
    }
    for name, _, _ in tools:
        big, little = f"{name}@{args.images}", f"{name}@{small}"
        summary[name] = {
            "images_per_s": median(big, "images_per_s"), "images_per_cpu_s": median(big, "images_per_cpu_s"),
            # The cost of one more image: start-up and per-job costs cancel out.
            "marginal_cpu_ms_per_image": round(
                1000 * (median(big, "cpu_s") - median(little, "cpu_s")) / (args.images - small), 2),
            "cpu_ms_per_written_image": round(1000 * median(big, "cpu_s") / median(big, "images"), 2),
            "output": runs[big][0]["output"],
        }
    theirs = summary.get("img2dataset")
    for w in [] if args.no_two_step or args.download_only else our_workers:
        ours, two_step = summary[f"ours_{w}w"], summary[f"two_step_{w}w"]
        # The bar: ours at most 0.7x the two-step path's CPU per written image.
        summary[f"ours_{w}w_over_two_step"] = {
            "cpu_per_written_image": round(ours["cpu_ms_per_written_image"] / two_step["cpu_ms_per_written_image"], 2),
            "marginal_cpu_per_image": round(ours["marginal_cpu_ms_per_image"] / two_step["marginal_cpu_ms_per_image"], 2),
        }
    for name, _, _ in tools[1:]:
        ours = summary[name]
        summary[f"{name}_ratio"] = {
            "images_per_s": round(ours["images_per_s"] / theirs["images_per_s"], 2),
            "images_per_cpu_s": round(ours["images_per_cpu_s"] / theirs["images_per_cpu_s"], 2),
            "marginal_per_cpu_s": round(theirs["marginal_cpu_ms_per_image"] / ours["marginal_cpu_ms_per_image"], 2),
        }
    for label, key in [("img2dataset", "img2dataset_download_only")] + [
            (f"ours_{w}w", f"ours_download_only_{w}w") for w in our_workers]:
        summary[f"download_only_{label}"] = {field: median(f"{key}@{args.images}", field)
                                             for field in ("images_per_s", "images_per_cpu_s")}
    print(json.dumps(summary, indent=1))
    run.write("download_vs_img2dataset", {"summary": summary, "runs": runs}, args.json)


if __name__ == "__main__":
    main()
