"""How often does an image identity pool images that a person calls different?

    python -m benchmarks.image_identity [--json PATH]   # default benchmarks/results/image_identity.json

The per-image counts (``texts_per_image``, ``images_per_text``) treat rows
with the same identity as one image. An identity that pools two different
images counts their alt-texts together: a flat-colour or text-banner image
then "has" the alt-texts of every other one. This harness encodes sets of
images that are all different to a person, computes each identity exactly as
the job does (``filters.image``: sha256 of the bytes; the 64-bit pHash of the
decoded, oriented RGB picture) and counts, per set, the pairs of different
images that share an identity. A last set holds copies of one picture
(re-encodes at other JPEG qualities, PNG): there pooling is wanted, and the
count shows what each identity gives up.

Sets: flat colours, simple logos (a shape in a colour on white), text
banners (a word on a plain banner), the photographs shipped inside
scikit-image / scikit-learn, and crops of them at different places.
Deterministic; no timing.
"""

from __future__ import annotations

import argparse
import colorsys
import hashlib
import importlib.util
import io
import itertools
import os
from typing import Callable, Dict, List

from PIL import Image, ImageDraw, ImageFont

from benchmarks import record
from filters.image import phash_of

SIZE = (480, 360)
BANNER_WORDS = ("SALE", "NEW", "HOT", "OPEN", "FREE", "MENU", "HOME", "SHOP", "BUY NOW", "50% OFF",
                "CLOSED", "SOLD OUT", "WELCOME", "CONTACT", "ABOUT US", "LOGIN")
SHAPES = ("circle", "square", "triangle", "diamond", "bar", "ring", "cross", "dot")
LOGO_COLOURS = ((200, 30, 30), (30, 90, 200), (20, 140, 60), (240, 160, 0))
#: Photographs that ship inside the installed packages (read from their folders).
PHOTOS = (
    "skimage:data/astronaut.png", "skimage:data/coffee.png", "skimage:data/chelsea.png",
    "skimage:data/rocket.jpg", "skimage:data/hubble_deep_field.jpg", "skimage:data/ihc.png",
    "skimage:data/motorcycle_left.png", "sklearn:datasets/images/china.jpg",
    "sklearn:datasets/images/flower.jpg", "skimage:data/camera.png", "skimage:data/coins.png",
    "skimage:data/moon.png",
)
CROPS_PER_PHOTO = 6


def encode(image: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    out = io.BytesIO()
    image.convert("RGB").save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}) | kw)
    return out.getvalue()


def flat(colour, size=SIZE) -> Image.Image:
    return Image.new("RGB", size, tuple(colour))


def flat_colours(n: int = 24) -> List[Image.Image]:
    """``n`` clearly different colours: hues at two lightness levels, plus black and white."""
    colours = [(0, 0, 0), (255, 255, 255)]
    for i in range(n - 2):
        r, g, b = colorsys.hls_to_rgb(i / (n - 2), 0.35 if i % 2 else 0.6, 0.8)
        colours.append((int(r * 255), int(g * 255), int(b * 255)))
    return [flat(c) for c in colours]


