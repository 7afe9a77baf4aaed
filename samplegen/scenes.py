"""What the sample corpus draws: scenes of coloured shapes, as small picklable specs.

A spec (plain dicts and tuples) is sampled once with a seeded
``numpy.random.Generator`` and rendered deterministically at any size:
one or two groups of coloured shapes on a plain or gently graded
background, drawn with PIL at 2x and box-downsampled (smooth edges). The
first group is the *dominant* one: larger shapes, always named in the
alt-text, and the class a zero-shot evaluation asks about. Photo crops are
in ``samplegen.photos``; rendering any spec and wording its alt-texts in
``samplegen.content``.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw


# ---------------------------------------------------------------------------
# Vocabulary of the drawn world
# ---------------------------------------------------------------------------

#: Shape classes; also the zero-shot classes and the eval-set folders.
SHAPES = ("circle", "square", "triangle", "star", "cross", "ring", "hexagon", "crescent")
PLURALS = {s: s + ("es" if s.endswith("s") else "s") for s in SHAPES}

COLOURS: Dict[str, Tuple[int, int, int]] = {
    "red": (206, 38, 38),
    "orange": (238, 132, 26),
    "yellow": (240, 206, 36),
    "green": (42, 150, 62),
    "blue": (38, 84, 204),
    "purple": (126, 58, 168),
    "pink": (236, 124, 176),
    "brown": (118, 74, 40),
    "black": (24, 24, 24),
    "white": (246, 246, 246),
    "grey": (132, 132, 132),
}
#: Colours that survive a grey-scale encoding unchanged in meaning.
GREY_COLOURS = ("black", "white", "grey")

BACKGROUNDS: Dict[str, Tuple[int, int, int]] = {
    "white": (250, 250, 248),
    "black": (16, 16, 18),
    "light grey": (208, 208, 206),
    "dark grey": (62, 62, 64),
    "pale blue": (198, 220, 242),
    "navy blue": (22, 34, 82),
    "cream": (244, 234, 208),
    "pale green": (210, 234, 204),
}
GREY_BACKGROUNDS = ("white", "black", "light grey", "dark grey")

NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}
# Which side of the second group the dominant group is on.
RELATIONS = {
    "above": ("above", "over", "on top of"),
    "below": ("below", "under", "beneath"),
    "left of": ("to the left of", "left of", "beside"),
    "right of": ("to the right of", "right of", "beside"),
}

SUPERSAMPLE = 2


def pick(rng: np.random.Generator, options: Sequence):
    """One element, uniformly (``rng.choice`` converts to an array: 20x slower)."""
    return options[int(rng.integers(len(options)))]


def _luma(rgb) -> float:
    r, g, b = rgb
    return 0.299 * r + 0.587 * g + 0.114 * b


def _contrasts(colour: str, background: str) -> bool:
    a, b = COLOURS[colour], BACKGROUNDS[background]
    return abs(_luma(a) - _luma(b)) > 45 and sum((x - y) ** 2 for x, y in zip(a, b)) > 110**2


#: background -> colours that stand out on it
VISIBLE_ON = {bg: tuple(c for c in COLOURS if _contrasts(c, bg)) for bg in BACKGROUNDS}


# ---------------------------------------------------------------------------
# Scene specs
# ---------------------------------------------------------------------------


def _place(rng, region, count, radius, taken) -> Optional[List[Tuple[float, float, float, float]]]:
    """Non-overlapping (cx, cy, r, rotation) items inside ``region``, or None."""
    x0, y0, x1, y1 = region
    for _ in range(6):
        # One block of uniforms per attempt: numpy scalar draws cost ~1 us each.
        draws = rng.random((count, 60, 3)).tolist()
        turns = rng.random(count).tolist()
        items = []
        for k in range(count):
            for u, vx, vy in draws[k]:
                r = radius * (0.85 + 0.3 * u)
                margin = 0.06 * r + 2
                lo_x, hi_x = x0 + r + margin, x1 - r - margin
                lo_y, hi_y = y0 + r + margin, y1 - r - margin
                if hi_x < lo_x or hi_y < lo_y:
                    break
                cx, cy = lo_x + vx * (hi_x - lo_x), lo_y + vy * (hi_y - lo_y)
                if all(math.hypot(cx - a, cy - b) > 1.15 * (r + q) + 4 for a, b, q, _ in items + taken):
                    items.append((round(cx, 2), round(cy, 2), round(r, 2), round(360.0 * turns[k], 1)))
                    break
            else:
                break
        if len(items) == count:
            return items
        radius *= 0.82
    return None


def _pick_colour(rng, background, colours, exclude=()):
    options = [c for c in VISIBLE_ON[background] if c in colours and c not in exclude]
    return options[int(rng.integers(len(options)))]


def sample_scene(
    rng: np.random.Generator,
    size: Tuple[int, int],
    dominant: Optional[str] = None,
    second_group: float = 0.55,
    grey: bool = False,
    colour: Optional[str] = None,
    background: Optional[str] = None,
    count: Optional[int] = None,
    second_fewer: bool = False,
) -> Optional[dict]:
    """A scene spec for a ``size`` canvas; None if the layout did not fit.

    ``dominant``, ``colour``, ``count`` fix the first group; ``background``
    the background; ``grey`` keeps to black, white and greys;
    ``second_fewer`` never lets the second group outnumber the first (a
    labelled picture then shows its class most).
    """
    width, height = size
    backgrounds = GREY_BACKGROUNDS if grey else tuple(BACKGROUNDS)
    colours = GREY_COLOURS if grey else tuple(COLOURS)
    background = background or pick(rng, backgrounds)
    shape1 = dominant or pick(rng, SHAPES)
    count1 = count or pick(rng, [1, 1, 1, 2, 2, 3, 4])
    colour1 = colour or _pick_colour(rng, background, colours)
    groups = [{"shape": shape1, "colour": colour1, "count": count1}]
    relation = None
    regions = [(0.0, 0.0, float(width), float(height))]
    if rng.random() < second_group:
        shape2 = pick(rng, [s for s in SHAPES if s != shape1])
        colour2 = _pick_colour(rng, background, colours)
        counts2 = [1, 1, 2, 2, 3]
        if second_fewer:
            counts2 = [min(c, count1) for c in counts2]
        groups.append({"shape": shape2, "colour": colour2, "count": pick(rng, counts2)})
        aspect = width / height
        if aspect > 1.6:
            relation = pick(rng, ["left of", "right of"])
        elif aspect < 1 / 1.6:
            relation = pick(rng, ["above", "below"])
        else:
            relation = pick(rng, list(RELATIONS))
        split = rng.uniform(0.5, 0.6)
        if relation in ("above", "below"):
            top, bottom = (0.0, 0.0, width, height * split), (0.0, height * split, width, height)
            regions = [top, bottom] if relation == "above" else [bottom, top]
        else:
            left, right = (0.0, 0.0, width * split, height), (width * split, 0.0, width, height)
            regions = [left, right] if relation == "left of" else [right, left]
    taken: List[tuple] = []
    for index, (group, region) in enumerate(zip(groups, regions)):
        span = min(region[2] - region[0], region[3] - region[1])
        if index == 0:
            radius = span * rng.uniform(0.3, 0.42) / math.sqrt(group["count"])
        else:
            radius = min(groups[0]["items"][0][2] * rng.uniform(0.45, 0.7), span * 0.3 / math.sqrt(group["count"]))
            radius = max(radius, 0.07 * min(width, height))
        items = _place(rng, region, group["count"], radius, taken)
        if items is None:
            return None
        group["items"] = items
        taken += items
    return {
        "kind": "scene",
        "size": (int(width), int(height)),
        "background": background,
        "gradient": (pick(rng, [0, 90]), int(rng.integers(0, 22))),
        "groups": groups,
        "relation": relation,
    }


def flip_scene(spec: dict) -> dict:
    """The spec of the mirrored picture (what a mirrored copy's alt-text describes)."""
    width = spec["size"][0]
    groups = [
        dict(g, items=[(round(width - cx, 2), cy, r, round((180 - rot) % 360, 1)) for cx, cy, r, rot in g["items"]])
        for g in spec["groups"]
    ]
    swap = {"left of": "right of", "right of": "left of"}
    return dict(spec, groups=groups, relation=swap.get(spec["relation"], spec["relation"]), mirrored=True)


# ---------------------------------------------------------------------------
# Scene rendering
# ---------------------------------------------------------------------------


def _regular_polygon(n, cx, cy, r, rot, inner=None):
    points = []
    steps = 2 * n if inner else n
    for k in range(steps):
        radius = r if (inner is None or k % 2 == 0) else r * inner
        angle = math.radians(rot + 360.0 * k / steps - 90)
        points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
    return points


def _tilt(rot: float) -> float:
    # Squares and crosses lean at most 20 degrees: at 45 a square reads as a diamond.
    return rot % 40 - 20


def _cross_polygon(cx, cy, r, rot):
    t = 0.34 * r
    outline = [(-t, -r), (t, -r), (t, -t), (r, -t), (r, t), (t, t), (t, r), (-t, r), (-t, t), (-r, t), (-r, -t), (-t, -t)]
    a = math.radians(_tilt(rot))
    c, s = math.cos(a), math.sin(a)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in outline]


