"""The calibration images: disjoint crops of real photographs shipped in installed packages.

The photographs come with scikit-image and scikit-learn (nothing is
downloaded). Disjoint crops share no pixels, so they are distinct images;
crops of one photograph can look alike, which makes them hard negatives.
"""

from __future__ import annotations

import dataclasses
from typing import List, Tuple

import numpy as np
from PIL import Image

# Real photographs shipped inside installed packages (no download), read
# straight from the package folders (skimage.data's loaders are slow to
# import). Left out on purpose: drawings and synthetic images (logo,
# chessboard, color, phantom, page), binary masks (horse), near-empty frames
# (clock_motion, cell), the right stereo view of the motorcycle (a
# near-duplicate of the left one).
SKIMAGE_PHOTOS = (
    "astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "hubble_deep_field.jpg", "retina.jpg",
    "ihc.png", "motorcycle_left.png", "camera.png", "moon.png", "coins.png", "grass.png", "gravel.png",
    "brick.png", "text.png",
)  # fmt: skip
SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")


def real_photographs() -> List[Tuple[str, np.ndarray]]:
    """(name, uint8 RGB [H, W, 3]) for every shipped photograph, in a fixed order."""
    import importlib.util
    import os

    def package_folder(package: str) -> str:
        # find_spec of a top-level package locates it without importing it.
        return importlib.util.find_spec(package).submodule_search_locations[0]

    folders = [
        (os.path.join(package_folder("skimage"), "data"), SKIMAGE_PHOTOS),
        (os.path.join(package_folder("sklearn"), "datasets", "images"), SKLEARN_PHOTOS),
    ]
    photos = []
    for folder, filenames in folders:
        for filename in filenames:
            with Image.open(os.path.join(folder, filename)) as image:
                photos.append((filename.split(".")[0], np.asarray(image.convert("RGB"))))
    return photos


@dataclasses.dataclass(frozen=True)
class Crop:
    photo: str
    box: Tuple[int, int, int, int]  # left, top, right, bottom
    pixels: np.ndarray = dataclasses.field(repr=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.photo}@{','.join(map(str, self.box))}"


def disjoint_boxes(
    width: int, height: int, rng: np.random.Generator, min_side: int, max_side: int, max_aspect: float = 2.0
) -> List[Tuple[int, int, int, int]]:
    """A random guillotine partition of the photograph into disjoint boxes.

    Boxes are split along their longer side until both sides are <= max_side,
    and, below that, at random, so sizes vary between min_side and max_side.
    """
    boxes, stack = [], [(0, 0, width, height)]
    while stack:
        left, top, right, bottom = stack.pop()
        w, h = right - left, bottom - top
        longer = max(w, h)
        can_split = longer >= 2 * min_side
        must_split = longer > max_side or longer > max_aspect * min(w, h)
        if can_split and (must_split or rng.random() < 0.35):
            cut = int(rng.integers(min_side, longer - min_side + 1))
            if w >= h:
                stack += [(left, top, left + cut, bottom), (left + cut, top, right, bottom)]
            else:
                stack += [(left, top, right, top + cut), (left, top + cut, right, bottom)]
        elif min(w, h) >= min_side and longer <= max_aspect * min(w, h):
            boxes.append((left, top, right, bottom))
    return sorted(boxes)


def luma_contrast(pixels: np.ndarray) -> float:
    luma = pixels[..., :3].astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    return float(luma.std())


def make_crops(
    seed: int = 0, min_side: int = 64, max_side: int = 256, min_contrast: float = 10.0
) -> List[Crop]:
    """Disjoint crops of all shipped photographs, shuffled with ``seed``.

    Crops with a luma standard deviation below ``min_contrast`` (black sky,
    fundus background) are left out: a blank evaluation image has no
    near-duplicates to speak of, only other blank images.
    """
    rng = np.random.default_rng(seed)
    crops = []
    for photo, pixels in real_photographs():
        height, width = pixels.shape[:2]
        for box in disjoint_boxes(width, height, rng, min_side, max_side):
            left, top, right, bottom = box
            patch = pixels[top:bottom, left:right]
            if luma_contrast(patch) >= min_contrast:
                crops.append(Crop(photo, box, np.ascontiguousarray(patch)))
    order = rng.permutation(len(crops))
    return [crops[i] for i in order]
