"""Near-duplicate embedding throughput ("dct" embedder).

    python -m benchmarks.embedding [--images 1000] [--repeats 5] [--processes 2] [--json PATH]

Inputs: ``--images`` distinct 400x300 JPEGs (quality 85), random 4:3 crops of
the photographs shipped in scikit-image / scikit-learn, the size the target
is stated for. Measured, medians over ``--repeats``:

- one process: images/s by wall clock and by CPU time (CPU time is what the
  process got; on a shared machine wall clock also counts waiting for a core),
- ``--processes`` worker processes embedding disjoint halves (as two Beam
  SDK workers on two cores would): aggregate images/s by wall clock,
- where the time goes: decode-to-thumbnail alone, DCT alone,
- the index side (``build_index``: decode, 4 variants, embed) per image,
- one larger size (1024x768) for scale.

Target: >= 1,500 images/s on 2 cores for typical 400x300 JPEGs.
Writes ``benchmarks/results/embedding.json`` (``benchmarks.record``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import statistics
from typing import Callable, List

import numpy as np
from PIL import Image

from benchmarks import harness, record
from dedup import embedders
from dedup.calibration_images import real_photographs
from dedup.edits import encode_jpeg
from dedup.index_sets import IndexImage, build_index

TARGET_IMAGES_PER_S = 1500


def make_jpegs(count: int, width: int, height: int, seed: int = 0, quality: int = 85) -> List[bytes]:
    rng = np.random.default_rng(seed)
    photos = [p for _, p in real_photographs()]
    out = []
    for i in range(count):
        pixels = photos[i % len(photos)]
        h, w = pixels.shape[:2]
        crop_w = int(min(w, h * 4 / 3) * rng.uniform(0.5, 1.0))
        crop_h = int(crop_w * 3 / 4)
        x, y = int(rng.integers(0, w - crop_w + 1)), int(rng.integers(0, h - crop_h + 1))
        image = Image.fromarray(pixels[y : y + crop_h, x : x + crop_w]).resize((width, height), Image.Resampling.BILINEAR)
        out.append(encode_jpeg(image, quality))
    return out


def median_rate(fn: Callable[[], None], count: int, repeats: int, cpu: bool = False) -> float:
    """Median of ``count`` over each pass's wall seconds (CPU seconds of this process with ``cpu``)."""
    timing = harness.timed(fn, repeats)
    return statistics.median(count / seconds for seconds in (timing.cpus if cpu else timing.walls))


# Worker side of the multi-process measurement: each process builds its own
# embedder once (as a Beam DoFn.setup would) and embeds what it is sent.
_worker_embedder = None


def _worker_init():
    global _worker_embedder
    _worker_embedder = embedders.get("dct")


def _worker_embed(images: List[bytes]) -> int:
    return len(_worker_embedder.embed(images))


def multi_process_rate(images: List[bytes], processes: int, repeats: int) -> float:
    chunks = [images[i::processes] for i in range(processes)]
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context, initializer=_worker_init) as pool:
        list(pool.map(_worker_embed, [c[:20] for c in chunks]))  # start-up and warm-up, not timed

        def run():
            assert sum(pool.map(_worker_embed, chunks)) == len(images)

        return median_rate(run, len(images), repeats)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/embedding.json)")
    args = parser.parse_args(argv)
    run = record.Run()

    dct = embedders.get("dct")
    images = make_jpegs(args.images, 400, 300)
    large = make_jpegs(max(100, args.images // 5), 1024, 768, seed=1)
    dct.embed(images[:50])  # imports and caches

    results = {
        "embedder": dct.config(),
        "images": len(images),
        "mean_jpeg_bytes": int(np.mean([len(b) for b in images])),
        "cores_visible": os.cpu_count(),
        "load_average_at_start": record.load()[0],
    }
    results["one_process_wall_images_per_s"] = median_rate(lambda: dct.embed(images), len(images), args.repeats)
    results["one_process_cpu_images_per_s"] = median_rate(
        lambda: dct.embed(images), len(images), args.repeats, cpu=True
    )
    results[f"{args.processes}_processes_wall_images_per_s"] = multi_process_rate(images, args.processes, args.repeats)
    thumbnails = [dct.decode(b) for b in images]
    results["decode_only_cpu_images_per_s"] = median_rate(
        lambda: [dct.decode(b) for b in images], len(images), args.repeats, cpu=True
    )
    results["dct_only_cpu_images_per_s"] = median_rate(
        lambda: dct.embed_pil(thumbnails), len(images), args.repeats, cpu=True
    )
    index_images = [IndexImage("bench", str(i), b) for i, b in enumerate(images[:200])]
    results["index_side_cpu_images_per_s"] = median_rate(
        lambda: build_index(index_images, dct, preview_size=0), len(index_images), max(1, args.repeats // 2),
        cpu=True,
    )  # fmt: skip
    results["large_1024x768_cpu_images_per_s"] = median_rate(
        lambda: dct.embed(large), len(large), args.repeats, cpu=True
    )
    results["load_average_at_end"] = record.load()[0]
    results["target_images_per_s_on_2_cores"] = TARGET_IMAGES_PER_S

    width = max(len(k) for k in results)
    for key, value in results.items():
        shown = f"{value:,.0f}" if isinstance(value, float) and value > 100 else value
        print(f"{key:<{width}}  {shown}")
    run.write("embedding", results, args.json)
    return results


if __name__ == "__main__":
    main()
