"""How well an alt-text fits its image, by a trained checkpoint: the cosine of the pair's two embeddings.

    model = CheckpointPairModel(workdir)              # the latest step; or step=S
    scores = model.score_images(images, texts)        # float32 [N], each in [-1, 1]
    model = CrossFitPairModel(workdir)                # a trainer.crossfit workdir: K models
    scores = model.score_images(images, texts, keys)  # each pair by the model that never saw its fold

``images`` are upright RGB PIL images (any size), ``texts`` the alt-texts
(as the corpus writes them: normalised). Each image takes the trainer's
evaluation view, with the trainer's own preprocessing ops: resize to
``resize_size`` (antialiased bilinear, aspect ignored, as ALIGN), central
crop to ``image_size``, values to [-1, 1]; each text the run's tokenizer.
Both towers are ``checkpoint.Encoders`` (compiled as the run compiled them),
so a pair gets the cosine ``trainer.embed`` gives it, up to how the image
was decoded (``decode_size``).

``decode_size`` is the shorter side a decoder should keep: the trainer
decodes a JPEG DCT-reduced (1/2, 1/4, 1/8) to no less than ``resize_size``,
and a caller that does the same (PIL's ``draft``) gets the trainer's
pixels up to the IDCT's rounding (PIL's is libjpeg's accurate one, the
trainer's TensorFlow's fast one).

Batches: images and texts go through the towers ``batch_size`` at a time
(default: the run's ``eval_batch_size``), the last batch padded, so each
tower compiles once. A problem with the checkpoint (no such directory, not
a training run, no checkpoint, a vocabulary or a model that does not match
it) is a one-line ``ValueError``.
"""

from __future__ import annotations

import os
import re
from typing import Optional, Sequence

import numpy as np

from trainer import checkpoint
from trainer.evaluators import chunks, encode_in_batches
from trainer.input_pipeline import RESIZE_RATIO


class CheckpointPairModel:
    """Both towers of one of this project's checkpoints, scoring pairs."""

    name = "checkpoint"

    def __init__(self, workdir: str, step: Optional[int] = None, batch_size: Optional[int] = None):
        self.encoders = load_encoders(workdir, step)
        config = self.encoders.config
        self.workdir, self.step = workdir, self.encoders.step
        self.image_size = self.encoders.image_size
        self.decode_size = int(self.encoders.resize_size or round(self.image_size * RESIZE_RATIO))
        self.batch_size = int(batch_size or config.get("eval_batch_size", 64))
        self._view = _eval_view(self.image_size, self.decode_size)

    def describe(self) -> str:
        return f"checkpoint {self.workdir} step {self.step}"

    def pixels(self, images: Sequence) -> np.ndarray:
        """Upright RGB PIL images -> float32 ``[N, S, S, 3]`` in [-1, 1], the trainer's eval view."""
        arrays = [np.asarray(image.convert("RGB") if image.mode != "RGB" else image, np.uint8) for image in images]
        out = np.empty((len(arrays), self.image_size, self.image_size, 3), np.float32)
        for start, stop in padded_groups([a.shape for a in arrays], GROUP_PIXELS):
            group = arrays[start:stop]
            height, width = max(a.shape[0] for a in group), max(a.shape[1] for a in group)
            padded = np.zeros((len(group), height, width, 3), np.uint8)
            for i, array in enumerate(group):
                padded[i, : array.shape[0], : array.shape[1]] = array
            sizes = np.array([a.shape[:2] for a in group], np.int32)
            out[start:stop] = self._view(padded, sizes).numpy()
        return out

    def score_images(self, images: Sequence, texts: Sequence[str]) -> np.ndarray:
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} images but {len(texts)} texts")
        if not len(images):
            return np.zeros((0,), np.float32)
        encoders, size = self.encoders, self.batch_size
        image_vectors = encode_in_batches(encoders.encode_images, chunks(self.pixels(images), size), size)
        tokens = encoders.tokenizer.tokenize_numpy([str(t) for t in texts])
        text_vectors = encode_in_batches(encoders.encode_texts, chunks(tokens, size), size)
        return np.einsum("nd,nd->n", image_vectors, text_vectors).astype(np.float32)


