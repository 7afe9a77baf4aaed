r"""Training throughput (image-text pairs per second) of the real trainer on CPU.

Runs ``trainer.train.train_and_evaluate`` (input pipeline, jitted train step,
host checks) for a few steps on a synthetic shard directory and reports the
median step time after the first (compiling) step, as pairs/s of wall clock
and pairs per CPU-second of this process (the fairer number on a shared
machine).

    python -m benchmarks.train_throughput [--configs tiny,b3_bert_mini] [--steps 8]
        [--batch b3_bert_mini=8]

Paper-scale configs keep their architecture and image size; only the batch
is lowered to something a CPU can hold (``--batch NAME=B``).
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import platform
import shutil
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import record  # noqa: E402

WORK = os.path.join(ROOT, "benchmarks", "_work", "train_throughput")
DEFAULT_BATCH = {"tiny": 128, "b3_bert_mini": 8}
SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 60, 220),
           "yellow": (235, 215, 40)}


def write_synthetic_corpus(data_dir: str, num_pairs: int, image_px: int) -> None:
    """Drawn shapes with describing captions, in the project's shard format."""
    from PIL import Image, ImageDraw

    from common import schema
    from common import tfrecord_io as tfrecord
    from pipeline.write.shards import write_contiguous_shards
    from pipeline.publish.tfds_metadata import write_metadata as write_tfds_metadata
    from trainer.vocab import build_vocab

    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    lengths = {}
    for split, count, shards in (("train", num_pairs, 2), ("validation", 16, 1)):
        records = []
        for i in range(count):
            shape, colour = SHAPES[i % 3], list(COLOURS)[rng.integers(len(COLOURS))]
            image = Image.new("RGB", (image_px, image_px), (240, 240, 240))
            half = image_px * rng.uniform(0.2, 0.4)
            c = image_px / 2
            box = (c - half, c - half, c + half, c + half)
            draw = ImageDraw.Draw(image)
            {"circle": draw.ellipse, "square": draw.rectangle}.get(shape, lambda b, fill: draw.polygon(
                [(c, c - half), (c + half, c + half), (c - half, c + half)], fill=fill))(
                    box, fill=COLOURS[colour])
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=90)
            text = f"a {colour} {shape} on a light background"
            url = f"https://example.com/{split}/{i}.jpg"
            records.append({"image": buffer.getvalue(), "texts": text,
                            "key": schema.make_key(url, text), "url": url,
                            "width": image_px, "height": image_px, "original_width": image_px,
                            "original_height": image_px, "sha256": f"{i:064x}",
                            "phash": f"{i:016x}"})
        examples = [tfrecord.encode_example({k: r[k] for k in schema.FEATURES}) for r in records]
        lengths[split] = write_contiguous_shards(data_dir, "bench", split, examples, shards)
    write_tfds_metadata(data_dir, "bench", lengths, description="train_throughput benchmark")
    build_vocab(data_dir, 200)
    open(os.path.join(data_dir, "COMPLETED"), "w").close()  # a finished build: the trainer refuses others


def measure(config_name: str, batch: int, steps: int, data_dir: str, overrides: dict = None,
            run_name: str = "") -> dict:
    """One short run's step times and its compiled step's memory per device (``memory/*``, bytes)."""
    from trainer import train

    config = importlib.import_module(f"trainer.configs.{config_name}").get_config()
    config.data_dir = data_dir
    config.batch_size = batch
    config.total_steps = steps + 1
    config.log_every = 1
    config.checkpoint_every = 10**9
    config.evals = {}
    config.update(overrides or {})
    workdir = os.path.join(WORK, "runs", run_name or config_name)
    shutil.rmtree(workdir, ignore_errors=True)

    marks = []   # after_step runs once the previous step's metrics were fetched

    def after_step(step):
        marks.append((time.perf_counter(), time.process_time()))

    start = time.perf_counter()
    train.train_and_evaluate(config, workdir, after_step=after_step)
    total = time.perf_counter() - start
    wall = np.diff([m[0] for m in marks])[1:]     # drop the interval after compilation
    cpu = np.diff([m[1] for m in marks])[1:]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        memory = {k: v for line in f for k, v in json.loads(line).items() if k.startswith("memory/")}
    return {"config": config_name, "batch": batch, "image_size": config.image_size, **memory,
            "max_text_len": config.max_text_len, "timed_steps": len(wall),
            "median_step_s": float(np.median(wall)), "pairs_per_s": batch / float(np.median(wall)),
            "median_step_cpu_s": float(np.median(cpu)),
            "pairs_per_cpu_s": batch / float(np.median(cpu)),
            "run_including_compile_s": total}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="tiny,b3_bert_mini")
    parser.add_argument("--steps", type=int, default=8, help="timed steps after the first")
    parser.add_argument("--batch", action="append", default=[], help="NAME=B batch override")
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/train_throughput.json)")
    args = parser.parse_args(argv)
    run = record.Run()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    batches = dict(DEFAULT_BATCH, **{k: int(v) for k, v in (b.split("=") for b in args.batch)})

    results = []
    for name in args.configs.split(","):
        config = importlib.import_module(f"trainer.configs.{name}").get_config()
        image_px = int(round(config.image_size * 346 / 289)) + 8
        data_dir = os.path.join(WORK, f"corpus_{image_px}px")
        if not os.path.exists(os.path.join(data_dir, "COMPLETED")):
            write_synthetic_corpus(data_dir, num_pairs=max(256, 2 * batches[name]), image_px=image_px)
        result = measure(name, batches[name], args.steps, data_dir)
        results.append(result)
        print(json.dumps(result), flush=True)

    load = os.getloadavg()
    print(f"\nmachine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print("| config | batch | image | text len | median step (s) | pairs/s | "
          "pairs per CPU-s | first run incl. compile (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['config']} | {r['batch']} | {r['image_size']} | {r['max_text_len']} | "
              f"{r['median_step_s']:.3f} | {r['pairs_per_s']:.1f} | {r['pairs_per_cpu_s']:.1f} | "
              f"{r['run_including_compile_s']:.0f} |")
    run.write("train_throughput", {"configs": results}, args.json)


if __name__ == "__main__":
    main()