def _draw_item(mask, draw, shape, item, sx, sy):
    """Draw one shape in white (255) on a supersampled ``L`` mask."""
    cx, cy, r, rot = item
    px, py, rx, ry = cx * sx, cy * sy, r * sx, r * sy

    def scaled(points):
        return [(x * sx, y * sy) for x, y in points]

    if shape == "circle":
        draw.ellipse((px - rx, py - ry, px + rx, py + ry), fill=255)
    elif shape == "ring":
        draw.ellipse((px - rx, py - ry, px + rx, py + ry), outline=255, width=max(1, round(0.32 * (rx + ry) / 2)))
    elif shape == "square":
        draw.polygon(scaled(_regular_polygon(4, cx, cy, r, 45 + _tilt(rot))), fill=255)
    elif shape == "triangle":
        draw.polygon(scaled(_regular_polygon(3, cx, cy, r, rot)), fill=255)
    elif shape == "hexagon":
        draw.polygon(scaled(_regular_polygon(6, cx, cy, r, rot)), fill=255)
    elif shape == "star":
        draw.polygon(scaled(_regular_polygon(5, cx, cy, r, rot, inner=0.45)), fill=255)
    elif shape == "cross":
        draw.polygon(scaled(_cross_polygon(cx, cy, r, rot)), fill=255)
    elif shape == "crescent":
        # A disc with an offset disc cut out; the cut stays inside this item.
        box = (int(px - rx) - 1, int(py - ry) - 1, int(px + rx) + 2, int(py + ry) + 2)
        local = Image.new("L", (box[2] - box[0], box[3] - box[1]), 0)
        ldraw = ImageDraw.Draw(local)
        ox, oy = px - box[0], py - box[1]
        ldraw.ellipse((ox - rx, oy - ry, ox + rx, oy + ry), fill=255)
        a = math.radians(rot)
        dx, dy = 0.42 * rx * math.cos(a), 0.42 * ry * math.sin(a)
        ldraw.ellipse((ox + dx - 0.92 * rx, oy + dy - 0.92 * ry, ox + dx + 0.92 * rx, oy + dy + 0.92 * ry), fill=0)
        mask.paste(255, box, local)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def _background(size, spec) -> Image.Image:
    width, height = size
    base = np.array(BACKGROUNDS[spec["background"]], np.float32)
    angle, delta = spec["gradient"]
    if delta == 0:
        return Image.new("RGB", size, tuple(int(v) for v in base))
    if angle:  # left to right
        ramp = np.linspace(delta, -delta, width, dtype=np.float32)[None, :, None]
    else:  # top to bottom
        ramp = np.linspace(delta, -delta, height, dtype=np.float32)[:, None, None]
    line = np.clip(base[None, None, :] + ramp, 0, 255).astype(np.uint8)
    return Image.fromarray(line, "RGB").resize(size, Image.Resampling.NEAREST)