def logo(shape: str, colour, size=SIZE) -> Image.Image:
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    w, h = size
    cx, cy, r = w // 2, h // 2, min(w, h) // 3
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=colour)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)
    elif shape == "bar":
        draw.rectangle((cx - r, cy - r // 4, cx + r, cy + r // 4), fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=r // 4)
    elif shape == "cross":
        draw.rectangle((cx - r, cy - r // 5, cx + r, cy + r // 5), fill=colour)
        draw.rectangle((cx - r // 5, cy - r, cx + r // 5, cy + r), fill=colour)
    elif shape == "dot":
        draw.ellipse((cx - r // 3, cy - r // 3, cx + r // 3, cy + r // 3), fill=colour)
    return img


def logos() -> List[Image.Image]:
    return [logo(s, c) for s in SHAPES for c in LOGO_COLOURS]


def banner(word: str, size=SIZE, text_height: int = SIZE[1] // 5, background="white", ink="black") -> Image.Image:
    """A word centred on a plain banner, as shops put on their pages."""
    img = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=text_height)
    left, top, right, bottom = draw.textbbox((0, 0), word, font=font)
    draw.text(((size[0] - (right - left)) / 2 - left, (size[1] - (bottom - top)) / 2 - top), word, fill=ink, font=font)
    return img


def banners() -> List[Image.Image]:
    return [banner(w) for w in BANNER_WORDS]


#: The IAB "leaderboard" ad size, text a third of its height.
WEB_BANNER = (728, 90)


def web_banners() -> List[Image.Image]:
    return [banner(w, WEB_BANNER, WEB_BANNER[1] // 3) for w in BANNER_WORDS]


def small_text_banners() -> List[Image.Image]:
    return [banner(w, SIZE, SIZE[1] // 12) for w in BANNER_WORDS]


def load_photo(source: str) -> Image.Image:
    package, path = source.split(":", 1)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{source} needs the {package} package installed")
    with Image.open(os.path.join(list(spec.submodule_search_locations)[0], path)) as img:
        return img.convert("RGB")


def photos() -> List[Image.Image]:
    return [load_photo(s) for s in PHOTOS]


def crops() -> List[Image.Image]:
    """``CROPS_PER_PHOTO`` crops of each photograph at different places (half its size, scaled)."""
    out = []
    for photo in photos():
        w, h = photo.size
        cw, ch = w // 2, h // 2
        for i in range(CROPS_PER_PHOTO):
            x = (w - cw) * (i % 3) // 2
            y = (h - ch) * (i // 3)
            out.append(photo.crop((x, y, x + cw, y + ch)).resize(SIZE))
    return out


def same_picture_copies() -> List[List[bytes]]:
    """Per photograph: the same picture as JPEG q90, JPEG q60 and PNG (wanted pooling)."""
    groups = []
    for photo in photos():
        small = photo.resize(SIZE)
        groups.append([encode(small, quality=90), encode(small, quality=60), encode(small, "PNG")])
    return groups


IDENTITIES: Dict[str, Callable[[bytes], str]] = {
    "sha256": lambda data: hashlib.sha256(data).hexdigest(),
    "phash": lambda data: phash_of(data) or "",
}


def pooled(identities: List[str]) -> dict:
    """Pairs of items with the same identity, and items pooled with at least one other."""
    pairs = sum(1 for a, b in itertools.combinations(identities, 2) if a == b)
    counts = {i: identities.count(i) for i in set(identities)}
    return {
        "images": len(identities),
        "pairs": len(identities) * (len(identities) - 1) // 2,
        "pooled_pairs": pairs,
        "images_pooled": sum(1 for i in identities if counts[i] > 1),
        "largest_pool": max(counts.values()) if counts else 0,
    }


def measure() -> dict:
    different = {
        "flat colours": flat_colours(),
        "logos": logos(),
        "text banners (large text)": banners(),
        "text banners (small text)": small_text_banners(),
        "web banners 728x90": web_banners(),
        "photographs": [p.resize(SIZE) for p in photos()],
        "crops of the photographs": crops(),
    }
    results = {}
    for name, images in different.items():
        data = [encode(img) for img in images]
        results[name] = {ident: pooled([fn(d) for d in data]) for ident, fn in IDENTITIES.items()}
    # Every different image of every set together: cross-set pooling counts too.
    everything = [encode(img) for images in different.values() for img in images]
    results["all different images together"] = {
        ident: pooled([fn(d) for d in everything]) for ident, fn in IDENTITIES.items()}
    copies = same_picture_copies()
    results["copies of one picture (pooling wanted)"] = {
        ident: {"groups": len(copies), "copies": sum(map(len, copies)),
                "groups_fully_pooled": sum(1 for g in copies if len({fn(d) for d in g}) == 1)}
        for ident, fn in IDENTITIES.items()}
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default="", help="where to write the JSON (default benchmarks/results/image_identity.json)")
    args = parser.parse_args(argv)
    run = record.Run()
    results = measure()
    for name, by_identity in results.items():
        for ident, row in by_identity.items():
            print(f"{name:40s} {ident:7s} " + " ".join(f"{k}={v}" for k, v in row.items()))
    run.write("image_identity", results, args.json)


if __name__ == "__main__":
    main()
