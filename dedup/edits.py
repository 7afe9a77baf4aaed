"""The edits that turn an evaluation image into a near-duplicate copy.

Used by threshold calibration (``dedup.calibrate``) to synthesise positives:
the copies of test images that end up in a web crawl are resized, re-encoded,
colour-graded, blurred, cropped, letterboxed, mirrored or rotated. Each edit
belongs to a family; families are either photometric (pixels change, geometry
stays) or geometric (content moves). The acceptance bar for the training-free
embedder is on the photometric ones; geometric ones are reported honestly.

An edit is a pure function ``(PIL RGB image, numpy Generator) -> PIL image``;
the result is then JPEG-encoded at the edit's quality.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Callable, Dict, List, Sequence

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

#: quality of the JPEG every edited copy is saved as, unless the edit says otherwise
DEFAULT_QUALITY = 90
#: families whose edits keep the geometry (the >= 95% recall bar applies to these)
PHOTOMETRIC_FAMILIES = ("resize", "jpeg", "colour", "blur", "noise", "chain")
GEOMETRIC_FAMILIES = ("crop", "pad", "flip", "rotate")


@dataclasses.dataclass(frozen=True)
class Edit:
    name: str  # "family/variant"
    apply: Callable[[Image.Image, np.random.Generator], Image.Image]
    quality: int = DEFAULT_QUALITY

    @property
    def family(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def photometric(self) -> bool:
        return self.family in PHOTOMETRIC_FAMILIES


def encode_jpeg(image: Image.Image, quality: int = DEFAULT_QUALITY) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, "JPEG", quality=int(quality))
    return buffer.getvalue()


# ---------------------------------------------------------------------------
# Building blocks (pure, deterministic given rng)
# ---------------------------------------------------------------------------


def scale(image: Image.Image, factor: float, min_side: int = 32) -> Image.Image:
    w, h = image.size
    factor = max(factor, min_side / min(w, h))
    return image.resize((max(1, round(w * factor)), max(1, round(h * factor))), Image.Resampling.LANCZOS)


def crop_fraction(image: Image.Image, keep: float, rng: np.random.Generator = None) -> Image.Image:
    """Keep ``keep`` of each side; centred when rng is None, else at a random offset."""
    w, h = image.size
    cw, ch = max(1, round(w * keep)), max(1, round(h * keep))
    if rng is None:
        x, y = (w - cw) // 2, (h - ch) // 2
    else:
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    return image.crop((x, y, x + cw, y + ch))


def shift_hue(image: Image.Image, turns: float) -> Image.Image:
    hsv = np.asarray(image.convert("HSV")).copy()
    hsv[..., 0] = (hsv[..., 0].astype(np.int32) + round(turns * 256)) % 256
    return Image.fromarray(hsv, "HSV").convert("RGB")


def gamma(image: Image.Image, value: float) -> Image.Image:
    table = [round(255 * (i / 255) ** value) for i in range(256)] * 3
    return image.point(table)


def add_noise(image: Image.Image, sigma: float, rng: np.random.Generator) -> Image.Image:
    pixels = np.asarray(image, np.float32)
    noisy = pixels + rng.normal(0.0, sigma, pixels.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def letterbox(image: Image.Image, fill=(0, 0, 0)) -> Image.Image:
    w, h = image.size
    side = max(w, h)
    canvas = Image.new("RGB", (side, side), fill)
    canvas.paste(image, ((side - w) // 2, (side - h) // 2))
    return canvas


def photometric_chain(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A re-upload: downscaled, colour-graded and (by the Edit) re-encoded."""
    image = scale(image, float(rng.uniform(0.4, 0.9)))
    image = ImageEnhance.Brightness(image).enhance(float(rng.uniform(0.8, 1.2)))
    image = ImageEnhance.Contrast(image).enhance(float(rng.uniform(0.8, 1.25)))
    return ImageEnhance.Color(image).enhance(float(rng.uniform(0.6, 1.4)))


# ---------------------------------------------------------------------------
# The families
# ---------------------------------------------------------------------------

EDITS: List[Edit] = [
    Edit("resize/down50", lambda im, rng: scale(im, 0.5)),
    Edit("resize/down25", lambda im, rng: scale(im, 0.25)),
    Edit("resize/up150", lambda im, rng: scale(im, 1.5)),
    Edit("jpeg/q75", lambda im, rng: im, quality=75),
    Edit("jpeg/q50", lambda im, rng: im, quality=50),
    Edit("jpeg/q30", lambda im, rng: im, quality=30),
    Edit("colour/brighter", lambda im, rng: ImageEnhance.Brightness(im).enhance(1.3)),
    Edit("colour/darker", lambda im, rng: ImageEnhance.Brightness(im).enhance(0.7)),
    Edit("colour/contrast_up", lambda im, rng: ImageEnhance.Contrast(im).enhance(1.5)),
    Edit("colour/contrast_down", lambda im, rng: ImageEnhance.Contrast(im).enhance(0.6)),
    Edit("colour/grayscale", lambda im, rng: ImageOps.grayscale(im).convert("RGB")),
    Edit("colour/saturate", lambda im, rng: ImageEnhance.Color(im).enhance(1.8)),
    Edit("colour/hue", lambda im, rng: shift_hue(im, 0.1)),
    Edit("colour/gamma", lambda im, rng: gamma(im, 0.7)),
    Edit("blur/gauss1", lambda im, rng: im.filter(ImageFilter.GaussianBlur(1.0))),
    Edit("blur/gauss2", lambda im, rng: im.filter(ImageFilter.GaussianBlur(2.0))),
    Edit("noise/gauss8", lambda im, rng: add_noise(im, 8.0, rng)),
    Edit("chain/reupload", photometric_chain, quality=60),
    Edit("crop/center875", lambda im, rng: crop_fraction(im, 0.875)),
    Edit("crop/random90", lambda im, rng: crop_fraction(im, 0.9, rng)),
    Edit("crop/random70", lambda im, rng: crop_fraction(im, 0.7, rng)),
    Edit("pad/letterbox", lambda im, rng: letterbox(im)),
    Edit("pad/border10", lambda im, rng: ImageOps.expand(im, border=max(1, round(0.1 * min(im.size))), fill="white")),
    Edit("flip/horizontal", lambda im, rng: ImageOps.mirror(im)),
    Edit("rotate/small", lambda im, rng: im.rotate(float(rng.choice([-5.0, 5.0])), Image.Resampling.BICUBIC)),
    Edit("rotate/90", lambda im, rng: im.transpose(Image.Transpose.ROTATE_90)),
]

EDITS_BY_NAME: Dict[str, Edit] = {e.name: e for e in EDITS}
FAMILIES = tuple(dict.fromkeys(e.family for e in EDITS))


def select(families: Sequence[str] = ()) -> List[Edit]:
    """Edits of the given families ("photometric"/"geometric" name the groups); all if empty."""
    wanted = set()
    for family in families:
        if family == "photometric":
            wanted.update(PHOTOMETRIC_FAMILIES)
        elif family == "geometric":
            wanted.update(GEOMETRIC_FAMILIES)
        elif family in FAMILIES:
            wanted.add(family)
        else:
            raise ValueError(f"unknown edit family {family!r}; known: {', '.join(FAMILIES)}")
    return [e for e in EDITS if not wanted or e.family in wanted]


def apply(edit: Edit, image: Image.Image, rng: np.random.Generator) -> bytes:
    """The edited copy, as the JPEG bytes a crawler would fetch."""
    return encode_jpeg(edit.apply(image.convert("RGB"), rng), edit.quality)
