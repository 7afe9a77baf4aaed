"""Opening encoded images and EXIF orientation, written once.

The filters measure width and height "after EXIF orientation", the NSFW
scorer and the embedders look at the upright picture, and the sample
generator stores pixels so that a viewer's orientation shows the intended
picture: all of them use the one table below (``unorient`` is its inverse).
"""

from __future__ import annotations

import io
from typing import Tuple

from PIL import Image

EXIF_ORIENTATION_TAG = 0x0112

#: EXIF orientation -> the transpose that turns the stored pixels upright
#: (what a viewer applies; the same table as ``PIL.ImageOps.exif_transpose``).
ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

#: Orientations whose upright picture has width and height swapped.
SWAPS_SIDES = frozenset({5, 6, 7, 8})

# Every transpose above is its own inverse except the two quarter turns.
_INVERSE = {Image.Transpose.ROTATE_90: Image.Transpose.ROTATE_270, Image.Transpose.ROTATE_270: Image.Transpose.ROTATE_90}


def open_image(data: bytes) -> Image.Image:
    """``Image.open`` on bytes (lazy: header only); raises on anything PIL cannot identify."""
    return Image.open(io.BytesIO(data))


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation tag (1 = upright); 1 when EXIF is missing or malformed."""
    try:
        return int(image.getexif().get(EXIF_ORIENTATION_TAG, 1) or 1)
    except Exception:  # a broken EXIF block is not a broken image
        return 1


def upright_size(size: Tuple[int, int], orientation: int) -> Tuple[int, int]:
    """(width, height) of the stored pixels -> the upright picture's."""
    width, height = size
    return (height, width) if orientation in SWAPS_SIDES else (width, height)


def orient(image: Image.Image, orientation: int) -> Image.Image:
    """The upright picture of stored pixels with this EXIF orientation."""
    transpose = ORIENTATION_TRANSPOSE.get(orientation)
    return image.transpose(transpose) if transpose is not None else image


def unorient(image: Image.Image, orientation: int) -> Image.Image:
    """The stored pixels that ``orient`` turns into this upright picture."""
    transpose = ORIENTATION_TRANSPOSE.get(orientation)
    return image.transpose(_INVERSE.get(transpose, transpose)) if transpose is not None else image


def draft(image: Image.Image, mode: str, min_size: int) -> Tuple[float, float, float, float]:
    """Let a JPEG decode at 1/2, 1/4 or 1/8 scale, never below ``min_size`` a side.

    Returns the box of the decoded image that covers the original exactly:
    libjpeg rounds scaled sizes up (300 px at 1/8 is 38 rows, not 37.5), and
    resizing those padded rows as image content would shift and stretch the
    picture by up to one scaled pixel, enough to move a fine descriptor.
    """
    if image.format == "JPEG" and min_size:
        drafted = image.draft(mode, (min_size, min_size))
        if drafted is not None:
            return drafted[1]
    return (0.0, 0.0, float(image.width), float(image.height))


def decode_rgb(data: bytes, min_size: int = 0) -> Image.Image:
    """Decode to upright RGB; JPEGs are DCT-downscaled while decoding
    (``draft``) to no less than ``min_size`` on each side."""
    image = open_image(data)
    orientation = exif_orientation(image)
    box = draft(image, "RGB", min_size)
    if box[2] != image.width or box[3] != image.height:
        image = image.resize((max(1, round(box[2])), max(1, round(box[3]))), Image.Resampling.BILINEAR, box=box)
    image = orient(image, orientation)
    return image if image.mode == "RGB" else image.convert("RGB")
