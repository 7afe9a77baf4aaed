"""Per-record image rules, cheap first, and the picture a shard stores.

``read_header`` parses only the header (PIL opens lazily: size, format and
EXIF orientation without decoding pixels), so the size/aspect/format rules
cost microseconds. ``identify`` is the build's one decode in its first pass:
a reduced decode that catches truncated or corrupt data and gives the
image's identity (sha256 of the bytes, 64-bit pHash of the reduced picture).
``stored_picture`` is the second pass's: the bytes a kept record is written
with (the source JPEG as it came, or a re-encode, downscaled if large).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import io
import math
import warnings
from typing import Optional, Tuple

import numpy as np
from PIL import Image

from common.images import SWAPS_SIDES, exif_orientation, open_image, orient, upright_size
from filters import stages
from filters.presets import keeps

@dataclasses.dataclass(frozen=True)
class Header:
    format: str
    width: int  # after EXIF orientation
    height: int
    orientation: int
    mode: str = ""  # the stored pixels' mode (RGB, L, CMYK, P, ...)


def read_header(data: bytes, preset) -> Tuple[Optional[Header], Optional[str]]:
    """Header-only parse: ``(header, None)`` or ``(None, reason)``."""
    header, reason, opened = open_header(data, preset)
    if opened is not None:
        opened.close()
    return header, reason


def open_header(data: bytes, preset) -> Tuple[Optional[Header], Optional[str], Optional[Image.Image]]:
    """``read_header``, and the opened image (not yet decoded) for ``identify`` to decode without opening again."""
    img = None
    try:
        # PIL's own bomb guard warns at its limit and raises at twice it; the
        # preset's ``max_pixels`` is the rule, so PIL's warning is an error here.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = open_image(data)
            fmt = img.format or ""
            mode = img.mode
            width, height = img.size
            orientation = 1
            if fmt in ("JPEG", "MPO", "TIFF", "WEBP", "PNG"):
                orientation = exif_orientation(img)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        return None, stages.reason("image_header", "decompression_bomb"), _closed(img)
    except Exception:
        return None, stages.reason("image_header", "undecodable"), _closed(img)
    if width <= 0 or height <= 0:
        return None, stages.reason("image_header", "undecodable"), _closed(img)
    if not keeps(preset, "max_pixels", width * height):
        return None, stages.reason("image_header", "decompression_bomb"), _closed(img)
    width, height = upright_size((width, height), orientation)
    return Header(fmt, width, height, orientation, mode), None, img


def _closed(img) -> None:
    if img is not None:
        img.close()
    return None


# MPO (CIPA multi-picture format, as cameras write) is a JPEG whose first
# picture any JPEG decoder reads; a "JPEG only" rule means it too.
FORMAT_FAMILY = {"MPO": "JPEG"}


def format_allowed(fmt: str, formats) -> bool:
    return fmt in formats or FORMAT_FAMILY.get(fmt) in formats


def check_header(header: Header, preset) -> Optional[str]:
    """Format, size and aspect rules on header facts; the first failure wins.

    The side of each threshold that is kept comes from ``filters.presets``.
    """
    if not format_allowed(header.format, preset.formats):
        return stages.reason("image_format", "not_allowed")
    shorter, longer = sorted((header.width, header.height))
    if not (keeps(preset, "min_shorter_side", shorter) and keeps(preset, "min_both_sides", shorter)):
        return stages.reason("image_size", "too_small")
    if not keeps(preset, "max_aspect_ratio", longer / shorter):
        return stages.reason("image_aspect", "too_elongated")
    return None


class UnsupportedMode(ValueError):
    """A pixel mode this project cannot turn into RGB without guessing (would be written wrong or blank)."""


# Modes whose values are not 8-bit channels: handled by their range, never by a
# plain convert("RGB"), which clips a float image in [0, 1] to black and a
# 32-bit one to white.
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode to RGB; transparency is composited on white.

    Integer and float modes are scaled by their nominal range: 16-bit by 1/256;
    a 32-bit integer image whose values fit 8 or 16 bits as such; a float image
    with values in [0, 1] by 255, in [0, 255] as is. Anything else (negative or
    wider values, CIELab, unknown modes) raises ``UnsupportedMode``.
    """
    if img.mode in ("RGBa", "La"):  # premultiplied alpha
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    if img.mode in _SIXTEEN_BIT:
        # 16-bit grayscale: scale to 8 bits instead of clipping at 255.
        return img.point(lambda v: v / 256).convert("L").convert("RGB")
    if img.mode in ("I", "F"):
        low, high = img.getextrema()
        if img.mode == "F" and 0 <= low and high <= 1:
            scale = 255
        elif 0 <= low and high <= 255:
            scale = 1
        elif img.mode == "I" and 0 <= low and high <= 65535:
            scale = 1 / 256
        else:
            raise UnsupportedMode(f"{img.mode} image with values in [{low}, {high}]")
        return img.point(lambda v: v * scale).convert("L").convert("RGB")
    if img.mode in ("LAB",):
        raise UnsupportedMode(f"{img.mode} needs a colour profile to become RGB")
    try:
        return img.convert("RGB")
    except ValueError as error:  # a mode Pillow cannot convert
        raise UnsupportedMode(f"{img.mode}: {error}") from error


