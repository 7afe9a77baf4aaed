"""Preprocessing ops by name, so a pipeline reads like the paper (big_vision style).

    train: "decode|resize(346)|random_crop(289)|flip_lr|value_range(-1,1)"
    eval:  "decode|resize(346)|central_crop(289)|value_range(-1,1)"

``get_preprocess_fn(spec, **context)`` turns such a string into one function
``dict -> dict`` over a single example, for ``tf.data.Dataset.map``. Each op is
a factory registered under its name; the text in parentheses is its
arguments (Python literals). Context objects that cannot be written in a
string (the tokenizer) are passed to ``get_preprocess_fn`` and handed to the
ops that take a parameter of that name. (``make_dataset`` tokenises whole
batches after batching, which is much cheaper; the per-example ``tokenize``
op is for other pipelines.)

Random ops are stateless: they draw from the example's ``"_rng"`` entry (a
``[2]`` int64 seed the input pipeline derives from the run seed and the
example's position) and split it, so the output depends only on the seed and
the data, never on thread scheduling or on where a run was resumed.
"""

from __future__ import annotations

import ast
import inspect
from typing import Callable, Dict

import tensorflow as tf

RNG_KEY = "_rng"

Op = Callable[[dict], dict]
_REGISTRY: Dict[str, Callable[..., Op]] = {}


