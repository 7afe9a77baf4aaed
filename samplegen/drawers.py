"""Drawers: functions that fill a unit's rows with content, alt-text and recipe.

``pictured`` draws a picture (scene or photo crop) per row, worded from what
it shows unless the case fixes the alt-text; ``fixed_bytes`` gives rows bytes
that are not a rendered picture (garbage, an HTML page, ...).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import numpy as np

from samplegen import content, photos, scenes
from samplegen.plan import CLEAN, Recipe, Unit, ordinary_length


def ordinary_size(rng) -> Tuple[int, int]:
    shorter = int(rng.integers(240, 401))
    longer = int(round(shorter * rng.uniform(1.0, 1.6)))
    return (longer, shorter) if rng.random() < 0.6 else (shorter, longer)


def draw_content(rng, size=None, photo_share=0.2, grey=False, **scene_args) -> dict:
    size = tuple(size) if size else ordinary_size(rng)
    if photo_share and rng.random() < photo_share:
        return photos.sample_photo(rng, size, grey=grey, **{k: v for k, v in scene_args.items() if k == "photo"})
    scene_args.pop("photo", None)
    for _ in range(50):
        spec = scenes.sample_scene(rng, size, grey=grey, **scene_args)
        if spec is not None:
            return spec
    raise RuntimeError(f"no scene layout fits {size}")


def draw_caption(spec, rng, accept=ordinary_length) -> Optional[str]:
    for _ in range(40):
        caption = content.describe(spec, rng)
        if accept(caption):
            return caption
    return None


def content_with_caption(rng, accept=ordinary_length, **content_args) -> Tuple[dict, str]:
    for _ in range(200):
        spec = draw_content(rng, **content_args)
        caption = draw_caption(spec, rng, accept)
        if caption is not None:
            return spec, caption
    raise RuntimeError("no alt-text satisfies the case's constraint")


def pictured(encode=("jpeg", 88), size=None, accept=ordinary_length, transform=None, caption=None,
             reported=None, describes=None, **content_args):
    """A drawer: one picture (drawn content) per row, worded unless ``caption`` is fixed.

    ``describes``: does the alt-text describe the row's picture (its pairing is
    then ``CLEAN``)? By default only when it is worded from the picture and not
    transformed; a case whose fixed or transformed alt-text still says what the
    picture shows passes True.
    """
    if describes is None:
        describes = caption is None and transform is None

    def draw(unit: Unit, rng):
        for row in unit.rows:
            if caption is None:
                spec, text = content_with_caption(rng, accept, size=size, **content_args)
            else:
                spec, text = draw_content(rng, size=size, **content_args), caption
            row.caption = transform(text, rng) if transform else text
            row.recipe = Recipe(content=spec, size=tuple(spec["size"]), encode=encode)
            row.pairing = CLEAN if describes else None
            if reported is not None:
                row.reported_size = reported
    draw.fixed_caption = caption is not None
    return draw


def fixed_bytes(make: Callable[[np.random.Generator], bytes], caption: Optional[str] = None, ext="jpg"):
    """A drawer for rows whose bytes are not a picture we render (garbage, html, ...)."""

    def draw(unit: Unit, rng):
        for row in unit.rows:
            _, text = content_with_caption(rng)
            row.caption = text if caption is None else caption
            row.recipe = Recipe(raw=make(rng))
            row.reported_size = None
            row.url_ext = ext
    draw.fixed_caption = caption is not None
    return draw
