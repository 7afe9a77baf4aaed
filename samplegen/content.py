"""A content spec (drawn scene or photo crop) -> its pixels and its alt-texts.

Alt-texts are worded from the spec by templates (``describe``), so they say
what is in the picture ("two circles above a square", now and then "two red
circles above a blue square on a white background") in varied phrasing, like
alt-texts written by many people.
The wording is drawn from its own generator: the same picture can be
re-worded without being redrawn.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from PIL import Image

from samplegen.photos import PHOTO_FRAMES, PHOTOS, render_photo
from samplegen.scenes import NUMBER_WORDS, PLURALS, RELATIONS, pick, render_scene


def render(spec: dict, size: Optional[Tuple[int, int]] = None) -> Image.Image:
    """Any content spec -> PIL image (RGB for scenes; RGB or L for photos)."""
    size = tuple(size or spec["size"])
    if spec["kind"] == "scene":
        return render_scene(spec, size)
    if spec["kind"] == "photo":
        return render_photo(spec, size)
    raise ValueError(f"unknown content kind {spec['kind']!r}")


# How often an alt-text names each group's colour (first, second group) and
# the background. Seldom, so that shape and count are what tells one pair from
# another: a small contrastive model learns whatever separates the pairs most
# cheaply, and colour and background are far easier to see than shape. The
# demo model's kNN and zero-shot accuracy at these shares: RESULTS "Tiny demo".
COLOUR_NAMED = (0.15, 0.15)
BACKGROUND_NAMED = 0.1

SINGLE_TEMPLATES = (
    "clip art of {g1}",
    "a drawing of {g1}",
    "a simple drawing of {g1}",
    "an illustration of {g1}",
    "{g1}",
    "{g1} {pos}",
    "a drawing of {g1} {pos}",
    "clip art of {g1} {pos}",
)
SINGLE_TEMPLATES_BACKGROUND = (
    "{g1} on a {bg} background",
    "{g1} on a plain {bg} background",
    "{g1} against a {bg} backdrop",
    "a drawing of {g1} on a {bg} background",
    "illustration of {g1} on a {bg} background",
    "{g1} {pos} on a {bg} background",
)
PAIR_TEMPLATES = (
    "{g1} {rel} {g2}",
    "a drawing of {g1} {rel} {g2}",
    "illustration of {g1} {rel} {g2}",
    "clip art of {g1} and {g2}",
    "a drawing of {g1} and {g2}",
    "simple shapes: {g1} {rel} {g2}",
    "flat illustration showing {g1} {rel} {g2}",
)
PAIR_TEMPLATES_BACKGROUND = (
    "{g1} {rel} {g2} on a {bg} background",
    "{g1} {rel} {g2} on a plain {bg} background",
    "{g1} and {g2} on a {bg} background",
    "clip art illustration showing {g1} placed just {rel} {g2} on a plain {bg} background",
)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _group_phrase(rng, group, size_word: Optional[str], colour: bool) -> str:
    count, shape = group["count"], group["shape"]
    words = ([size_word] if size_word else []) + ([group["colour"]] if colour else [])
    noun = shape if count == 1 else PLURALS[shape]
    body = " ".join(words + [noun])
    if count == 1:
        lead = pick(rng, ["a", "a", "a", "one", "a single"])
        if lead == "a":
            lead = _article(body)
        return f"{lead} {body}"
    return f"{NUMBER_WORDS[count]} {body}"


def _position_phrase(spec) -> Optional[str]:
    group = spec["groups"][0]
    if len(spec["groups"]) > 1 or group["count"] > 1:
        return None
    cx, cy, _, _ = group["items"][0]
    width, height = spec["size"]
    fx, fy = cx / width - 0.5, cy / height - 0.5
    horizontal = "left" if fx < -0.14 else "right" if fx > 0.14 else ""
    vertical = "top" if fy < -0.14 else "bottom" if fy > 0.14 else ""
    if not horizontal and not vertical:
        return "in the centre"
    if horizontal and vertical:
        return f"in the {vertical} {horizontal} corner"
    return f"at the {vertical}" if vertical else f"on the {horizontal}"


def describe_scene(spec: dict, rng: np.random.Generator) -> str:
    groups = spec["groups"]
    span = min(spec["size"])
    g1_radius = groups[0]["items"][0][2] / span
    size1 = pick(rng, ["large", "big"]) if g1_radius > 0.2 and rng.random() < 0.3 else None
    g1 = _group_phrase(rng, groups[0], size1, colour=rng.random() < COLOUR_NAMED[0])
    values = {"g1": g1, "bg": spec["background"], "pos": _position_phrase(spec)}
    if len(groups) > 1:
        size2 = pick(rng, ["small", "little"]) if rng.random() < 0.3 else None
        values["g2"] = _group_phrase(rng, groups[1], size2, colour=rng.random() < COLOUR_NAMED[1])
        values["rel"] = pick(rng, RELATIONS[spec["relation"]])
        templates = PAIR_TEMPLATES_BACKGROUND if rng.random() < BACKGROUND_NAMED else PAIR_TEMPLATES
    else:
        templates = SINGLE_TEMPLATES_BACKGROUND if rng.random() < BACKGROUND_NAMED else SINGLE_TEMPLATES
        templates = [t for t in templates if values["pos"] or "{pos}" not in t]
    text = pick(rng, templates).format(**values)
    if rng.random() < 0.25:
        text = text[0].upper() + text[1:]
    return text


def describe_photo(spec: dict, rng: np.random.Generator) -> str:
    subject = pick(rng, PHOTOS[spec["photo"]][2])
    framed = not any(w in subject for w in ("photo", "image", "texture", "close up"))
    frame = pick(rng, PHOTO_FRAMES) if framed else ""
    if frame.startswith(("close up", "detail")) and spec["scale"] > 0.7:
        frame = ""
    text = frame + subject
    if rng.random() < 0.25:
        text = text[0].upper() + text[1:]
    return text


def describe(spec: dict, rng: np.random.Generator) -> str:
    """An alt-text for the content: what a person writing alt-text would say."""
    return describe_scene(spec, rng) if spec["kind"] == "scene" else describe_photo(spec, rng)
