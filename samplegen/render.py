"""Rendering and encoding: a recipe -> the image bytes a crawler would have stored.

Runs in worker processes (``Workers``) and is pure: the same recipe gives the
same bytes in any process. Encodings cover every format case (JPEG variants,
EXIF orientation, PNG modes, GIF/WebP animations, MPO, TIFF, ICO, ...);
``truncated`` and ``bomb_png`` make the faulty ones.
"""

from __future__ import annotations

import io
import multiprocessing
import threading
from typing import List

import numpy as np
from PIL import Image, ImageEnhance

from common.images import EXIF_ORIENTATION_TAG, unorient
from samplegen import content, photos, scenes
from samplegen.faults import bomb_png
from samplegen.plan import Recipe


def _save(image: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **params)
    return out.getvalue()


def _apply_edit(image: Image.Image, edit: tuple) -> Image.Image:
    if not edit:
        return image
    name, *args = edit
    if name == "resize":
        w, h = image.size
        return image.resize((round(w * args[0]), round(h * args[0])), Image.Resampling.LANCZOS)
    if name == "brightness":
        return ImageEnhance.Brightness(image).enhance(args[0])
    if name == "contrast":
        return ImageEnhance.Contrast(image).enhance(args[0])
    if name == "mirror":
        return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if name == "jpeg":
        return image
    raise ValueError(f"unknown edit {name!r}")


def _frames(first: Image.Image, count: int) -> List[Image.Image]:
    """Frames of an animation: the picture drifting a few pixels."""
    frames = [first]
    for k in range(1, count):
        frames.append(first.transform(first.size, Image.Transform.AFFINE, (1, 0, -3 * k, 0, 1, -2 * k),
                                      resample=Image.Resampling.BILINEAR, fillcolor=first.getpixel((0, 0))))
    return frames


def render_bytes(recipe: Recipe) -> bytes:
    """The encoded image of a recipe."""
    if recipe.raw is not None:
        return recipe.raw
    kind, *params = recipe.encode
    if kind == "bomb_png":
        return bomb_png(*recipe.header_size)
    image = _apply_edit(content.render(recipe.content, recipe.size), recipe.edit)
    rgb = image.convert("RGB")
    if kind == "jpeg":
        quality = params[0]
        extra = params[1] if len(params) > 1 else {}
        return _save(rgb, "JPEG", quality=quality, **extra)
    if kind == "jpeg_cmyk":
        return _save(rgb.convert("CMYK"), "JPEG", quality=params[0])
    if kind == "jpeg_grey":
        return _save(image.convert("L"), "JPEG", quality=params[0])
    if kind == "jpeg_exif":
        orientation = params[0]
        exif = Image.Exif()
        exif[EXIF_ORIENTATION_TAG] = orientation
        return _save(unorient(rgb, orientation), "JPEG", quality=88, exif=exif.tobytes())
    if kind == "truncated":
        fmt, fraction = params
        whole = _save(rgb, fmt, **({"quality": 88} if fmt == "JPEG" else {}))
        return whole[: int(len(whole) * fraction)]
    if kind == "png":
        mode = params[0]
        if mode == "RGBA":
            # Transparent where the (plain white) background shows: composited on
            # white, as the pipeline does, it is the drawn picture again.
            background = np.array(scenes.BACKGROUNDS["white"], np.int16)
            alpha = (np.abs(np.asarray(rgb, np.int16) - background).sum(axis=2) > 6).astype(np.uint8) * 255
            rgba = rgb.copy()
            rgba.putalpha(Image.fromarray(alpha, "L"))
            return _save(rgba, "PNG")
        if mode == "P":
            return _save(rgb.quantize(64), "PNG")
        if mode == "I;16":
            grey = np.asarray(image.convert("L"), np.uint16) * 257
            return _save(Image.fromarray(grey), "PNG")
        return _save(rgb, "PNG")
    if kind == "gif":
        animated = params[0]
        frames = [f.quantize(128) for f in _frames(rgb, 3 if animated else 1)]
        return _save(frames[0], "GIF", save_all=animated, append_images=frames[1:], duration=200, loop=0)
    if kind == "webp":
        animated = params[0]
        frames = _frames(rgb, 3 if animated else 1)
        return _save(frames[0], "WEBP", quality=85, save_all=animated, append_images=frames[1:], duration=200)
    if kind == "mpo":
        return _save(rgb, "MPO", quality=88, save_all=True, append_images=[rgb.transpose(Image.Transpose.FLIP_LEFT_RIGHT)])
    if kind == "tiff":
        return _save(rgb, "TIFF", compression="tiff_lzw")
    if kind == "ico":
        return _save(rgb, "ICO", sizes=[rgb.size])
    if kind in ("BMP", "PPM", "TGA", "PCX", "JPEG2000"):
        return _save(rgb, kind)
    raise ValueError(f"unknown encoding {kind!r}")


class Workers:
    """``map`` over a process pool (or in this process); results come back in order.

    Every task is a pure function of its input, so the number of processes
    never changes the output. Forked after the photographs are loaded, so the
    workers share them.
    """

    def __init__(self, processes: int):
        self.processes = processes
        self.pool = None

    def __enter__(self):
        if self.processes > 1:
            for name in photos.PHOTOS:
                photos.load_photo(name)
            # fork shares the loaded photographs; but forking a process that
            # already runs threads (Beam, gRPC, TF in a test session) can deadlock.
            methods = multiprocessing.get_all_start_methods()
            method = "fork" if "fork" in methods and threading.active_count() == 1 else "spawn"
            self.pool = multiprocessing.get_context(method).Pool(self.processes)
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None

    def map(self, fn, items: list, chunksize: int = 16) -> list:
        if self.pool is None or len(items) < 4 * chunksize:
            return [fn(item) for item in items]
        return self.pool.map(fn, items, chunksize=chunksize)


def thumbnail(spec: dict) -> Image.Image:
    return content.render(spec, (32, 32)).convert("L")


def render_png(spec: dict) -> bytes:
    """The content at its own size as a PNG (the evaluation images)."""
    return _save(content.render(spec), "PNG")
