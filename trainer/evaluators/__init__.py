"""Evaluators by name: ``get(name)(**kwargs).run(encode_images, encode_texts)``.

``encode_images``: np.float32 ``[B, S, S, 3]`` in [-1, 1] -> np ``[B, D]``;
``encode_texts``: np.int32 ``[B, L]`` token ids -> np ``[B, D]``; both
L2-normalised. Every call gets exactly ``batch_size`` rows (the last batch is
padded by repeating its final row and the padding is dropped from the
output), so a jitted or mesh-sharded encoder compiles once. ``run`` returns
``dict[str, float]``.

Adding an evaluator is one module plus one line in ``_EVALUATORS``. Modules
are imported on first use, so asking for one does not import the others.
This module also holds the helpers the evaluators share: batched encoding,
reading a labelled image folder, and ``build``, which turns a config's
``evals`` into evaluators (the trainer and ``trainer.evaluate`` both use it).
"""

from __future__ import annotations

import importlib
import os
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

_EVALUATORS = {
    "retrieval": "trainer.evaluators.retrieval:RetrievalEvaluator",
    "zeroshot": "trainer.evaluators.zeroshot:ZeroShotEvaluator",
    "knn": "trainer.evaluators.knn:KnnEvaluator",
    "gallery": "trainer.evaluators.gallery:GalleryEvaluator",
    "karpathy": "trainer.evaluators.karpathy:KarpathyRetrievalEvaluator",
}

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def names() -> list[str]:
    return sorted(_EVALUATORS)


def get(name: str):
    """The evaluator class registered as ``name``."""
    if name not in _EVALUATORS:
        raise KeyError(f"unknown evaluator {name!r}; known: {names()}")
    module, attribute = _EVALUATORS[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def build(evals: dict, *, context: dict, data_dir: str, eval_dir: Optional[str]) -> list:
    """``[(name, every, evaluator)]`` from a config's ``evals`` (see ``trainer.configs``).

    Each entry is the evaluator's kwargs plus ``type`` (registry name,
    default: the entry's name) and ``every``. String values may use
    ``{data_dir}`` and ``{eval_dir}``; an entry that needs ``eval_dir`` when
    there is none is skipped. ``context`` (tokenizer, image_size, ...) fills
    the constructor parameters the entry does not set.
    """
    import inspect

    from absl import logging

    built = []
    for name, entry in (evals or {}).items():
        entry = dict(entry)
        kind, every = entry.pop("type", name), entry.pop("every", None)
        if any("{eval_dir}" in v for v in entry.values() if isinstance(v, str)) and not eval_dir:
            logging.info("evaluator %s skipped: it needs config.eval_dir", name)
            continue
        kwargs = {k: v.format(data_dir=data_dir, eval_dir=eval_dir) if isinstance(v, str) else v
                  for k, v in entry.items()}
        cls = get(kind)
        accepted = inspect.signature(cls.__init__).parameters
        kwargs = {**{k: v for k, v in context.items() if k in accepted}, **kwargs}
        built.append((name, every, cls(**kwargs)))
    return built


def encode_in_batches(encode: Callable, batches: Iterable[np.ndarray], batch_size: int) -> np.ndarray:
    """Concatenated ``encode`` outputs; short batches padded to ``batch_size`` and unpadded."""
    outputs = []
    for batch in batches:
        batch = np.asarray(batch)
        rows = len(batch)
        if rows > batch_size:
            raise ValueError(f"batch of {rows} > batch_size {batch_size}")
        if rows < batch_size:
            batch = np.concatenate([batch, np.repeat(batch[-1:], batch_size - rows, axis=0)])
        outputs.append(np.asarray(encode(batch), dtype=np.float32)[:rows])
    if not outputs:
        raise ValueError("nothing to encode")
    return np.concatenate(outputs)


def chunks(array: np.ndarray, size: int):
    return (array[i : i + size] for i in range(0, len(array), size))


def image_folder(root: str):
    """``<root>/<class>/*.{jpg,jpeg,png}`` -> (paths, labels, class_names), sorted.

    Works for local and gs:// roots. Class names are the directory names.
    """
    import tensorflow as tf

    class_names = sorted(
        name.rstrip("/") for name in tf.io.gfile.listdir(root) if tf.io.gfile.isdir(os.path.join(root, name))
    )
    paths, labels = [], []
    for label, name in enumerate(class_names):
        files = sorted(
            f for f in tf.io.gfile.listdir(os.path.join(root, name)) if f.lower().endswith(IMAGE_EXTENSIONS)
        )
        paths += [os.path.join(root, name, f) for f in files]
        labels += [label] * len(files)
    if not paths:
        raise FileNotFoundError(f"no images under {root}/<class>/")
    return paths, np.asarray(labels, dtype=np.int64), class_names


def encode_image_files(
    encode_images: Callable, paths: Sequence[str], *, image_size: int, resize_size, batch_size: int
) -> np.ndarray:
    """Eval-preprocessed (resize, central crop, [-1, 1]) image files -> embeddings."""
    import tensorflow as tf

    from trainer import preprocess
    from trainer.input_pipeline import image_preprocess

    pp = preprocess.get_preprocess_fn(image_preprocess(image_size, resize_size, train=False))
    images = (
        tf.data.Dataset.from_tensor_slices(list(paths))
        .map(lambda path: pp({"image": tf.io.read_file(path)})["image"], num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch_size)
        .prefetch(2)
    )
    return encode_in_batches(encode_images, images.as_numpy_iterator(), batch_size)
