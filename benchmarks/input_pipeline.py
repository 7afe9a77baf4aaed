"""Images/s delivered by ``trainer.input_pipeline.make_dataset`` on this machine.

Generates a shard set of photo-like JPEGs (~400x300, smooth gradients,
blobs and sensor noise, so they decode like real photos rather than flat
colour) with alt-texts, learns its vocabulary, then times the train pipeline
(read, shuffle, decode, resize, random crop, flip, tokenise, batch) for the
tiny config (resize 72 -> crop 64) and ALIGN's sizes for B3 (346 -> 289).
Prints medians over ``--runs`` runs, after a warm-up batch, of images per
wall-clock second (what a trainer would get right now) and images per
CPU-second of the whole process (all tf.data threads; stable on a shared
machine, and times the cores you give it is the rate on dedicated cores).

    python -m benchmarks.input_pipeline [--num_images 1000] [--runs 3] [--json PATH]

Writes ``benchmarks/results/input_pipeline.json`` (``benchmarks.record``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import tempfile
import time

import numpy as np
from PIL import Image

from benchmarks import harness, record
from common import schema
from common import tfrecord_io as tfrecord
from pipeline.write.shards import write_contiguous_shards

#: name -> (image_size, resize_size)
CONFIGS = {"tiny": (64, 72), "b3": (289, 346)}
WORDS = (
    "a the photo of red blue green old new small large house dog cat tree car street "
    "beach mountain city people woman man child sunset river garden kitchen table "
    "wooden vintage modern white black yellow bike boat flower bird window door"
).split()


def photo_like_jpeg(rng, width=400, height=300) -> bytes:
    y, x = np.mgrid[:height, :width].astype(np.float32)
    base = rng.uniform(0, 255, 3)
    slope = rng.normal(0, 0.4, (2, 3))
    image = base + x[..., None] * slope[0] + y[..., None] * slope[1]
    for _ in range(rng.integers(3, 8)):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(20, 120)
        blob = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        image += blob[..., None] * rng.normal(0, 80, 3)
    image += rng.normal(0, 6, image.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_corpus(data_dir: str, num_images: int, num_shards: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(num_images):
        jpeg = photo_like_jpeg(rng)
        text = " ".join(rng.choice(WORDS, rng.integers(4, 16)))
        url = f"https://example.com/bench/{i}.jpg"
        examples.append(
            tfrecord.encode_example({
                "image": jpeg, "texts": text, "key": schema.make_key(url, text), "url": url,
                "width": 400, "height": 300, "original_width": 400, "original_height": 300,
                "sha256": hashlib.sha256(jpeg).hexdigest(), "phash": "0" * 16,
            })
        )
    write_contiguous_shards(data_dir, "bench", "train", examples, num_shards)


def images_per_second(data_dir, tokenizer, image_size, resize_size, batch_size, num_batches, seed):
    """(images per wall-clock second, images per CPU-second of this process)."""
    from trainer.input_pipeline import make_dataset

    dataset = make_dataset(
        data_dir, "train", global_batch_size=batch_size, image_size=image_size, resize_size=resize_size,
        train=True, seed=seed, tokenizer=tokenizer, process_index=0, process_count=1,
    )
    iterator = dataset.as_numpy_iterator()
    next(iterator)  # iterator start-up and the first shuffle-buffer fill are not throughput
    with harness.Timer() as timer:
        for _ in range(num_batches):
            next(iterator)
    images = num_batches * batch_size
    return images / timer.wall_s, images / timer.cpu_s


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_images", type=int, default=1000)
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--images_per_run", type=int, default=1280)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--work_dir", default=None, help="default: a temporary directory")
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/input_pipeline.json)")
    args = parser.parse_args(argv)
    run = record.Run()
    figures = {"num_images": args.num_images, "batch_size": args.batch_size, "runs": args.runs, "configs": {}}

    from trainer.tokenizer import Tokenizer
    from trainer.vocab import build_vocab

    with tempfile.TemporaryDirectory(dir=args.work_dir) as data_dir:
        start = time.perf_counter()
        write_corpus(data_dir, args.num_images, args.num_shards)
        vocab = build_vocab(data_dir, 2000)
        print(f"corpus: {args.num_images} JPEGs 400x300 in {args.num_shards} shards, "
              f"{sum(os.path.getsize(os.path.join(data_dir, f)) for f in os.listdir(data_dir)) / 2**20:.1f} MiB "
              f"({time.perf_counter() - start:.0f} s to generate)")
        tokenizer = Tokenizer(vocab, max_len=64)
        print(f"cpus: {os.cpu_count()} ({record.cpu_model()}), load average: {record.load()[0]:.1f}")
        print(f"{'config':<8} {'crop':>5} {'resize':>6} {'batch':>5}  {'images/s':>8}  {'images/cpu-s':>12}"
              f"  (medians of {args.runs} runs; per-run images/s)")
        for name in args.configs.split(","):
            image_size, resize_size = CONFIGS[name]
            num_batches = max(1, args.images_per_run // args.batch_size)
            runs = [
                images_per_second(data_dir, tokenizer, image_size, resize_size, args.batch_size, num_batches, seed)
                for seed in range(args.runs)
            ]
            wall, cpu = zip(*runs)
            print(f"{name:<8} {image_size:>5} {resize_size:>6} {args.batch_size:>5}  "
                  f"{statistics.median(wall):8.0f}  {statistics.median(cpu):12.0f}  {[round(r) for r in wall]}")
            figures["configs"][name] = {
                "image_size": image_size, "resize_size": resize_size,
                "images_per_s": statistics.median(wall), "images_per_cpu_s": statistics.median(cpu),
                "runs_images_per_s": list(wall), "runs_images_per_cpu_s": list(cpu),
            }
    run.write("input_pipeline", figures, args.json)


if __name__ == "__main__":
    main()
