"""The tests' image makers: encoded images of known content, made in one place.

Every maker returns the encoded bytes. Tests that compare hashes, sizes or
pHashes depend on exact bytes, so a maker's recipe (pixels, format, PIL's
save arguments, PIL's default JPEG quality of 75 unless a quality is given)
never changes; a new kind of picture is a new maker.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def encode(image, fmt: str = "JPEG", **save_args) -> bytes:
    """``image`` (a PIL image or an array of pixels) encoded as ``fmt`` with PIL's ``save_args``."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    out = io.BytesIO()
    image.save(out, format=fmt, **save_args)
    return out.getvalue()


def solid(size, colour, fmt: str = "JPEG", mode: str = "RGB", **save_args) -> bytes:
    """One colour all over: the smallest real image of a size."""
    return encode(Image.new(mode, size, colour), fmt, **save_args)


def gradient(width: int, height: int, seed: int = 0, fmt: str = "JPEG") -> bytes:
    """A gradient (real content, so decoders, resizers and hashes have work); JPEG at quality 90."""
    img = Image.new("RGB", (width, height))
    img.putdata([((x * 7 + seed) % 256, (y * 5 + seed) % 256, ((x + y) * 3) % 256) for y in range(height) for x in range(width)])
    return encode(img, fmt, quality=90) if fmt == "JPEG" else encode(img, fmt)


def noise(seed: int, size, cells=None, fmt: str = "JPEG", **save_args) -> bytes:
    """Uniform noise of ``cells`` (width, height; the image's size unless given) blown up to ``size`` by nearest
    neighbour: a distinct sha256 and pHash per seed, and never featureless."""
    cells = tuple(cells or size)
    image = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (cells[1], cells[0], 3), dtype=np.uint8))
    if cells != tuple(size):
        image = image.resize(tuple(size), Image.NEAREST)
    return encode(image, fmt, **save_args)


def noisy_colour(colour, rng, size=(40, 30)) -> bytes:
    """``colour`` with Gaussian noise (sd 12) from ``rng``: JPEG at quality 90, its colour what a model sees."""
    pixels = np.clip(np.asarray(colour, np.float32) + rng.normal(0, 12, (size[1], size[0], 3)), 0, 255)
    return encode(pixels.astype(np.uint8), "JPEG", quality=90)


def tinted(index: int, size, mark) -> bytes:
    """A colour of its own per ``index`` with one pixel set (``mark``: (position, colour)), so that two
    indices whose colours repeat still differ; JPEG at quality 90."""
    img = Image.new("RGB", size, ((37 * index) % 256, (91 * index) % 256, (53 * index) % 256))
    img.putpixel(*mark)
    return encode(img, "JPEG", quality=90)


def with_orientation(image, orientation: int, fmt: str = "JPEG", **save_args) -> bytes:
    """``image`` encoded with an EXIF orientation tag (the tag alone: the pixels are stored as given)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image, fmt, exif=exif.tobytes(), **save_args)


def swatch(seed: int = 0, size=(8, 8)) -> bytes:
    """A small JPEG of a colour of its own per ``seed`` (PIL's default quality): the cheapest real image."""
    return solid(size, (seed % 256, 10, 20))