def render_scene(spec: dict, size: Tuple[int, int]) -> Image.Image:
    """The scene as an RGB image of ``size`` (the spec's layout, stretched if needed).

    Shapes are drawn on a 2x coverage mask per group, box-reduced (smooth
    edges) and composited in the group's colour: PIL draws no anti-aliased
    polygons, and a 2x RGB canvas would cost four times the pixels.
    """
    width, height = spec["size"]
    canvas = _background(size, spec)
    big = (size[0] * SUPERSAMPLE, size[1] * SUPERSAMPLE)
    sx, sy = big[0] / width, big[1] / height
    # The second (smaller) group is composited first: the dominant one is never covered.
    for group in reversed(spec["groups"]):
        # Only the group's bounding box is drawn and composited.
        pad = 2 * SUPERSAMPLE
        x0 = max(0, int(min((cx - r * 1.2) * sx for cx, _, r, _ in group["items"])) - pad)
        y0 = max(0, int(min((cy - r * 1.2) * sy for _, cy, r, _ in group["items"])) - pad)
        x1 = min(big[0], int(max((cx + r * 1.2) * sx for cx, _, r, _ in group["items"])) + pad)
        y1 = min(big[1], int(max((cy + r * 1.2) * sy for _, cy, r, _ in group["items"])) + pad)
        x0, y0 = x0 - x0 % SUPERSAMPLE, y0 - y0 % SUPERSAMPLE
        x1, y1 = x1 + (-x1) % SUPERSAMPLE, y1 + (-y1) % SUPERSAMPLE
        mask = Image.new("L", (x1 - x0, y1 - y0), 0)
        draw = ImageDraw.Draw(mask)
        for cx, cy, r, rot in group["items"]:
            _draw_item(mask, draw, group["shape"], (cx - x0 / sx, cy - y0 / sy, r, rot), sx, sy)
        box = (x0 // SUPERSAMPLE, y0 // SUPERSAMPLE, x1 // SUPERSAMPLE, y1 // SUPERSAMPLE)
        small = mask.reduce(SUPERSAMPLE)
        canvas.paste(COLOURS[group["colour"]], (box[0], box[1], box[0] + small.size[0], box[1] + small.size[1]), small)
    return canvas


def scene_shapes(spec: dict) -> Tuple[str, ...]:
    """The shapes a spec shows (none for a photo crop)."""
    return tuple(g["shape"] for g in spec["groups"]) if spec["kind"] == "scene" else ()


def dominant_class(spec: dict) -> Optional[str]:
    return spec["groups"][0]["shape"] if spec["kind"] == "scene" else None