#: The pHash is taken of the picture reduced to no less than this many pixels a
#: side (libjpeg's DCT scaling for JPEG, as PIL's ``thumbnail`` does); the
#: hash itself resizes to 32x32, so the reduction changes few of its 64 bits.
REDUCED_SIDE = 64
JPEG_FAMILY = ("JPEG", "MPO")


_PRECISION_BITS = 22  # Pillow's fixed-point resampling: 32 - 8 - 2


@functools.lru_cache(maxsize=512)  # reduced pictures come in a few sizes; ~32 kB each
def _lanczos_weights(in_size: int, in0: float, in1: float, out_size: int = 32) -> np.ndarray:
    """Pillow's LANCZOS resampling coefficients (``precompute_coeffs`` + ``normalize_coeffs_8bpc``), as a matrix.

    ``[out_size, in_size]`` fixed-point weights, float64 (exact: integers
    below 2^31), so that a resize is two BLAS products; the box edges are C
    floats in Pillow, hence the float32 rounding.
    """
    in0, in1 = np.float32(in0), np.float32(in1)
    scale = float(np.float32(in1 - in0)) / out_size
    filterscale = max(scale, 1.0)
    support = 3.0 * filterscale
    centers = float(in0) + (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum(np.trunc(centers - support + 0.5), 0)
    xmax = np.minimum(np.trunc(centers + support + 0.5), in_size)
    x = np.arange(in_size)[None, :]
    t = (x - centers[:, None] + 0.5) / filterscale
    with np.errstate(divide="ignore", invalid="ignore"):
        weights = np.where((t >= -3.0) & (t < 3.0), np.sinc(t) * np.sinc(t / 3.0), 0.0)
    weights = np.where((x >= xmin[:, None]) & (x < xmax[:, None]), weights, 0.0)
    total = np.cumsum(weights, axis=1)[:, -1:]  # summed in order, as Pillow does
    weights = np.where(total != 0.0, weights / np.where(total != 0.0, total, 1.0), weights)
    fixed = weights * (1 << _PRECISION_BITS)
    return np.where(fixed < 0, np.trunc(fixed - 0.5), np.trunc(fixed + 0.5))


def _lanczos_32(luma: np.ndarray, box) -> np.ndarray:
    """Pillow's ``resize((32, 32), LANCZOS, box=box)`` of a uint8 matrix, bit for bit (horizontal pass first)."""
    height, width = luma.shape
    x0, y0, x1, y1 = box if box is not None else (0.0, 0.0, float(width), float(height))
    half = float(1 << (_PRECISION_BITS - 1))
    rows = np.floor((luma.astype(np.float64) @ _lanczos_weights(width, x0, x1).T + half) / (1 << _PRECISION_BITS))
    rows = np.clip(rows, 0, 255)
    out = np.floor((_lanczos_weights(height, y0, y1) @ rows + half) / (1 << _PRECISION_BITS))
    return np.clip(out, 0, 255)


def perceptual_hash(img: Image.Image, box=None) -> str:
    """imagehash's 64-bit pHash (greyscale, Lanczos to 32x32, DCT, 8x8 above the median), as hex, bit for bit.

    ``box`` (the region of ``img`` that holds the picture, as ``Image.draft``
    reports it) keeps a reduced decode's padding out of the hash. The
    resize and the 8x8 low-frequency block of the 2-D DCT are small matrix
    products: Pillow recomputes its filter for every call, the largest cost
    of a hash on a reduced picture.
    """
    return _hash_of_small(_lanczos_32(np.asarray(img.convert("L")), box))


def _hash_of_small(pixels: np.ndarray) -> str:
    # scipy's FFT-based DCT, as imagehash: a flat picture's coefficients are
    # exact zeros there (a matrix product leaves rounding noise that the
    # median test would turn into random bits).
    from scipy.fftpack import dct

    low = dct(dct(pixels, axis=0), axis=1)[:8, :8]
    flat = low.reshape(-1)
    middle = np.partition(flat, (31, 32))
    median = (middle[31] + middle[32]) / 2  # numpy's median of 64 values
    return np.packbits(flat > median).tobytes().hex()


@dataclasses.dataclass(frozen=True)
class Identity:
    sha256: str  # of the bytes as read
    phash: str   # of the reduced picture (``perceptual_hash``)


def identify(data: bytes, header: Header, opened: Optional[Image.Image] = None) -> Tuple[Optional[Identity], Optional[str]]:
    """The one decode the first pass gives a picture: ``(identity, None)`` or ``(None, image_decode/...)``.

    JPEGs decode at 1/2, 1/4 or 1/8 scale to luma, never below
    ``REDUCED_SIDE`` a side; libjpeg still reads every coefficient, so
    truncated or corrupt data fails here as in a full decode. Other formats
    decode whole (they have no reduced decode) with ``to_rgb``'s colour rule.
    ``opened``: the image ``open_header`` opened for this header (closed here).
    """
    try:
        with warnings.catch_warnings():
            # The header check already enforced max_pixels.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with (opened if opened is not None else open_image(data)) as img:
                box = None
                if img.format in JPEG_FAMILY:
                    drafted = img.draft("L", (REDUCED_SIDE, REDUCED_SIDE))
                    box = drafted[1] if drafted else None
                img.load()  # raises on truncated or corrupt pixel data
                if img.mode in ("L", "RGB"):
                    picture = img
                elif img.format in JPEG_FAMILY:
                    picture = img.convert("RGB")
                else:
                    picture = to_rgb(img)
                phash = _oriented_hash(picture, box, header.orientation)
    except UnsupportedMode:
        return None, stages.reason("image_decode", "unsupported_mode")
    except Exception:
        return None, stages.reason("image_decode", "corrupt")
    return Identity(hashlib.sha256(data).hexdigest(), phash), None


def _oriented_hash(picture: Image.Image, box, orientation: int) -> str:
    # The hash's 32x32 resize commutes with the EXIF transposes (a square
    # target, a symmetric filter), so the small picture is turned, not the big one.
    if orientation == 1:
        return perceptual_hash(picture, box)
    small = Image.fromarray(_lanczos_32(np.asarray(picture.convert("L")), box).astype(np.uint8))
    return _hash_of_small(np.asarray(orient(small, orientation), np.float64))


def phash_of(data: bytes) -> Optional[str]:
    """The pHash ``identify`` gives these bytes, or None if they do not decode."""
    header, reason = read_header(data, {"max_pixels": 1 << 62})
    if reason:
        return None
    identity, _ = identify(data, header)
    return identity.phash if identity else None


def thumbnail_size(size: Tuple[int, int], max_side: int) -> Tuple[int, int]:
    """The size ``Image.thumbnail((max_side, max_side))`` gives: aspect kept, longer side max_side."""
    width, height = size
    if width <= max_side and height <= max_side:
        return size
    aspect = width / height

    def round_aspect(number, key):
        return max(min(math.floor(number), math.ceil(number), key=key), 1)

    if aspect <= 1:
        return round_aspect(max_side * aspect, key=lambda n: abs(aspect - n / max_side)), max_side
    return max_side, round_aspect(max_side / aspect, key=lambda n: 0 if n == 0 else abs(aspect - max_side / n))


def lanczos2_taps(scale: float) -> np.ndarray:
    """The antialiasing prefilter: Lanczos-2 widened by ``scale`` (>= 1), at whole-pixel offsets, summing to 1."""
    scale = max(scale, 1.0)
    reach = int(math.ceil(2 * scale)) - 1  # the last offset inside the window (|x| < 2): no zero taps to filter with
    x = np.arange(-reach, reach + 1) / scale
    taps = np.sinc(x) * np.sinc(x / 2)
    return (taps / taps.sum()).astype(np.float32)


def resample(pixels: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
    """``pixels`` (rows x columns, uint8, grey or RGB) downscaled to ``size`` = (width, height), all in OpenCV.

    An integer box reduction first while the picture stays over twice the
    target (as ``thumbnail``'s ``reducing_gap=2``, over whole blocks: the
    last ``columns % factor`` columns and ``rows % factor`` rows, less than
    one output pixel, are left out of it); then a Lanczos-2 prefilter
    widened by the scale and bicubic sampling at the output pixels' centres
    in the whole picture.

    Against a float64 Lanczos-3 resample it is closer than the earlier
    resampler (PIL's bicubic kernel as a prefilter, sampled bilinearly: the
    second blur) and about as close as PIL's BICUBIC ``thumbnail``
    (``benchmarks/stored_picture.py``; tests/filters/test_image.py), for
    the earlier one's filter cost, a fraction of PIL's. Bicubic sampling
    alone, cheaper still and closer on smooth photographs, folds detail
    finer than the output's pixels into coarse bands (moire) and loses on
    sharp edges. Cropping and slicing are views, not copies.
    """
    import cv2

    cv2.setNumThreads(1)  # the runner's workers are the parallelism
    width, height = size
    rows, columns = pixels.shape[:2]
    scale_x, scale_y = columns / width, rows / height  # in the pixels being filtered, below
    factor = int(min(scale_x, scale_y) / 2)
    whole = factor > 1 and rows % factor == 0 and columns % factor == 0
    if factor > 1:
        kept_rows, kept_columns = rows - rows % factor, columns - columns % factor
        pixels = cv2.resize(pixels[:kept_rows, :kept_columns], (kept_columns // factor, kept_rows // factor),
                            interpolation=cv2.INTER_AREA)  # whole blocks: OpenCV's box-average path
        scale_x, scale_y = scale_x / factor, scale_y / factor
    filtered = cv2.sepFilter2D(pixels, -1, lanczos2_taps(scale_x), lanczos2_taps(scale_y),
                               borderType=cv2.BORDER_REFLECT)
    if factor <= 1 or whole:
        return cv2.resize(filtered, (width, height), interpolation=cv2.INTER_CUBIC)
    # The dropped rows or columns still belong to the picture: output pixels
    # are sampled where they lie in the whole one (resize would stretch the
    # kept part over the output, shifting the far edge by up to a pixel).
    to_source = np.float64([[scale_x, 0, (scale_x - 1) / 2], [0, scale_y, (scale_y - 1) / 2]])
    return cv2.warpAffine(filtered, to_source, (width, height), flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_REFLECT)


def downscale(rgb: Image.Image, max_side: int, size: Optional[Tuple[int, int]] = None) -> Image.Image:
    """``resample`` of a PIL picture to ``size``, by default the size ``thumbnail((max_side, max_side))`` gives.

    For callers holding a PIL picture; ``stored_picture`` resamples the
    decoded pixels directly.
    """
    return Image.fromarray(resample(np.asarray(rgb), size or thumbnail_size(rgb.size, max_side)))


@dataclasses.dataclass(frozen=True)
class Stored:
    image: bytes  # what gets written: the source JPEG or a re-encode
    width: int
    height: int


def stored_as_read(header: Header, preset) -> bool:
    """Whether a picture is stored as it came: an upright RGB JPEG within ``output_max_side``."""
    max_side = preset.output_max_side
    fits = max_side == 0 or max(header.width, header.height) <= max_side
    return header.format == "JPEG" and header.orientation == 1 and header.mode == "RGB" and fits


def stored_picture(data: bytes, header: Header, preset) -> Tuple[Optional[Stored], Optional[str]]:
    """The bytes the shard stores: ``(stored, None)`` or ``(None, image_decode/...)``.

    An upright RGB JPEG within ``output_max_side`` is stored as it came, not
    decoded at all. Anything else is decoded once (PIL), turned upright, made
    RGB and, if larger, downscaled to the size ``thumbnail`` gives, then
    encoded (PIL, the preset's quality). A picture that is downscaled is
    resampled as decoded (``resample`` on the decoded pixels: grey stays one
    channel) and turned upright and made RGB at the output's size; a JPEG at
    least twice that size is decoded at a DCT scale first (``draft``), as
    ``thumbnail`` does, which leaves it at least twice the target.
    """
    if stored_as_read(header, preset):
        return Stored(data, header.width, header.height), None
    max_side = preset.output_max_side
    needs_resize = max_side > 0 and max(header.width, header.height) > max_side
    target = thumbnail_size((header.width, header.height), max_side) if needs_resize else None
    pixels = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with open_image(data) as img:
                if target is None:
                    img.load()
                    upright = orient(img, header.orientation)
                    picture = upright if upright.mode == "RGB" else to_rgb(upright)
                else:
                    pixels = decoded_pixels(img, header, target)
    except UnsupportedMode:
        return None, stages.reason("image_decode", "unsupported_mode")
    except Exception:
        return None, stages.reason("image_decode", "corrupt")
    if pixels is not None:
        # The stored pixels' sides are the upright ones, maybe swapped; the
        # resample commutes with the turn (symmetric kernels, centred samples),
        # so the small picture is turned, not the large one.
        stored_size = target[::-1] if header.orientation in SWAPS_SIDES else target
        picture = orient(Image.fromarray(resample(pixels, stored_size)), header.orientation)
        if picture.mode != "RGB":  # grey, resampled as one channel
            picture = picture.convert("RGB")
    out = io.BytesIO()
    picture.save(out, format="JPEG", quality=preset.output_jpeg_quality)
    return Stored(out.getvalue(), *picture.size), None


def decoded_pixels(img: Image.Image, header: Header, target: Tuple[int, int]) -> np.ndarray:
    """The stored (not yet upright) pixels a downscale starts from: grey or RGB, one copy out of PIL.

    A JPEG at least twice ``target`` decodes at a DCT scale; libjpeg rounds
    the scaled sides up, and the partial last row and column are left out
    (a view). Modes other than grey and RGB go through ``to_rgb`` first.
    """
    columns, rows = img.size
    if img.format in JPEG_FAMILY:
        wanted = target[::-1] if header.orientation in SWAPS_SIDES else target
        wanted = (2 * wanted[0], 2 * wanted[1])
        if min(columns // wanted[0], rows // wanted[1]) >= 2:  # draft would reduce: otherwise it does nothing
            drafted = img.draft(None, wanted)
            if drafted is not None:
                columns, rows = max(1, int(drafted[1][2])), max(1, int(drafted[1][3]))
    img.load()  # raises on truncated or corrupt pixel data
    pixels = np.asarray(img if img.mode in ("L", "RGB") else to_rgb(img))
    return pixels[:rows, :columns]


def thumbnail_b64(data: Optional[bytes], size: int = 128) -> Optional[str]:
    """A small base64 JPEG for the audit report; None when undecodable."""
    if not data:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with open_image(data) as img:
                if img.size[0] * img.size[1] > 50_000_000:
                    return None
                img.draft("RGB", (size, size))
                img.thumbnail((size, size))
                out = io.BytesIO()
                to_rgb(img).save(out, format="JPEG", quality=80)
    except Exception:
        return None
    return base64.b64encode(out.getvalue()).decode("ascii")
