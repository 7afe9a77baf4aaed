"""Photo-sized candidates for the throughput benchmarks: ~40 kB JPEGs of photographs, as img2dataset writes them.

    python -m benchmarks.photo_candidates --out DIR --num_candidates 20000 [--seed 0] [--rows_per_file 5000] [--processes 1]
    python -m benchmarks.photo_candidates --out DIR --num_candidates 103000 --longer_side 216,240 --aspect 1,1.05

The second kind (small pictures, every shorter side over 200 px) is the
many-shards run's input: a build whose cost is per record and per shard,
not per pixel.

The sample corpus (``samplegen``) is made to exercise every rule, and most
of its images are small drawings; a build's cost on the web is set by
photographs of a few hundred pixels. Each candidate here is a crop of one of
the photographs shipped inside scikit-image and scikit-learn
(``samplegen.photos``), rescaled to a longer side of 400-800 px at an
aspect ratio (width/height) of 0.6-1.6 and saved as a baseline JPEG at
quality 70-90 (4:2:0): 40 kB on average, as web photographs of that size are.

Written as img2dataset writes a Parquet shard: ``key, url, caption, jpg,
width, height, status`` (``status`` success). Captions are the photograph's
subject phrase, a framing and a running number: 3-20 words, so ALIGN's text
rules keep them, and distinct, so no caption is shared by more than one
image. Every row passes the ALIGN preset: a corpus of this kind is written
whole, and the figures are the cost of writing photographs, not of
rejecting them. Deterministic: the same seed and count give the same bytes,
whatever ``--rows_per_file`` and ``--processes`` are. ``candidates.json``
beside the files states the count, mean JPEG size and the sizes' range.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.schema import make_key

SCHEMA = pa.schema([
    ("key", pa.string()), ("url", pa.string()), ("caption", pa.string()), ("jpg", pa.binary()),
    ("width", pa.int64()), ("height", pa.int64()), ("status", pa.string()),
])
LONGER_SIDE = (400, 800)
ASPECT = (0.6, 1.6)
QUALITY = (70, 90)
ROW_GROUP_SIZE = 1000
VIEWS = ("seen from the left", "seen from the right", "in soft light", "in bright light", "on a clear day",
         "in the afternoon", "close up", "from a distance", "in the morning", "in the evening")


def candidate(seed: int, index: int, longer_side=LONGER_SIDE, aspect_range=ASPECT) -> dict:
    """Candidate ``index`` of the set made with ``seed``: a row as img2dataset writes it."""
    from samplegen.photos import PHOTO_FRAMES, PHOTOS, render_photo, sample_photo

    rng = np.random.default_rng([seed, index])
    longer = int(rng.integers(longer_side[0], longer_side[1] + 1))
    aspect = float(rng.uniform(*aspect_range))
    size = (longer, round(longer / aspect)) if aspect >= 1 else (round(longer * aspect), longer)
    spec = sample_photo(rng, size)
    image = render_photo(spec, size)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=int(rng.integers(QUALITY[0], QUALITY[1] + 1)))
    subjects = PHOTOS[spec["photo"]][2]
    frame = PHOTO_FRAMES[int(rng.integers(len(PHOTO_FRAMES)))]
    caption = f"{frame}{subjects[int(rng.integers(len(subjects)))]} {VIEWS[int(rng.integers(len(VIEWS)))]} number {index}"
    url = f"https://photos.example.com/{seed}/{index:08d}.jpg"
    return {"key": make_key(url, caption), "url": url, "caption": caption, "jpg": out.getvalue(),
            "width": size[0], "height": size[1], "status": "success"}


def write_file(task) -> dict:
    """Rows ``[start, end)`` of the set into one Parquet file; returns their byte sizes' summary."""
    path, seed, start, end, longer_side, aspect = task
    rows = [candidate(seed, i, longer_side, aspect) for i in range(start, end)]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    pq.write_table(table, path + ".partial", row_group_size=ROW_GROUP_SIZE)
    os.replace(path + ".partial", path)
    sizes = [len(r["jpg"]) for r in rows]
    return {"rows": len(rows), "bytes": sum(sizes), "min": min(sizes), "max": max(sizes)}


def write_candidates(out: str, count: int, seed: int = 0, rows_per_file: int = 5000, processes: int = 1,
                     longer_side=LONGER_SIDE, aspect=ASPECT) -> dict:
    """``count`` candidates as Parquet files ``part-NNNNN-of-MMMMM.parquet`` in ``out``; returns what candidates.json holds."""
    os.makedirs(out, exist_ok=True)
    starts = list(range(0, count, rows_per_file))
    tasks = [(os.path.join(out, f"part-{i:05d}-of-{len(starts):05d}.parquet"), seed, start,
              min(count, start + rows_per_file), tuple(longer_side), tuple(aspect)) for i, start in enumerate(starts)]
    if processes > 1:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            parts = pool.map(write_file, tasks, chunksize=1)
    else:
        parts = [write_file(t) for t in tasks]
    info = {
        "candidates": count, "seed": seed, "files": len(tasks),
        "mean_jpeg_bytes": round(sum(p["bytes"] for p in parts) / max(1, count)),
        "min_jpeg_bytes": min(p["min"] for p in parts), "max_jpeg_bytes": max(p["max"] for p in parts),
        "longer_side": list(longer_side), "aspect": list(aspect), "jpeg_quality": QUALITY,
    }
    with open(os.path.join(out, "candidates.json"), "w") as handle:
        json.dump(info, handle, indent=1)
    return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for the Parquet files (created)")
    parser.add_argument("--num_candidates", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows_per_file", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=1, help="processes rendering files in parallel")
    parser.add_argument("--longer_side", default="%d,%d" % LONGER_SIDE, help="MIN,MAX of the longer side in pixels")
    parser.add_argument("--aspect", default="%g,%g" % ASPECT, help="MIN,MAX of the aspect ratio (longer / shorter)")
    args = parser.parse_args(argv)
    if args.num_candidates < 1 or args.rows_per_file < 1:
        raise SystemExit("error: --num_candidates and --rows_per_file must be at least 1")
    try:
        longer_side = tuple(int(v) for v in args.longer_side.split(","))
        aspect = tuple(float(v) for v in args.aspect.split(","))
    except ValueError:
        raise SystemExit("error: --longer_side and --aspect are MIN,MAX (e.g. 400,800 and 0.6,1.6)") from None
    if len(longer_side) != 2 or len(aspect) != 2 or not 8 <= longer_side[0] <= longer_side[1] or not 0 < aspect[0] <= aspect[1]:
        raise SystemExit("error: --longer_side and --aspect are MIN,MAX with 8 <= MIN <= MAX (sides) and 0 < MIN <= MAX")
    if os.path.isdir(args.out) and any(name.endswith(".parquet") for name in os.listdir(args.out)):
        raise SystemExit(f"error: --out {args.out} already holds Parquet files: choose an empty directory")
    start = time.perf_counter()
    info = write_candidates(args.out, args.num_candidates, args.seed, args.rows_per_file, args.processes,
                            longer_side, aspect)
    print(f"photo candidates: {info['candidates']:,} rows in {info['files']} file(s), JPEGs "
          f"{info['mean_jpeg_bytes'] / 1000:.1f} kB on average ({info['min_jpeg_bytes'] / 1000:.1f}-"
          f"{info['max_jpeg_bytes'] / 1000:.1f} kB), {time.perf_counter() - start:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
