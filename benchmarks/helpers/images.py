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


def lanczos3_matrix(size_in: int, size_out: int):
    """The float64 Lanczos-3 resample of ``size_in`` samples to ``size_out`` as a sparse matrix.

    The filter is widened by the scale when it shrinks (antialiased, as
    Pillow's LANCZOS: samples at the output pixels' centres, taps within 3
    widened pixels, each row normalised to sum 1, which at the borders
    renormalises the truncated filter).
    """
    import scipy.sparse

    scale = size_in / size_out
    widened = max(scale, 1.0)
    reach = 3.0 * widened
    rows, columns, weights = [], [], []
    for out in range(size_out):
        centre = (out + 0.5) * scale
        first, last = max(int(centre - reach + 0.5), 0), min(int(centre + reach + 0.5), size_in)
        taps = np.arange(first, last)
        x = (taps + 0.5 - centre) / widened
        w = np.where(np.abs(x) < 3, np.sinc(x) * np.sinc(x / 3), 0.0)
        rows.append(np.full(len(taps), out))
        columns.append(taps)
        weights.append(w / w.sum())
    return scipy.sparse.csr_matrix((np.concatenate(weights), (np.concatenate(rows), np.concatenate(columns))),
                                   shape=(size_out, size_in))


def lanczos3_reference(pixels, size) -> np.ndarray:
    """``pixels`` (rows x columns [x channels]) resampled to ``size`` = (width, height) in float64 Lanczos-3,
    unrounded and unclipped: the reference a stored picture's resampler is measured against."""
    pixels = np.asarray(pixels, np.float64)
    rows, columns = pixels.shape[:2]
    width, height = size
    flat = pixels.reshape(rows, columns, -1)
    channels = flat.shape[2]
    across = lanczos3_matrix(columns, width) @ flat.transpose(1, 0, 2).reshape(columns, rows * channels)
    across = across.reshape(width, rows, channels).transpose(1, 0, 2).reshape(rows, width * channels)
    out = (lanczos3_matrix(rows, height) @ across).reshape(height, width, channels)
    return out.reshape((height, width) + pixels.shape[2:])


def psnr(picture, reference) -> float:
    """Peak signal-to-noise ratio of a uint8 picture against a float reference (clipped to 0-255), dB."""
    diff = np.asarray(picture, np.float64) - np.clip(np.asarray(reference, np.float64), 0, 255)
    return float(10 * np.log10(255 ** 2 / max(np.mean(diff ** 2), 1e-12)))


def ssim(picture, reference) -> float:
    """Mean structural similarity (Wang et al. 2004: 7x7 uniform windows, K1 0.01, K2 0.03, range 255) of a
    picture against a float reference clipped to 0-255, averaged over the channels."""
    from skimage.metrics import structural_similarity

    picture = np.asarray(picture, np.float64)
    reference = np.clip(np.asarray(reference, np.float64), 0, 255)
    channel_axis = 2 if picture.ndim == 3 else None
    return float(structural_similarity(picture, reference, data_range=255, channel_axis=channel_axis))
