"""Build throughput against the image-decode floor, on the same files in one run.

    python -m benchmarks.build_throughput --input sample='out/s20k/candidates/*.parquet' \
        [--input photos='out/photos20k/*.parquet'] [--workers 1,2] [--repeats 1] [--json PATH]

Inputs: the sample (``python -m samplegen --out S --num_candidates 20000``)
and photo-sized candidates (``python -m benchmarks.photo_candidates --out P
--num_candidates 20000``: ~40 kB JPEGs of photographs, 400-800 px). For the
peak memory per worker as the input grows, pass the same kind at two sizes
(``--input photos10k=... --input photos100k=...``): flat is the goal.

Every candidate's image has to be decoded once, so no build can beat
reading the Parquet files and fully decoding each image with PIL: that is
the *floor*, timed here with the same number of worker processes as the
build. For each input it reports:

- the floor and ``pipeline.build --preset align`` (no evaluation set), in
  candidates per wall second, and their ratio (the build's share of the floor);
- CPU-ms per candidate of the build (user + system of the build process and
  its workers) and of the floor (this process and its decoding processes);
- peak resident memory (``VmHWM``, polled) of the build's own process (the
  runner, and with one worker the whole job) and of each SDK worker process;
- bytes shuffled per candidate: the build runs on
  ``benchmarks.helpers.shuffles.ShuffleMeasuringRunner`` (Beam's FnApiRunner,
  which also notes what each GroupByKey receives), so the figure comes from
  the same run; the heaviest shuffles are named;
- CPU-ms per candidate of the per-record steps (header parse; the first
  pass's ``identify``: the reduced decode, pHash and sha256; the second
  pass's stored picture, as read or re-encoded; text rules and n-gram keys),
  measured in this process on the same images with ``time.process_time``;
  what the build spends beyond their sum is Beam's: element overhead,
  coders, shuffles, the corpus stages and the writers;
- for comparison, the full decode and the pHash of the full-size picture
  (what the build did before it hashed a reduced decode), and how many
  pHashes the reduced decode changes (Hamming distance to the full-size one).

The floor and the build take turns, ``--repeats`` times (medians). The
machine is shared: record the load (``benchmarks.record`` does) and compare
CPU-ms, which a busy machine inflates less than wall time.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import multiprocessing
import os
import shutil
import tempfile
import time
import warnings

import pyarrow.parquet as pq
from PIL import Image

from benchmarks import harness, record
from benchmarks.helpers import shuffles as shuffle_runner
from benchmarks.helpers.images import hamming

IMAGE_COLUMNS = ("jpg", "image", "img", "png", "webp")


def _image_column(path: str) -> str:
    names = pq.ParquetFile(path).schema_arrow.names
    for name in IMAGE_COLUMNS:
        if name in names:
            return name
    raise SystemExit(f"error: {path} has no image column ({', '.join(IMAGE_COLUMNS)})")


def _decode_file(path: str) -> int:
    """The floor's work for one file: read its images, fully decode each; returns the row count."""
    warnings.simplefilter("ignore", Image.DecompressionBombWarning)
    table = pq.read_table(path, columns=[_image_column(path)])
    rows = 0
    for data in table.column(0).to_pylist():
        rows += 1
        if not data:
            continue
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
        except Exception:
            pass
    return rows


def time_floor(files, workers: int) -> dict:
    with harness.Timer() as timer:
        if workers == 1:
            rows = sum(_decode_file(f) for f in files)
        else:
            # one file per task: the build also splits by file (and row group)
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                rows = sum(pool.map(_decode_file, files, chunksize=1))
    wall, cpu = timer.wall_s, timer.cpu_s
    return {"candidates": rows, "wall_s": wall, "per_s": rows / wall, "cpu_ms_per_candidate": 1000 * cpu / rows}


def time_build(pattern: str, workers: int, candidates: int) -> dict:
    """One build of ``pattern``: wall and CPU time, peak memory per process, bytes shuffled."""
    out = tempfile.mkdtemp(prefix="build-throughput-")
    shuffles_path = os.path.join(out, "shuffles.json")
    argv = ["--input", pattern, "--output", os.path.join(out, "corpus"), "--preset", "align",
            "--runner", shuffle_runner.RUNNER]
    if workers > 1:
        argv += ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    run = harness.run_build(argv, out, {shuffle_runner.OUTPUT_ENV: shuffles_path})
    with open(shuffles_path) as handle:
        shuffles = shuffle_runner.Shuffles.from_json(json.load(handle))
    shutil.rmtree(out, ignore_errors=True)
    shuffles.candidates = candidates
    wall = run["wall_s"]
    return {"wall_s": wall, "per_s": candidates / wall, "cpu_ms_per_candidate": 1000 * run["cpu_s"] / candidates,
            "driver_peak_rss_mb": round(run["driver_kb"] / 1024, 1),
            "worker_peak_rss_mb": sorted(round(kb / 1024, 1) for kb in run["peak_kb"].values()),
            "shuffled_bytes_per_candidate": round(shuffles.total_bytes / candidates, 1),
            "shuffles": shuffles.to_json()["per_shuffle"]}


