"""Photographs shipped inside installed packages (scikit-image, scikit-learn) and their crops.

Nothing is downloaded: the files are read straight from the packages' folders.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Dict, Optional, Tuple

import numpy as np
from PIL import Image

from samplegen.scenes import pick


#: name -> ("package:path inside it", grey, subject phrases). The phrases describe the whole
#: photograph; a crop keeps the subject in view often enough for web alt-text.
PHOTOS: Dict[str, Tuple[str, bool, Tuple[str, ...]]] = {
    "astronaut": ("skimage:data/astronaut.png", False, (
        "an astronaut in an orange space suit", "a smiling astronaut in front of a flag",
        "a portrait of an astronaut in a space suit")),
    "coffee": ("skimage:data/coffee.png", False, (
        "a cup of coffee on a saucer", "a red cup of coffee with a spoon", "a cup of coffee on a table")),
    "chelsea": ("skimage:data/chelsea.png", False, (
        "a tabby cat resting on a blanket", "a ginger tabby cat", "the face of a tabby cat")),
    "rocket": ("skimage:data/rocket.jpg", False, (
        "a rocket on the launch pad", "a rocket ready for launch", "a space rocket on the launch pad")),
    "hubble": ("skimage:data/hubble_deep_field.jpg", False, (
        "galaxies in deep space", "distant galaxies in deep space", "stars and galaxies in deep space")),
    "retina": ("skimage:data/retina.jpg", False, (
        "a photo of the retina of an eye", "the retina of a human eye", "blood vessels in the retina of an eye")),
    "tissue": ("skimage:data/ihc.png", False, (
        "stained tissue under a microscope", "a microscope image of stained tissue",
        "cells in stained tissue under a microscope")),
    "motorcycle": ("skimage:data/motorcycle_left.png", False, (
        "a red motorcycle parked in a garage", "a red motorcycle in a workshop", "a motorcycle parked in a garage")),
    "temple": ("sklearn:datasets/images/china.jpg", False, (
        "a chinese temple on a hill above a lake", "a traditional chinese temple",
        "a chinese temple among trees")),
    "flower": ("sklearn:datasets/images/flower.jpg", False, (
        "an orange dahlia flower", "an orange flower in a garden", "a close up of an orange dahlia flower")),
    "cameraman": ("skimage:data/camera.png", True, (
        "a man with a camera on a tripod", "a black and white photo of a photographer",
        "a photographer with a camera on a tripod")),
    "coins": ("skimage:data/coins.png", True, (
        "old coins on a dark background", "a collection of old coins", "a black and white photo of old coins")),
    "moon": ("skimage:data/moon.png", True, (
        "the surface of the moon", "craters on the surface of the moon", "a black and white photo of the moon")),
    "bricks": ("skimage:data/brick.png", True, (
        "a brick wall", "the texture of a brick wall", "a black and white photo of a brick wall")),
    "grass": ("skimage:data/grass.png", True, (
        "grass in a meadow", "the texture of grass", "a black and white photo of grass")),
    "gravel": ("skimage:data/gravel.png", True, (
        "gravel on the ground", "the texture of gravel", "a black and white photo of gravel")),
}
GREY_PHOTOS = tuple(name for name, (_, grey, _) in PHOTOS.items() if grey)
PHOTO_FRAMES = ("", "", "a photo of ", "close up of ", "picture of ", "detail of ", "cropped photo of ")


@functools.lru_cache(maxsize=None)
def load_photo(name: str) -> Image.Image:
    """The photograph as a PIL image (RGB, or L for grey ones), cached per process.

    Read straight from the installed package's folder: importing scikit-learn
    or scikit-image themselves would cost seconds and is not needed.
    """
    source, grey, _ = PHOTOS[name]
    package, path = source.split(":", 1)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"photo {name!r} needs the {package} package installed")
    folder = list(spec.submodule_search_locations)[0]
    with Image.open(os.path.join(folder, path)) as image:
        return image.convert("L" if grey else "RGB")


def sample_photo(rng: np.random.Generator, size: Tuple[int, int], grey: bool = False, photo: Optional[str] = None) -> dict:
    """A crop of a packaged photograph with the aspect of ``size``."""
    name = photo or pick(rng, GREY_PHOTOS if grey else tuple(PHOTOS))
    photo_w, photo_h = load_photo(name).size
    aspect = size[0] / size[1]
    scale = rng.uniform(0.4, 1.0)
    crop_h = scale * min(photo_h, photo_w / aspect)
    crop_w = crop_h * aspect
    x0 = rng.uniform(0, photo_w - crop_w)
    y0 = rng.uniform(0, photo_h - crop_h)
    return {
        "kind": "photo",
        "size": (int(size[0]), int(size[1])),
        "photo": name,
        "box": (round(x0, 2), round(y0, 2), round(x0 + crop_w, 2), round(y0 + crop_h, 2)),
        "scale": round(scale, 3),
        "mirror": bool(rng.random() < 0.3),
    }


def render_photo(spec: dict, size: Tuple[int, int]) -> Image.Image:
    image = load_photo(spec["photo"]).resize(size, Image.Resampling.BICUBIC, box=spec["box"])
    if spec["mirror"]:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return image
