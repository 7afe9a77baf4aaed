"""Pair scores: how well an alt-text fits its image, by a two-tower image-text model.

DataComp's CLIP-score filter and Data Filtering Networks keep the pairs an
image-text model finds consistent; here the model can be one this project
trained on the corpus itself. A pair's score is the cosine of its image
and text embeddings, in [-1, 1].

What the build calls (one object per stage, picklable: it holds only the
model's name and arguments)::

    scorer = PairScorer("checkpoint", **parse_args(["workdir=out/train"]))  # KEY=VALUE, as typed
    scorer.check()                          # the launcher: load now; a bad checkpoint is a ValueError
    scores = scorer.score(image_bytes_list, texts, keys)    # float32 [N]; NaN: the image did not decode
    scores = scorer.score_decoded(rgb_images, texts, keys)  # images already decoded (upright RGB)

``keys`` (the pairs' pipeline keys) matter only to a keyed model, which
scores a pair by its key's fold; others ignore them (they may be omitted).

``score`` decodes each image as the build sees it (upright by its EXIF
orientation, transparency on white, 16-bit scaled: ``filters.image.to_rgb``),
JPEGs DCT-reduced to no less than the model's ``decode_size``, then hands
the model ``batch_size`` pairs at a time. An image that does not decode
gets NaN, never an exception for the whole batch.

One model per process: the model is loaded on first use (on the worker,
never when the graph is built) into a module-level table keyed by the
model's name and arguments, under a lock, so every DoFn instance and every
thread of a worker process shares one copy (a Beam ``Shared`` handle shares
only among the DoFns it is handed to, so it would have to be threaded
through the graph).

A model (what ``register`` adds; ``get`` builds one) has ``name``,
``decode_size`` (the shorter side it needs; 0: full size), ``batch_size``,
``describe()`` (one line for the funnel's note) and
``score_images(images, texts) -> float32 [N]`` over upright RGB PIL images
(a model with ``keyed = True`` gets the pairs' keys as a third argument).
Built in, both ``trainer.pair_score`` (imported only when used: the trainer
and JAX load on the workers that score): ``checkpoint`` (``workdir=``,
``step=``, ``batch_size=``), a ``trainer.train`` run's two towers; and
``crossfit`` (``workdir=``, ``batch_size=``), the K models of a
``trainer.crossfit`` workdir, each pair scored by the model that was
trained without the pair's fold, so that no pair is judged by a model that
saw it (a model scores its own training pairs higher, mismatched ones
too). A user's model::

    from filters import model_score

    @model_score.register("my_clip")
    def my_clip(model_path="", batch_size=32):
        return MyClipPairModel(model_path, batch_size)     # score_images(images, texts) -> cosines

and ``PairScorer("my_clip", model_path="/models/clip.onnx")``. The module
that registers it must be imported wherever the scorer runs (on every
worker), as an extra stage's is: name the model ``MODULE:NAME``
(``--model_score my_models:my_clip``) and each process imports MODULE
before it looks the name up.
"""

from __future__ import annotations

import json
import threading
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np
from PIL import Image

from common.images import exif_orientation, open_image, orient
from filters.image import to_rgb


class PairModel(Protocol):
    name: str
    decode_size: int  # shorter side an image needs when decoded (JPEGs reduce to no less); 0: full size
    batch_size: int

    def describe(self) -> str: ...

    def score_images(self, images: Sequence[Image.Image], texts: Sequence[str]) -> np.ndarray:
        """Upright RGB images and their alt-texts -> float32 [N] cosines."""
        ...


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

_REGISTRY: Dict[str, Callable[..., PairModel]] = {}


def register(name: str):
    """Decorator: ``name`` builds a model with ``factory(**kwargs)``."""
    def wrap(factory):
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"pair model {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return wrap


def names() -> Tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def registered(spec: str) -> str:
    """The registered name a model is given by: ``NAME``, or ``MODULE:NAME`` (imports MODULE, which registers it).

    The module form lets a worker that never imported the user's module find
    the model: the name travels in the job, the import happens where it runs.
    """
    module_name, sep, name = spec.rpartition(":")
    if sep and name not in _REGISTRY:
        import importlib

        try:
            importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"pair model {spec!r}: cannot import {module_name}: {error}") from None
    name = name if sep else spec
    if name not in _REGISTRY:
        where = f" (does {module_name} register it?)" if sep else ""
        raise ValueError(f"unknown pair model {spec!r}{where}; known: {', '.join(names())}")
    return name


def get(name: str, **kwargs) -> PairModel:
    """A new model (no sharing): ``get("checkpoint", workdir=W)``; ``MODULE:NAME`` as ``registered``."""
    return _REGISTRY[registered(name)](**kwargs)


def parse_args(items: Sequence[str]) -> Dict[str, object]:
    """``["workdir=W", "step=100"]`` -> constructor arguments (JSON values, else text).

    The form of ``--model_score_arg KEY=VALUE``; an item without ``=`` is a ValueError.
    """
    from common.cli import key_value_args

    return key_value_args(items, "--model_score_arg")