def _heaviest(build: dict, count: int = 3) -> str:
    return ", ".join(f"{s['name']} {s['bytes_per_candidate']:,.0f}" for s in build["shuffles"][:count])


def per_record_steps(files, limit: int = 1500) -> dict:
    """CPU-ms per candidate of each per-record step, on the first ``limit`` images."""
    from common.images import orient
    from filters import image as image_rules
    from filters import text as text_rules
    from filters.presets import get_preset

    preset = get_preset("align")
    rows = []
    for path in files:
        table = pq.read_table(path)
        caption = "caption" if "caption" in table.column_names else table.column_names[0]
        images, captions = table.column(_image_column(path)).to_pylist(), table.column(caption).to_pylist()
        rows += [(i, c) for i, c in zip(images, captions) if i]
        if len(rows) >= limit:
            break
    rows = rows[:limit]
    decoded = []
    steps = {}

    def timed(name, fn, items):
        start = time.process_time()
        result = [fn(x) for x in items]
        steps[name] = 1000 * (time.process_time() - start) / len(rows)
        return result

    headers = timed("header", lambda r: image_rules.read_header(r[0], preset)[0], rows)
    for (data, _), header in zip(rows, headers):
        if header is not None:
            decoded.append((data, header))

    def decode(item):
        data, header = item
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return image_rules.to_rgb(orient(img, header.orientation))

    rgbs = timed("full decode + orientation + RGB (the floor's decode; not in the build)",
                 lambda item: _safe(decode, item), decoded)
    full = timed("pHash of the full-size decode (not in the build)",
                 lambda rgb: image_rules.perceptual_hash(rgb) if rgb is not None else None, rgbs)
    identities = timed("identify: reduced decode + pHash + sha256 (first pass)",
                       lambda item: image_rules.identify(item[0], item[1])[0], decoded)
    timed("stored picture: as read, or decode + downscale + re-encode (second pass)",
          lambda item: image_rules.stored_picture(item[0], item[1], preset)[0], decoded)
    steps["re-encoded by the second pass"] = sum(not image_rules.stored_as_read(h, preset) for _, h in decoded)
    distances = [hamming(a, b.phash) for a, b in zip(full, identities) if a and b]
    steps["pHash Hamming distance, reduced vs full-size decode"] = {
        str(d): distances.count(d) for d in sorted(set(distances))}
    texts = timed("text rules", lambda r: text_rules.normalize_text(r[1] or ""), rows)
    timed("n-gram keys", lambda t: text_rules.ngrams(t, 2), texts)
    return steps


def _safe(fn, arg):
    try:
        return fn(arg)
    except Exception:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", required=True, metavar="NAME=GLOB",
                        help="Parquet candidates (repeatable)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker process counts")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--per-record-only", action="store_true", help="only the per-record step costs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    run = record.Run()
    figures = {}
    for spec in args.input:
        name, _, pattern = spec.partition("=")
        files = sorted(glob.glob(pattern))
        if not files:
            raise SystemExit(f"error: --input {spec}: no files match")
        candidates = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        entry = {"files": len(files), "candidates": candidates, "runs": {}}
        for workers in [] if args.per_record_only else [int(w) for w in args.workers.split(",")]:
            turns = harness.interleaved({"floor": lambda: time_floor(files, workers),
                                         "build": lambda: time_build(pattern, workers, candidates)}, args.repeats)
            floor = harness.medians(turns["floor"], turns["floor"][0])
            # Times are medians over the repeats; memory and shuffles are the first run's.
            build = dict(turns["build"][0], **harness.medians(turns["build"], ("wall_s", "per_s", "cpu_ms_per_candidate")))
            entry["runs"][str(workers)] = {"floor": floor, "build": build, "share_of_floor": build["per_s"] / floor["per_s"]}
            workers_rss = ", ".join(f"{mb:,.0f}" for mb in build["worker_peak_rss_mb"]) or "none"
            print(f"{name}: {workers} worker(s): floor {floor['per_s']:,.0f}/s, build {build['per_s']:,.0f}/s "
                  f"(share {build['per_s'] / floor['per_s']:.2f}); CPU-ms/candidate floor "
                  f"{floor['cpu_ms_per_candidate']:.2f}, build {build['cpu_ms_per_candidate']:.2f}; "
                  f"peak RSS MB: build process {build['driver_peak_rss_mb']:,.0f}, SDK workers {workers_rss}; "
                  f"shuffled {build['shuffled_bytes_per_candidate']:,.0f} B/candidate (heaviest, B/candidate: "
                  f"{_heaviest(build)})", flush=True)
        entry["per_record_cpu_ms"] = per_record_steps(files)
        print(f"{name}: per-record CPU-ms/candidate: " + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in entry["per_record_cpu_ms"].items()),
            flush=True)
        figures[name] = entry
    run.write("build_throughput", figures, args.json)


if __name__ == "__main__":
    main()
