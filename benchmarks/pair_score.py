"""CPU cost per candidate of a pair score (``filters.model_score``, the ``checkpoint`` model).

    python -m benchmarks.pair_score [--config tiny | --workdir W] [--pairs 384] [--repeats 5]

The model: with ``--workdir``, that run's checkpoint; otherwise the
``--config`` model at initialisation, saved as a step-0 checkpoint in a
temporary workdir with a WordPiece vocabulary learned from the pairs'
alt-texts (the cost does not depend on the weights). The pairs: drawn
pictures of the sample (240-400 px a side, JPEG quality 88) with their
alt-texts, as ``samplegen`` makes them.

CPU time is this process's (``time.process_time``: every thread, so XLA's
and TensorFlow's pools count), per candidate, the median of ``--repeats``
passes after one pass that compiles. Reported: the whole ``score`` call
(decode, eval view, both towers, the cosine) and its parts, and the
one-off load and compile.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from benchmarks import record
from benchmarks.harness import Timer, cpu_ms_per_item


def make_pairs(count: int, seed: int = 0):
    """(JPEG bytes, alt-text) of ``count`` drawn pictures of the sample."""
    from samplegen.drawers import content_with_caption
    from samplegen.plan import Recipe
    from samplegen.render import render_bytes

    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        spec, caption = content_with_caption(rng, photo_share=0)
        pairs.append((render_bytes(Recipe(content=spec, size=tuple(spec["size"]))), caption))
    return pairs


def initial_run(config_name: str, texts, workdir: str) -> str:
    """A workdir holding ``config_name``'s model at initialisation (step 0) and a vocabulary of ``texts``."""
    import importlib

    import jax
    import tensorflow as tf

    from trainer import checkpoint, models
    from trainer.configs import compute_dtype
    from trainer.vocab import VOCAB_FILENAME, learn_vocab

    config = importlib.import_module(f"trainer.configs.{config_name}").get_config()
    vocab = learn_vocab(tf.data.Dataset.from_tensor_slices(list(texts)), vocab_size=2000)
    with open(os.path.join(workdir, VOCAB_FILENAME), "w") as f:
        f.write("\n".join(vocab) + "\n")
    config.vocab_path = os.path.join(workdir, VOCAB_FILENAME)
    checkpoint.save_config(config, workdir)
    model = models.build(config.model, vocab_size=len(vocab), dtype=compute_dtype(config))
    variables = model.init(jax.random.key(0), np.zeros((1, config.image_size, config.image_size, 3), np.float32),
                           np.ones((1, config.max_text_len), np.int32))
    state = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {}),
             "step": np.int32(0)}
    saver = checkpoint.Checkpointer(workdir, every=1, keep=1, async_save=False)
    saver.save(0, state, {"step": 0, "batches_consumed": 0}, force=True)
    saver.close()
    return workdir


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tiny", help="trainer config whose initial model is measured")
    parser.add_argument("--workdir", default="", help="a trained run instead (its latest checkpoint)")
    parser.add_argument("--pairs", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=0, help="default: the run's eval_batch_size")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    run = record.Run()

    from filters import model_score
    from trainer.evaluators import chunks, encode_in_batches

    pairs = make_pairs(args.pairs)
    images, texts = [p[0] for p in pairs], [p[1] for p in pairs]
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or initial_run(args.config, texts, scratch)
        kwargs = {"workdir": workdir, **({"batch_size": args.batch_size} if args.batch_size else {})}
        scorer = model_score.PairScorer("checkpoint", **kwargs)
        with Timer() as loading:
            scorer.check()
            scorer.score(images[:1], texts[:1])  # the first batch compiles both towers
        load_s, load_wall_s = loading.cpu_s, loading.wall_s
        model = scorer.model
        encoders, size = model.encoders, model.batch_size
        decoded = [model_score.decode_for_model(data, model.decode_size) for data in images]
        pixels = model.pixels(decoded)
        tokens = encoders.tokenizer.tokenize_numpy(texts)
        n, repeats = len(pairs), args.repeats
        steps = {
            "score (all of it)": cpu_ms_per_item(lambda: scorer.score(images, texts), n, repeats),
            "decode (PIL, DCT-reduced)": cpu_ms_per_item(
                lambda: [model_score.decode_for_model(d, model.decode_size) for d in images], n, repeats),
            "eval view (resize, crop, [-1, 1])": cpu_ms_per_item(lambda: model.pixels(decoded), n, repeats),
            "image tower": cpu_ms_per_item(
                lambda: encode_in_batches(encoders.encode_images, chunks(pixels, size), size), n, repeats),
            "tokenize": cpu_ms_per_item(lambda: encoders.tokenizer.tokenize_numpy(texts), n, repeats),
            "text tower": cpu_ms_per_item(
                lambda: encode_in_batches(encoders.encode_texts, chunks(tokens, size), size), n, repeats),
        }
        figures = {
            "model": {"config": None if args.workdir else args.config, "workdir": args.workdir or None,
                      "image_size": model.image_size, "decode_size": model.decode_size, "batch_size": size},
            "pairs": n, "repeats": repeats, "cpu_ms_per_candidate": steps,
            "load_and_compile_cpu_s": load_s, "load_and_compile_wall_s": load_wall_s,
        }
    for name, value in steps.items():
        print(f"{name:40s} {value:7.3f} CPU-ms per candidate")
    print(f"load and compile: {load_s:.1f} CPU-s ({load_wall_s:.1f} s)")
    run.write("pair_score", figures, args.json)


if __name__ == "__main__":
    main()