class CrossFitPairModel:
    """The K models of a ``trainer.crossfit`` workdir: a pair of fold k is scored by model k, the one trained
    without fold k (``common.schema.fold_of`` of the pair's key), so no pair is judged by a model that saw it.

    ``keyed``: its ``score_images`` takes the pairs' keys too (``filters.model_score.PairScorer`` passes them).
    """

    name = "crossfit"
    keyed = True

    def __init__(self, workdir: str, batch_size: Optional[int] = None):
        import json

        from trainer.crossfit import MANIFEST

        path = os.path.join(workdir, MANIFEST)
        if not os.path.isfile(path):
            raise ValueError(f"model score crossfit {workdir}: no {MANIFEST}, not a finished trainer.crossfit "
                             "workdir (run python -m trainer.crossfit, or name one run with --model_score checkpoint)")
        try:
            with open(path, encoding="utf-8") as f:
                manifest = json.load(f)
            self.folds, names = int(manifest["folds"]), list(manifest["models"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"model score crossfit {workdir}: {MANIFEST} does not parse ({error})") from None
        if self.folds < 2 or len(names) != self.folds:
            raise ValueError(f"model score crossfit {workdir}: {MANIFEST} names {len(names)} models for "
                             f"{self.folds} folds")
        self.workdir = workdir
        self.models = [CheckpointPairModel(os.path.join(workdir, name), batch_size=batch_size) for name in names]
        if len({(m.image_size, m.decode_size) for m in self.models}) != 1:
            raise ValueError(f"model score crossfit {workdir}: its models see images at different sizes")
        self.decode_size, self.batch_size = self.models[0].decode_size, self.models[0].batch_size

    def describe(self) -> str:
        steps = ", ".join(str(m.step) for m in self.models)
        return (f"crossfit {self.workdir}: {self.folds} models (steps {steps}), each pair by the one trained "
                "without its fold")

    def score_images(self, images: Sequence, texts: Sequence[str], keys: Sequence[str]) -> np.ndarray:
        from common.schema import fold_of

        if not len(images) == len(texts) == len(keys):
            raise ValueError(f"{len(images)} images, {len(texts)} texts and {len(keys)} keys")
        folds = np.array([fold_of(key, self.folds) for key in keys], np.int64)
        out = np.empty((len(images),), np.float32)
        for fold, model in enumerate(self.models):
            rows = np.flatnonzero(folds == fold)
            if rows.size:
                out[rows] = model.score_images([images[r] for r in rows], [texts[r] for r in rows])
        return out


#: Pixels of one padded group of images handed to the eval view at once (uint8: 3 bytes each).
GROUP_PIXELS = 8_000_000


def padded_groups(shapes: Sequence[tuple], budget: int = GROUP_PIXELS):
    """``(start, stop)`` runs of images whose padded batch (count x tallest x widest) fits ``budget`` pixels.

    One TensorFlow call per image costs more than the resize itself (~1 CPU-ms
    of call overhead), so images go in groups; the budget keeps one large
    picture from padding a whole batch to its size (a lone image over it is
    its own group).
    """
    start, height, width = 0, 0, 0
    for index, shape in enumerate(shapes):
        grown_h, grown_w = max(height, shape[0]), max(width, shape[1])
        if index > start and (index - start + 1) * grown_h * grown_w > budget:
            yield start, index
            start, grown_h, grown_w = index, shape[0], shape[1]
        height, width = grown_h, grown_w
    if start < len(shapes):
        yield start, len(shapes)


def _eval_view(image_size: int, resize_size: int):
    """Padded uint8 ``[B, H, W, 3]`` and true sizes ``[B, 2]`` -> float32 ``[B, S, S, 3]``: the
    trainer's eval ops after its decode, each image cut to its size first."""
    import tensorflow as tf

    from trainer import preprocess

    ops = preprocess.get_preprocess_fn(f"resize({resize_size})|central_crop({image_size})|value_range(-1,1)")

    def one(args):
        padded, size = args
        return ops({"image": padded[: size[0], : size[1]]})["image"]

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8), tf.TensorSpec([None, 2], tf.int32)],
                 autograph=False)
    def view(padded, sizes):
        return tf.map_fn(one, (padded, sizes), fn_output_signature=tf.TensorSpec([image_size, image_size, 3],
                                                                                  tf.float32))

    return view


def load_encoders(workdir: str, step: Optional[int] = None) -> checkpoint.Encoders:
    """``checkpoint.Encoders`` of a run, with every way it can be wrong as one ``ValueError`` line."""
    where = f"model score checkpoint {workdir}"
    if not os.path.isdir(workdir):
        raise ValueError(f"{where}: no such directory")
    if not os.path.isfile(os.path.join(workdir, checkpoint.CONFIG_FILE)):
        raise ValueError(f"{where}: no {checkpoint.CONFIG_FILE}, not a trainer.train workdir")
    try:
        config = checkpoint.load_config(workdir)
    except ValueError as error:  # json.JSONDecodeError is one
        raise ValueError(f"{where}: {checkpoint.CONFIG_FILE} does not parse ({error})") from None
    model = config.get("model") or {}
    if model.get("name") != "two_tower" or "image" not in model or "text" not in model:
        raise ValueError(f"{where}: its config is not a two-tower image-text model "
                         f"(model.name {model.get('name')!r})")
    vocab = checkpoint.vocab_file(workdir, config)
    if not os.path.isfile(vocab):
        raise ValueError(f"{where}: its vocabulary {vocab} is missing")
    if step is None:
        step = checkpoint.latest_step(workdir)
        if step is None:
            raise ValueError(f"{where}: no checkpoint in {os.path.join(workdir, checkpoint.CHECKPOINT_DIR)}")
    try:
        return checkpoint.Encoders(workdir, step)
    except FileNotFoundError as error:
        raise ValueError(f"{where}: {error}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{where}: step {step} does not fit the model its config.json describes "
                         f"({_first_sentence(error)})") from None


def _first_sentence(error: Exception) -> str:
    """orbax explains a mismatch over many lines (whole trees of shapes); the start names it."""
    text = " ".join(str(error).split()) or type(error).__name__
    tree = re.match(r"(.*?do not match):\s*([\w.]+):", text)
    if tree:
        return f"{tree.group(1)} at {tree.group(2)}"
    return text.split(". ")[0].rstrip(":.")[:240]
