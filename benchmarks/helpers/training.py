"""A synthetic shard directory and one short run of the real trainer, timed per step.

Used by ``benchmarks.train_throughput`` and ``benchmarks.accumulation``.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import shutil
import time

import numpy as np

from benchmarks.harness import REPO

WORK = os.path.join(REPO, "benchmarks", "_work", "train_throughput")
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


def corpus_for(config, batch: int) -> str:
    """The synthetic shard directory for ``config``'s image size (pictures a little over its resize, as ALIGN's
    346 for 289), written under ``WORK`` the first time and kept: at least 256 pairs, two batches."""
    image_px = int(round(config.image_size * 346 / 289)) + 8
    data_dir = os.path.join(WORK, f"corpus_{image_px}px")
    if not os.path.exists(os.path.join(data_dir, "COMPLETED")):
        write_synthetic_corpus(data_dir, num_pairs=max(256, 2 * batch), image_px=image_px)
    return data_dir


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