@register("checkpoint")
def _checkpoint(workdir: str = "", step: Optional[int] = None, batch_size: Optional[int] = None) -> PairModel:
    if not workdir:
        raise ValueError("the checkpoint pair model needs workdir=... (--model_score_arg workdir=DIR)")
    from trainer.pair_score import CheckpointPairModel  # lazy: JAX and TensorFlow load only here

    return CheckpointPairModel(workdir, step=step, batch_size=batch_size)


@register("crossfit")
def _crossfit(workdir: str = "", batch_size: Optional[int] = None) -> PairModel:
    if not workdir:
        raise ValueError("the crossfit pair model needs workdir=... (a trainer.crossfit workdir)")
    from trainer.pair_score import CrossFitPairModel  # lazy: JAX and TensorFlow load only here

    return CrossFitPairModel(workdir, batch_size=batch_size)


# ---------------------------------------------------------------------------
# One model per process
# ---------------------------------------------------------------------------

_MODELS: Dict[Tuple[str, str], PairModel] = {}
_LOCK = threading.Lock()


def _cache_key(name: str, kwargs: Dict[str, object]) -> Tuple[str, str]:
    return name, json.dumps(kwargs, sort_keys=True, default=repr)


def shared_model(name: str, **kwargs) -> PairModel:
    """This process's copy of the model, loaded on the first call."""
    key = _cache_key(name, kwargs)
    with _LOCK:  # one loader at a time: a second thread waits for the first copy, never makes its own
        if key not in _MODELS:
            _MODELS[key] = get(name, **kwargs)
        return _MODELS[key]


# ---------------------------------------------------------------------------
# Decoding and scoring
# ---------------------------------------------------------------------------


def decode_for_model(data: bytes, decode_size: int) -> Image.Image:
    """The upright RGB picture the build keeps, JPEGs DCT-reduced to no less than ``decode_size`` a side.

    The reduction is the trainer's (``decode(S)``: 1/2, 1/4 or 1/8 while the
    shorter side stays >= S), so a checkpoint sees the pixels it was trained on.
    """
    image = open_image(data)
    orientation = exif_orientation(image)
    if decode_size and image.format in ("JPEG", "MPO"):
        image.draft("RGB", (decode_size, decode_size))
    return to_rgb(orient(image, orientation))


class PairScorer:
    """What a build stage holds: a model's name and arguments; the model itself is per process."""

    def __init__(self, name: str, **kwargs):
        registered(name)
        self.name, self.kwargs = name, dict(kwargs)
        _cache_key(name, self.kwargs)  # arguments must be JSON-able, as --model_score_arg gives them

    @property
    def model(self) -> PairModel:
        return shared_model(self.name, **self.kwargs)

    def check(self) -> str:
        """Loads the model in this process (a bad checkpoint raises ``ValueError``); its description."""
        return self.model.describe()

    def score(self, images: Sequence[bytes], texts: Sequence[str], keys: Optional[Sequence[str]] = None) -> np.ndarray:
        """float32 [N] cosines; NaN where the image does not decode."""
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} images but {len(texts)} texts")
        keys = self._keys(keys, len(images))
        model = self.model
        scores = np.full((len(images),), np.nan, np.float32)
        decoded: List[Image.Image] = []
        rows: List[int] = []
        for row, data in enumerate(images):
            try:
                decoded.append(decode_for_model(data, model.decode_size))
                rows.append(row)
            except Exception:  # any decoder failure: NaN for this pair only
                continue
        if rows:
            scores[rows] = self.score_decoded(decoded, [texts[r] for r in rows],
                                              None if keys is None else [keys[r] for r in rows])
        return scores

    def score_decoded(self, images: Sequence[Image.Image], texts: Sequence[str],
                      keys: Optional[Sequence[str]] = None) -> np.ndarray:
        """float32 [N] cosines of upright RGB images (decoded at ``model.decode_size`` or more)."""
        model = self.model
        keys = self._keys(keys, len(images))
        out = np.empty((len(images),), np.float32)
        for start in range(0, len(images), model.batch_size):
            stop = start + model.batch_size
            if keys is None:
                out[start:stop] = model.score_images(images[start:stop], texts[start:stop])
            else:
                out[start:stop] = model.score_images(images[start:stop], texts[start:stop], keys[start:stop])
        return out

    def _keys(self, keys: Optional[Sequence[str]], count: int) -> Optional[List[str]]:
        """The keys a keyed model needs (None for any other model)."""
        if not getattr(self.model, "keyed", False):
            return None
        if keys is None:
            raise ValueError(f"pair model {self.name!r} scores by the pair's key: pass keys")
        if len(keys) != count:
            raise ValueError(f"{count} pairs but {len(keys)} keys")
        return list(keys)

    def __repr__(self):
        return f"PairScorer({self.name!r}, {self.kwargs})"
