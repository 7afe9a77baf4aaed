"""Pictures several benchmarks make: smooth web-sized JPEGs, photo-sized candidates, and pHash distance.

Photo-sized candidates (``candidate``, ``write_candidates``) are described by
``benchmarks.photo_candidates``, whose command writes them.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

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


def make_images(count: int, seed: int = 0) -> list:
    """Distinct JPEGs of web-typical sizes (400-800 px wide, aspect 0.6-1.6) with smooth content."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        width = int(rng.integers(400, 801))
        height = int(width / rng.uniform(0.6, 1.6))
        small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)  # a smooth picture, not noise
        out = io.BytesIO()
        Image.fromarray(small).resize((width, height), Image.BICUBIC).save(out, format="JPEG", quality=88)
        images.append(out.getvalue())
    return images


def make_photos(count: int, seed: int = 0) -> list:
    """Distinct JPEGs of photographs, 400-800 px, ~40 kB (``candidate``)."""
    return [candidate(seed, i)["jpg"] for i in range(count)]


def hamming(a: str, b: str) -> int:
    """Bits that differ between two hex pHashes."""
    return bin(int(a, 16) ^ int(b, 16)).count("1")