def register(name: str):
    def wrap(factory):
        if name in _REGISTRY:
            raise ValueError(f"preprocessing op {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return wrap


def parse_op(text: str):
    """``"value_range(-1, 1, key='image')"`` -> ``("value_range", (-1, 1), {"key": "image"})``."""
    node = ast.parse(text.strip(), mode="eval").body
    if isinstance(node, ast.Name):
        return node.id, (), {}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        return node.func.id, args, kwargs
    raise ValueError(f"not an op call: {text!r}")


def get_preprocess_fn(spec: str, **context) -> Op:
    """The composition of the ``|``-separated ops of ``spec``."""
    ops = []
    for text in spec.split("|"):
        name, args, kwargs = parse_op(text)
        if name not in _REGISTRY:
            raise KeyError(f"unknown preprocessing op {name!r}; known: {sorted(_REGISTRY)}")
        factory = _REGISTRY[name]
        accepted = inspect.signature(factory).parameters
        extra = {k: v for k, v in context.items() if k in accepted and k not in kwargs}
        ops.append(factory(*args, **kwargs, **extra))

    def preprocess(data: dict) -> dict:
        data = dict(data)
        for op in ops:
            data = op(data)
        return data

    return preprocess


def _split_rng(data: dict, op_name: str):
    """Returns a seed for this op and stores the remaining stream back in ``data``."""
    if RNG_KEY not in data:
        raise KeyError(f"{op_name} is random: the example needs a {RNG_KEY!r} seed")
    seeds = tf.random.experimental.stateless_split(data[RNG_KEY], num=2)
    data[RNG_KEY] = seeds[0]
    return seeds[1]


def _size2(size):
    return (size, size) if isinstance(size, int) else tuple(size)


# ---------------------------------------------------------------------------
# Image ops (uint8 [H, W, 3] until value_range)
# ---------------------------------------------------------------------------


@register("decode")
def decode(size=None, key="image"):
    """Encoded JPEG/PNG/GIF/BMP bytes -> uint8 ``[H, W, 3]`` (greyscale/alpha become RGB).

    With ``size``, a JPEG whose shorter side is at least 2, 4 or 8 times
    ``size`` is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain (libjpeg's
    scaled decoding: several times faster, and an area-averaging downscale),
    never below ``size`` on either side. Meant as ``decode(S)|resize(S)``.
    """
    ratios = (1, 2, 4, 8)

    def decode_any(raw):
        return tf.io.decode_image(raw, channels=3, expand_animations=False)

    def decode_jpeg_scaled(raw):
        shape = tf.io.extract_jpeg_shape(raw)
        shorter = tf.minimum(shape[0], shape[1])
        branch = tf.add_n([tf.cast(shorter // r >= size, tf.int32) for r in ratios[1:]])
        return tf.switch_case(
            branch, [lambda r=r: tf.io.decode_jpeg(raw, channels=3, ratio=r) for r in ratios]
        )

    def op(data):
        raw = data[key]
        if size is None:
            data[key] = decode_any(raw)
        else:
            data[key] = tf.cond(tf.io.is_jpeg(raw), lambda: decode_jpeg_scaled(raw), lambda: decode_any(raw))
        return data

    return op


@register("resize")
def resize(size, key="image", method="bilinear", antialias=True):
    """Resize to ``size`` x ``size`` (or ``(h, w)``), ignoring aspect ratio as ALIGN does.

    ``antialias``: a downscale filters over the whole source footprint (a
    plain bilinear resize samples 2x2 source pixels per output pixel, so a
    4x reduction skips most of the picture and breaks thin strokes). It also
    makes images alike however they arrived: ``decode(S)`` already
    area-reduces large JPEGs, while PNGs (the sample's evaluation images)
    reach ``resize`` at full size.
    """
    height, width = _size2(size)

    def op(data):
        image = data[key]
        resized = tf.image.resize(image, (height, width), method=method, antialias=antialias)
        # Back to the input dtype so later ops move 4x fewer bytes.
        if image.dtype == tf.uint8:
            resized = tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
        data[key] = resized
        return data

    return op


@register("random_crop")
def random_crop(size, key="image"):
    height, width = _size2(size)

    def op(data):
        seed = _split_rng(data, "random_crop")
        image = data[key]
        data[key] = tf.image.stateless_random_crop(image, (height, width, tf.shape(image)[-1]), seed=seed)
        return data

    return op


@register("central_crop")
def central_crop(size, key="image"):
    height, width = _size2(size)

    def op(data):
        image = data[key]
        top = (tf.shape(image)[0] - height) // 2
        left = (tf.shape(image)[1] - width) // 2
        data[key] = tf.image.crop_to_bounding_box(image, top, left, height, width)
        return data

    return op


@register("flip_lr")
def flip_lr(key="image"):
    def op(data):
        seed = _split_rng(data, "flip_lr")
        data[key] = tf.image.stateless_random_flip_left_right(data[key], seed=seed)
        return data

    return op


def _sometimes(name, p, apply, key):
    """The op that replaces ``data[key]`` by ``apply(image, seed)`` with probability ``p``.

    The coin and ``apply``'s seed both come from the example's seed stream.
    """

    def op(data):
        coin_seed, op_seed = tf.unstack(tf.random.experimental.stateless_split(_split_rng(data, name), num=2))
        coin = tf.random.stateless_uniform([], seed=coin_seed)
        image = data[key]
        data[key] = tf.cond(coin < p, lambda: apply(image, op_seed), lambda: image)
        return data

    return op


@register("random_hue")
def random_hue(p=1.0, key="image"):
    """With probability ``p``, rotate the hue by a uniform angle of the whole colour circle.

    Greys, black and white stay as they are; saturation and brightness are
    kept, so shapes and their contrast with the background survive while the
    image no longer says which hue a caption named. (A colour-invariance
    augmentation for a corpus whose captions name colours: the image tower
    cannot match a pair by hue alone and must encode shape and layout.)
    """

    def rotate(image, seed):
        delta = tf.random.stateless_uniform([], seed=seed, minval=-0.5, maxval=0.5)
        return tf.image.adjust_hue(image, delta)

    return _sometimes("random_hue", p, rotate, key)


@register("random_grayscale")
def random_grayscale(p=0.5, key="image"):
    """With probability ``p``, the image's luma (ITU-R 601) in all three channels."""

    def grey(image, seed):
        del seed
        return tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))

    return _sometimes("random_grayscale", p, grey, key)


@register("value_range")
def value_range(vmin=-1.0, vmax=1.0, in_min=0.0, in_max=255.0, key="image"):
    """Linearly maps ``[in_min, in_max]`` to float32 ``[vmin, vmax]``."""
    scale = (vmax - vmin) / (in_max - in_min)

    def op(data):
        data[key] = (tf.cast(data[key], tf.float32) - in_min) * scale + vmin
        return data

    return op


# ---------------------------------------------------------------------------
# Text and bookkeeping ops
# ---------------------------------------------------------------------------


@register("tokenize")
def tokenize(key="texts", out="text", tokenizer=None):
    """Alt-text -> int32 ``[max_len]`` ids with the context's ``Tokenizer``."""
    if tokenizer is None:
        raise ValueError("tokenize needs get_preprocess_fn(..., tokenizer=Tokenizer(...))")

    def op(data):
        data[out] = tokenizer.tokenize(data[key])
        return data

    return op


@register("keep")
def keep(*keys):
    def op(data):
        return {k: data[k] for k in keys}

    return op
