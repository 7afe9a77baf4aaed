"""The embedded sample corpus: realistic raw candidates with planted faults, and their expected fates.

    python -m pipeline.sample --out data/sample [--num-candidates 3000] [--seed 0] [--processes N]

Writes, under ``--out``::

    candidates/part-00000-of-0000K.parquet ...   img2dataset-style rows (see CANDIDATE_SCHEMA)
    candidates/part-<K-1>-of-0000K.parquet       the last part has no ``caption`` column at all
    manifest.jsonl                               one line per candidate row, in file order
    eval/{train,test}/<class>/<class>_NNN.png    a labelled evaluation set of drawn shapes
    sample_info.json                             sizes, seed, eval set, --set overrides for the build

Content. ``--num-candidates`` ordinary candidates (drawn shape scenes, most of
them, and crops of the photographs shipped in scikit-image / scikit-learn,
each with an alt-text describing it, see ``pipeline.sample_scenes``) plus
about 1,250 planted rows, one group per *case*, each with the fate a correct
ALIGN build must give it: at and around every image threshold, every image
format, EXIF orientation, corrupt / truncated / non-image bytes, a
decompression bomb, caption faults, boilerplate alt-texts shared by many
images, one image with more than 1000 alt-texts, rare-token junk captions,
near-duplicates of evaluation images, repeated (url, caption) pairs and a
part file without a caption column. Rows are shuffled across the parts.

Manifest lines: ``{"pipeline_key": make_key(url, caption or ""), "url",
"case", "expected", "note", "key" (the row's img2dataset key, unique),
"file" (part file name), "size" ([w, h] after EXIF orientation, or null)}``.
``expected`` is ``"written"``, the first rejection reason in
``filters.stages`` order, or ``"written_once"``: a group of rows with the
*same* (url, caption), hence the same pipeline key, of which exactly one is
written and every other one is rejected as ``duplicate_pair/repeat``; which
one is kept is the pipeline's own deterministic choice, so the manifest does
not name it.

Expected fates of the whole-corpus stages (texts per image, images per text,
rare n-grams) assume the build runs with ``sample_info.json``'s
``build_overrides``: the corpus is tiny, so the ALIGN vocabulary of 100M
n-grams would keep every n-gram; a minimum n-gram count is used instead, and
k-means gets fewer clusters than the sample has images. No picture is
pornographic (the NSFW stage, if it runs, should reject nothing).
The generator checks its own expectations before writing (``verify_plan``)
and fails loudly if one does not hold: ordinary alt-texts are re-worded or
re-drawn (deterministically) until every n-gram of every alt-text that should
be written is frequent, no ordinary alt-text is used by more than 3 images,
and no ordinary image is close to an evaluation image under the
near-duplicate embedder (``dedup.embedders``); each planted near-duplicate
is checked to be detected by it.

Not planted: ``read/caption_not_utf8`` (pyarrow refuses to write invalid
UTF-8 into a string column, other writers do not; ``tests/pipeline/test_read.py``
writes such a file). EXIF orientation cannot change an ALIGN verdict (shorter
side and longer/shorter ratio do not change when width and height swap);
the EXIF rows check that the upright picture is the one kept and described.

Deterministic: every row draws from ``numpy.random.default_rng([seed,
stream, slot, attempt])``; the same seed gives byte-identical files whatever
``--processes`` is.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import io
import json
import math
import multiprocessing
import os
import struct
import sys
import threading
import time
import unicodedata
import zlib
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageEnhance

from common.images import EXIF_ORIENTATION_TAG, unorient
from common.schema import make_key
from filters import stages
from filters import text as text_lib
from filters.text import ngrams, normalize_text, text_identity, words
from pipeline import sample_scenes as scenes
from pipeline.readers.rows import download_reason

# ---------------------------------------------------------------------------
# Constants: layout, thresholds the expectations are computed against
# ---------------------------------------------------------------------------

CANDIDATE_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("url", pa.string()),
    ("caption", pa.string()),
    ("status", pa.string()),
    ("error_message", pa.string()),
    ("width", pa.int64()),
    ("height", pa.int64()),
    ("jpg", pa.binary()),
])
MISSING_COLUMN_SCHEMA = pa.schema([f for f in CANDIDATE_SCHEMA if f.name != "caption"])

ROWS_PER_PART = 5000
MIN_PARTS = 3
ROW_GROUP_SIZE = 1000
EVAL_SET = "sample_eval"
EVAL_PER_CLASS = {"train": 20, "test": 10}
EVAL_SIZES = (256, 320)

WRITTEN = "written"
WRITTEN_ONCE = "written_once"

# ALIGN preset values the per-record expectations use (checked against
# filters.presets in the tests, not imported: the manifest is a statement of
# the rules, not a copy of the code under test).
MIN_SHORTER_SIDE = 200
MAX_ASPECT = 3.0
MAX_PIXELS = 89_478_485
MAX_TEXTS_PER_IMAGE = 1000
MAX_IMAGES_PER_TEXT = 10
TEXTS_PER_IMAGE_ROWS = 1010

# Vocabulary for the tiny corpus: n-grams seen at least this often are in it.
MIN_NGRAM_COUNT = 2
# Margin kept on top of it for every alt-text expected to be written: each of
# its n-grams occurs at least this often among the rows that pass the read
# stage (a subset of what the build counts), so one row more or less never
# flips a verdict.
NGRAM_SUPPORT = MIN_NGRAM_COUNT + 1
MAX_IMAGES_PER_ORDINARY_TEXT = 3
# Ordinary images stay this far below the near-duplicate embedder's threshold.
NEAR_DUPLICATE_MARGIN = 0.1
NEAR_DUPLICATE_EMBEDDER = "dct"
# k-means clusters for the near-duplicate buckets: the preset's 4096 needs far
# more images than the sample has; 16 still leaves C(10,3) = 120 buckets.
SAMPLE_NUM_CLUSTERS = 16

# Random streams (the second entry of every seed sequence).
STREAM_ROW, STREAM_URL, STREAM_SHUFFLE, STREAM_EVAL = 1, 2, 3, 4


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def expected_image_fate(width: int, height: int) -> str:
    """The ALIGN header rules on an (oriented) size: shorter side > 200, ratio < 3."""
    shorter, longer = sorted((width, height))
    if shorter <= MIN_SHORTER_SIDE:
        return stages.reason("image_size", "too_small")
    if longer / shorter >= MAX_ASPECT:
        return stages.reason("image_aspect", "too_elongated")
    return WRITTEN


def word_count(caption: str) -> int:
    return text_lib.word_count(normalize_text(caption))


def wording_key(caption: str) -> str:
    """Coarser than ``text_identity`` (punctuation and spacing ignored): the
    "at most 3 images per ordinary alt-text" rule uses it."""
    return " ".join(words(normalize_text(caption)))


def ordinary_length(caption: str) -> bool:
    return 3 <= word_count(caption) <= 20


# ---------------------------------------------------------------------------
# The plan: rows, grouped in units that are drawn (and re-drawn) together
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Recipe:
    """How one image's bytes are made (rendered in a worker process)."""

    content: Optional[dict] = None  # scene / photo spec (its "size" is the oriented size)
    size: Optional[Tuple[int, int]] = None  # displayed (oriented) size
    encode: tuple = ("jpeg", 88)
    edit: tuple = ()  # near-duplicate edit applied before encoding
    raw: Optional[bytes] = None  # fixed bytes (garbage, html, ...); None -> render
    header_size: Optional[Tuple[int, int]] = None  # for bombs: declared size


@dataclasses.dataclass
class Row:
    slot: int
    case: str
    expected: str
    note: str
    caption: Optional[str] = None
    recipe: Optional[Recipe] = None
    status: str = "success"
    error_message: Optional[str] = None
    reported_size: object = "header"  # "header": img2dataset's width/height; None; or (w, h)
    url: Optional[str] = None  # set for rows that share a URL
    url_ext: str = "jpg"
    shared_caption: bool = False  # planted shared alt-text: exempt from the 3-images rule
    missing_column: bool = False

    @property
    def stage(self) -> str:
        return "" if self.expected in (WRITTEN, WRITTEN_ONCE) else stages.stage_of(self.expected)

    def reaches(self, stage: str) -> bool:
        """Does the row get to ``stage`` (not rejected by an earlier one)?"""
        if self.missing_column:
            return False
        if self.expected in (WRITTEN, WRITTEN_ONCE):
            return True
        return stages.STAGE_INDEX[self.stage] >= stages.STAGE_INDEX[stage]

    @property
    def should_be_frequent(self) -> bool:
        """Its alt-text's n-grams must all be in the vocabulary."""
        return self.reaches("rare_ngrams") and self.stage != "rare_ngrams"


@dataclasses.dataclass
class Unit:
    """Rows drawn together (a duplicate pair shares one drawing)."""

    rows: List[Row]
    draw: Callable[["Unit", np.random.Generator], None]
    fixed_caption: bool = False  # re-drawing changes the picture, never the alt-text
    attempt: int = 0

    @property
    def slot(self) -> int:
        return self.rows[0].slot


class Plan:
    def __init__(self, seed: int):
        self.seed = seed
        self.units: List[Unit] = []
        self.next_slot = 0
        self.num_candidates = 0
        self.evaluation: List[Tuple[str, str, int, dict]] = []  # (split, class, index, spec)
        self.eval_test: List[Tuple[str, dict]] = []  # (path, spec) of the eval/test images
        self.facts: Dict[str, object] = {}

    @property
    def rows(self) -> List[Row]:
        return [row for unit in self.units for row in unit.rows]

    def add(self, case, expected, note, draw, count=1, **fields) -> Unit:
        rows = []
        for _ in range(count):
            rows.append(Row(self.next_slot, case, expected, note, **fields))
            self.next_slot += 1
        unit = Unit(rows, draw, getattr(draw, "fixed_caption", False))
        self.redraw(unit, attempt=0)
        self.units.append(unit)
        return unit

    def redraw(self, unit: Unit, attempt: int) -> None:
        unit.attempt = attempt
        unit.draw(unit, _rng(self.seed, STREAM_ROW, unit.slot, attempt))


# ---------------------------------------------------------------------------
# Drawing helpers (content + alt-text) used by the cases
# ---------------------------------------------------------------------------


def ordinary_size(rng) -> Tuple[int, int]:
    shorter = int(rng.integers(240, 401))
    longer = int(round(shorter * rng.uniform(1.0, 1.6)))
    return (longer, shorter) if rng.random() < 0.6 else (shorter, longer)


def draw_content(rng, size=None, photo_share=0.2, grey=False, **scene_args) -> dict:
    size = tuple(size) if size else ordinary_size(rng)
    if photo_share and rng.random() < photo_share:
        return scenes.sample_photo(rng, size, grey=grey, **{k: v for k, v in scene_args.items() if k == "photo"})
    scene_args.pop("photo", None)
    for _ in range(50):
        spec = scenes.sample_scene(rng, size, grey=grey, **scene_args)
        if spec is not None:
            return spec
    raise RuntimeError(f"no scene layout fits {size}")


def draw_caption(spec, rng, accept=ordinary_length) -> Optional[str]:
    for _ in range(40):
        caption = scenes.describe(spec, rng)
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
             reported=None, **content_args):
    """A drawer: one picture (drawn content) per row, worded unless ``caption`` is fixed."""

    def draw(unit: Unit, rng):
        for row in unit.rows:
            if caption is None:
                spec, text = content_with_caption(rng, accept, size=size, **content_args)
            else:
                spec, text = draw_content(rng, size=size, **content_args), caption
            row.caption = transform(text, rng) if transform else text
            row.recipe = Recipe(content=spec, size=tuple(spec["size"]), encode=encode)
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


# ---------------------------------------------------------------------------
# Planted bytes that are not rendered pictures
# ---------------------------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def bomb_png(width: int, height: int) -> bytes:
    """A valid 1-bit grey PNG of ``width x height`` white... zero pixels: tiny
    file, enormous decode. Written row by row, never held in memory."""
    row = b"\x00" + bytes((width + 7) // 8)
    compressor = zlib.compressobj(9)
    chunks = [compressor.compress(row * 256) for _ in range(height // 256)]
    chunks.append(compressor.compress(row * (height % 256)))
    chunks.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", b"".join(chunks))
            + _png_chunk(b"IEND", b""))


HTML_ERROR_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body><h1>Not Found</h1>\n"
    b"<p>The requested URL was not found on this server.</p>\n<hr><address>Apache Server</address>\n</body></html>\n"
)
HTML_CAPTCHA_PAGE = (
    b"<html><head><meta charset=\"utf-8\"><title>Just a moment...</title></head><body>"
    b"<noscript>Please enable JavaScript and cookies to continue</noscript></body></html>"
)
PDF_DOCUMENT = (
    b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n"
    b"2 0 obj\n<< /Type /Pages /Kids [] /Count 0 >>\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n"
)
SVG_IMAGE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="320" height="240">'
    b'<rect width="320" height="240" fill="white"/><circle cx="160" cy="120" r="80" fill="red"/></svg>\n'
)


# ---------------------------------------------------------------------------
# Rendering and encoding (runs in worker processes; pure)
# ---------------------------------------------------------------------------

def _save(image: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **params)
    return out.getvalue()


def _apply_edit(image: Image.Image, edit: tuple) -> Image.Image:
    if not edit:
        return image
    name, *args = edit
    if name == "resize":
        w, h = image.size
        return image.resize((round(w * args[0]), round(h * args[0])), Image.Resampling.LANCZOS)
    if name == "brightness":
        return ImageEnhance.Brightness(image).enhance(args[0])
    if name == "contrast":
        return ImageEnhance.Contrast(image).enhance(args[0])
    if name == "mirror":
        return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if name == "jpeg":
        return image
    raise ValueError(f"unknown edit {name!r}")


def _frames(first: Image.Image, count: int) -> List[Image.Image]:
    """Frames of an animation: the picture drifting a few pixels."""
    frames = [first]
    for k in range(1, count):
        frames.append(first.transform(first.size, Image.Transform.AFFINE, (1, 0, -3 * k, 0, 1, -2 * k),
                                      resample=Image.Resampling.BILINEAR, fillcolor=first.getpixel((0, 0))))
    return frames


def render_bytes(recipe: Recipe) -> bytes:
    """The encoded image of a recipe."""
    if recipe.raw is not None:
        return recipe.raw
    kind, *params = recipe.encode
    if kind == "bomb_png":
        return bomb_png(*recipe.header_size)
    image = _apply_edit(scenes.render(recipe.content, recipe.size), recipe.edit)
    rgb = image.convert("RGB")
    if kind == "jpeg":
        quality = params[0]
        extra = params[1] if len(params) > 1 else {}
        return _save(rgb, "JPEG", quality=quality, **extra)
    if kind == "jpeg_cmyk":
        return _save(rgb.convert("CMYK"), "JPEG", quality=params[0])
    if kind == "jpeg_grey":
        return _save(image.convert("L"), "JPEG", quality=params[0])
    if kind == "jpeg_exif":
        orientation = params[0]
        exif = Image.Exif()
        exif[EXIF_ORIENTATION_TAG] = orientation
        return _save(unorient(rgb, orientation), "JPEG", quality=88, exif=exif.tobytes())
    if kind == "truncated":
        fmt, fraction = params
        whole = _save(rgb, fmt, **({"quality": 88} if fmt == "JPEG" else {}))
        return whole[: int(len(whole) * fraction)]
    if kind == "png":
        mode = params[0]
        if mode == "RGBA":
            # Transparent where the (plain white) background shows: composited on
            # white, as the pipeline does, it is the drawn picture again.
            background = np.array(scenes.BACKGROUNDS["white"], np.int16)
            alpha = (np.abs(np.asarray(rgb, np.int16) - background).sum(axis=2) > 6).astype(np.uint8) * 255
            rgba = rgb.copy()
            rgba.putalpha(Image.fromarray(alpha, "L"))
            return _save(rgba, "PNG")
        if mode == "P":
            return _save(rgb.quantize(64), "PNG")
        if mode == "I;16":
            grey = np.asarray(image.convert("L"), np.uint16) * 257
            return _save(Image.fromarray(grey), "PNG")
        return _save(rgb, "PNG")
    if kind == "gif":
        animated = params[0]
        frames = [f.quantize(128) for f in _frames(rgb, 3 if animated else 1)]
        return _save(frames[0], "GIF", save_all=animated, append_images=frames[1:], duration=200, loop=0)
    if kind == "webp":
        animated = params[0]
        frames = _frames(rgb, 3 if animated else 1)
        return _save(frames[0], "WEBP", quality=85, save_all=animated, append_images=frames[1:], duration=200)
    if kind == "mpo":
        return _save(rgb, "MPO", quality=88, save_all=True, append_images=[rgb.transpose(Image.Transpose.FLIP_LEFT_RIGHT)])
    if kind == "tiff":
        return _save(rgb, "TIFF", compression="tiff_lzw")
    if kind == "ico":
        return _save(rgb, "ICO", sizes=[rgb.size])
    if kind in ("BMP", "PPM", "TGA", "PCX", "JPEG2000"):
        return _save(rgb, kind)
    raise ValueError(f"unknown encoding {kind!r}")


class Workers:
    """``map`` over a process pool (or in this process); results come back in order.

    Every task is a pure function of its input, so the number of processes
    never changes the output. Forked after the photographs are loaded, so the
    workers share them.
    """

    def __init__(self, processes: int):
        self.processes = processes
        self.pool = None

    def __enter__(self):
        if self.processes > 1:
            for name in scenes.PHOTOS:
                scenes.load_photo(name)
            # fork shares the loaded photographs; but forking a process that
            # already runs threads (Beam, gRPC, TF in a test session) can deadlock.
            methods = multiprocessing.get_all_start_methods()
            method = "fork" if "fork" in methods and threading.active_count() == 1 else "spawn"
            self.pool = multiprocessing.get_context(method).Pool(self.processes)
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None

    def map(self, fn, items: list, chunksize: int = 16) -> list:
        if self.pool is None or len(items) < 4 * chunksize:
            return [fn(item) for item in items]
        return self.pool.map(fn, items, chunksize=chunksize)


def _thumbnail(spec: dict) -> Image.Image:
    return scenes.render(spec, (32, 32)).convert("L")


# ---------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------

NEAR_DUPLICATE_EDITS = (
    ("jpeg", 70), ("jpeg", 95), ("resize", 0.9), ("resize", 1.25), ("brightness", 1.15),
    ("contrast", 0.85), ("brightness", 0.9), ("mirror",), ("resize", 1.1), ("contrast", 1.15),
    ("jpeg", 80), ("brightness", 1.08), ("resize", 0.95), ("jpeg", 60),
)

SHORT_BOILERPLATE = {"1920x1080": 12, "alt img": 12, "image": 12}
BOILERPLATE = {
    "click here to enlarge": 14,
    "stock photo of a beautiful view": 13,
    "view larger image": 12,
    "product image for illustration purposes only": 11,
}
SHARED_OVER = ("a red circle on a white background", 11)
SHARED_AT = ("a blue square on a white background", 10)
MOJIBAKE_CAPTIONS = ("a cup of caf\u00c3\u00a9 au lait", "A cup of caf\u00c3\u00a9 au lait.")
NFC_CAPTIONS = ("caf\u00e9 cr\u00e8me in a white cup", "Caf\u00e9 cr\u00e8me in a white cup.")

SEO_WORDS = ("cheap", "best", "buy", "online", "free", "shipping", "sale", "discount", "new", "hot", "top",
             "quality", "shop", "store", "deal", "offer", "price", "wholesale", "fashion", "style")


def _seo_text(rng, chars: int) -> str:
    text = ""
    while len(text) < chars:
        text += str(rng.choice(SEO_WORDS)) + " "
    text = text[:chars]
    return text[:-1] + "x" if text.endswith(" ") else text


def _junk_caption(rng) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    rand = lambda n: "".join(rng.choice(list(letters), n))  # noqa: E731
    digits = lambda n: "".join(str(d) for d in rng.integers(0, 10, n))  # noqa: E731
    forms = (
        lambda: f"image_tid {digits(2)}&id {rand(12)}&cache 0&lan_code 0",
        lambda: f"DSC_{digits(4)} jpg uploaded by user{digits(4)}",
        lambda: f"IMG_{digits(8)}_{digits(6)} jpg from the {rand(7)} gallery",
        lambda: f"{rand(10)} {digits(6)} thumb small jpg",
        lambda: f"photo {rand(3)}{digits(5)}{rand(3)} by {rand(6)}",
    )
    return forms[int(rng.integers(0, len(forms)))]()


def plant_read_cases(plan: Plan) -> None:
    errors = ("HTTP Error 404: Not Found", "<urlopen error timed out>", "HTTP Error 403: Forbidden",
              "image decoding error")

    def failed(unit, rng):
        for row, error in zip(unit.rows, errors):
            _, row.caption = content_with_caption(rng)
            row.recipe, row.status, row.error_message, row.reported_size = None, "failed_to_download", error, None
            row.expected = download_reason(row.status, error)  # one funnel line per kind of failure

    plan.add("failed_download", download_reason("failed_to_download", errors[0]),
             "img2dataset could not download it: status failed_to_download, jpg is null", failed, count=4)

    def no_bytes(value):
        def draw(unit, rng):
            for row in unit.rows:
                _, row.caption = content_with_caption(rng)
                row.recipe = Recipe(raw=value) if value is not None else None
                row.reported_size = None
        return draw

    plan.add("null_image", stages.reason("read", "no_image"), "status success but jpg is null", no_bytes(None), count=2)
    plan.add("empty_image", stages.reason("read", "no_image"), "status success but jpg is zero bytes",
             no_bytes(b""), count=2)
    plan.add("null_caption", stages.reason("read", "missing_caption"), "caption is null (not an empty string)",
             pictured(transform=lambda text, rng: None), count=3)


def plant_header_cases(plan: Plan) -> None:
    undecodable = stages.reason("image_header", "undecodable")
    plan.add("garbage_bytes", undecodable, "random bytes, no image signature",
             fixed_bytes(lambda rng: rng.bytes(int(rng.integers(2000, 9000)))), count=2)
    plan.add("garbage_bytes_empty_caption", undecodable,
             "random bytes and an empty caption: image_header runs before text, first reason wins",
             fixed_bytes(lambda rng: rng.bytes(5000), caption=""))
    plan.add("html_error_page", undecodable, "a 404 HTML page served with status 200",
             fixed_bytes(lambda rng: HTML_ERROR_PAGE))
    plan.add("html_captcha_page", undecodable, "a bot-check HTML page instead of the image",
             fixed_bytes(lambda rng: HTML_CAPTCHA_PAGE))
    plan.add("pdf_document", undecodable, "a PDF document, PIL cannot read PDFs",
             fixed_bytes(lambda rng: PDF_DOCUMENT, ext="pdf"))
    plan.add("svg_image", undecodable, "an SVG (vector) image, not a raster format PIL reads",
             fixed_bytes(lambda rng: SVG_IMAGE, ext="svg"))

    def header_only(unit, rng):
        for row in unit.rows:
            spec, row.caption = content_with_caption(rng)
            row.recipe = Recipe(raw=render_bytes(Recipe(content=spec, size=tuple(spec["size"])))[:20])
            row.reported_size = None
    plan.add("jpeg_first_20_bytes", undecodable, "only the first 20 bytes of a JPEG: no frame header", header_only)

    def bomb(width, height):
        def draw(unit, rng):
            for row in unit.rows:
                _, row.caption = content_with_caption(rng)
                row.recipe = Recipe(encode=("bomb_png",), header_size=(width, height))
                row.reported_size = None
                row.url_ext = "png"
        return draw

    bomb_reason = stages.reason("image_header", "decompression_bomb")
    plan.add("decompression_bomb", bomb_reason,
             "1-bit PNG declaring 20000x20000 = 400M pixels (> 89,478,485) in ~50 kB; PIL itself refuses it",
             bomb(20000, 20000))
    plan.add("decompression_bomb_near_limit", bomb_reason,
             "1-bit PNG of 9460x9460 = 89,491,600 pixels, just above max_pixels: PIL only warns, the rule rejects",
             bomb(9460, 9460))


def plant_format_cases(plan: Plan) -> None:
    not_allowed = stages.reason("image_format", "not_allowed")
    for fmt, ext, note in (
        ("PPM", "ppm", "a PPM (portable pixmap): PIL opens it, align's formats list does not allow it"),
        ("TGA", "tga", "a Targa image: not in align's formats list"),
        ("PCX", "pcx", "a PCX image: not in align's formats list"),
        ("JPEG2000", "jp2", "a JPEG 2000 image: not in align's formats list"),
        ("ico", "ico", "a 256x256 ICO icon: not in align's formats list"),
    ):
        size = (256, 256) if fmt == "ico" else None
        plan.add(f"format_{fmt.lower()}", not_allowed, note, pictured(encode=(fmt,), size=size), url_ext=ext)
    plan.add("favicon_16px", not_allowed,
             "a 16x16 favicon with an empty alt-text: format is checked before size and text, first reason wins",
             pictured(encode=("ico",), size=(16, 16), caption=""), url_ext="ico")

    allowed = (
        ("png_rgb", ("png", "RGB"), "png", {}, "an RGB PNG"),
        ("png_rgba", ("png", "RGBA"), "png", {"background": "white", "photo_share": 0},
         "an RGBA PNG, transparent background; composited on white it is the described picture"),
        ("png_palette", ("png", "P"), "png", {}, "a palette (mode P) PNG"),
        ("png_16bit", ("png", "I;16"), "png", {"grey": True}, "a 16-bit grey PNG (mode I;16) of a grey picture"),
        ("gif", ("gif", False), "gif", {}, "a single-frame GIF"),
        ("gif_animated", ("gif", True), "gif", {}, "an animated GIF, 3 frames; the first frame is the picture"),
        ("webp", ("webp", False), "webp", {}, "a lossy WebP"),
        ("webp_animated", ("webp", True), "webp", {}, "an animated WebP, 3 frames"),
        ("bmp", ("BMP",), "bmp", {}, "a BMP"),
        ("tiff", ("tiff",), "tif", {}, "an LZW-compressed TIFF"),
        ("mpo", ("mpo",), "jpg", {}, "an MPO (multi-picture JPEG, format MPO in PIL)"),
        ("jpeg_cmyk", ("jpeg_cmyk", 88), "jpg", {}, "a CMYK JPEG"),
        ("jpeg_grey", ("jpeg_grey", 88), "jpg", {"grey": True}, "a grey-scale JPEG of a grey picture"),
        ("jpeg_progressive", ("jpeg", 87, {"progressive": True}), "jpg", {}, "a progressive JPEG"),
        ("jpeg_444", ("jpeg", 90, {"subsampling": 0}), "jpg", {}, "a JPEG without chroma subsampling"),
    )
    for case, encode, ext, args, note in allowed:
        plan.add(case, WRITTEN, note + "; allowed by align's formats list", pictured(encode=encode, **args), url_ext=ext)
    plan.add("jpeg_large", WRITTEN, "a 1600x1200 JPEG: kept, re-encoded smaller than output_max_side on write",
             pictured(size=(1600, 1200), photo_share=1.0))
    plan.add("wrong_reported_size", WRITTEN,
             "width/height columns say 100x100; the header is what counts", pictured(reported=(100, 100)))


def plant_size_cases(plan: Plan) -> None:
    for shorter in (199, 200, 201):
        for landscape in (True, False):
            size = (320, shorter) if landscape else (shorter, 320)
            fate = expected_image_fate(*size)
            plan.add(f"shorter_side_{shorter}", fate,
                     f"{size[0]}x{size[1]}: kept iff shorter side > {MIN_SHORTER_SIDE}", pictured(size=size))
    for longer, label in ((897, "2.99"), (900, "3.00"), (903, "3.01")):
        for landscape in (True, False):
            size = (longer, 300) if landscape else (300, longer)
            plan.add(f"aspect_{label}", expected_image_fate(*size),
                     f"{size[0]}x{size[1]}: ratio {label}, kept iff < {MAX_ASPECT}", pictured(size=size, photo_share=0))
    too_small = stages.reason("image_size", "too_small")
    plan.add("thumbnail_150x100", too_small, "a small thumbnail", pictured(size=(150, 100)))
    plan.add("banner_728x90", too_small,
             "a 728x90 banner: too small and too elongated; size is checked first", pictured(size=(728, 90)))
    plan.add("tracking_pixel", too_small,
             "a 1x1 GIF with an empty alt-text: image rules run before text rules, first reason wins",
             pictured(encode=("gif", False), size=(1, 1), caption="", photo_share=1.0), url_ext="gif")


def plant_exif_cases(plan: Plan) -> None:
    # ALIGN's rules (shorter side, longer/shorter) do not change when width and
    # height swap, so no rotation can turn a pass into a fail: these rows check
    # that the oriented picture is what is kept and what the alt-text describes.
    for orientation, size in ((6, (320, 440)), (8, (460, 300)), (3, (400, 300)), (5, (300, 380)),
                              (2, (360, 280)), (6, (199, 320)), (8, (300, 903))):
        raw = size[::-1] if orientation in (5, 6, 7, 8) else size
        fate = expected_image_fate(*size)
        plan.add(f"exif_orientation_{orientation}", fate,
                 f"stored {raw[0]}x{raw[1]}, EXIF orientation {orientation}, displayed {size[0]}x{size[1]}; "
                 f"the alt-text describes the displayed picture",
                 pictured(encode=("jpeg_exif", orientation), size=size, photo_share=0.3))


def plant_decode_cases(plan: Plan) -> None:
    corrupt = stages.reason("image_decode", "corrupt")
    plan.add("truncated_jpeg", corrupt,
             "the first 60% of a JPEG: the header parses, the full decode fails",
             pictured(encode=("truncated", "JPEG", 0.6)), count=2)
    plan.add("truncated_png", corrupt, "the first 60% of a PNG: IHDR parses, the pixel data ends early",
             pictured(encode=("truncated", "PNG", 0.6)), url_ext="png")
    plan.add("truncated_jpeg_one_word", stages.reason("text_length", "too_few_words"),
             "a truncated JPEG with a one-word alt-text: text rules run before the full decode",
             pictured(encode=("truncated", "JPEG", 0.6), caption="sunset"))


def plant_text_cases(plan: Plan) -> None:
    def fixed(text):
        return pictured(caption=text)

    empty = stages.reason("text", "empty")
    plan.add("empty_caption", empty, "alt-text is the empty string", fixed(""))
    plan.add("whitespace_caption", empty, "alt-text is only spaces, tabs and newlines", fixed(" \t\n  \r\n "))
    plan.add("invisible_caption", empty, "zero-width spaces, joiners, BOM and word joiner only",
             fixed("\u200b\u200c\u200d\ufeff\u2060"))
    plan.add("control_caption", empty, "control characters only", fixed("\x00\x07\x1b\x7f\x9f"))
    invalid = stages.reason("text", "invalid_encoding")
    plan.add("replacement_char", invalid, "U+FFFD from a broken decode upstream", fixed("Caf\ufffd au lait in a cup"))
    plan.add("replacement_chars_only", invalid, "a caption decoded with the wrong codec",
             fixed("\ufffd\ufffd\ufffd\ufffd \ufffd\ufffd\ufffd"))

    def seo(chars):
        def transform(text, rng):
            return _seo_text(rng, chars)
        return transform

    plan.add("too_long_1001_chars", stages.reason("text", "too_long_chars"),
             "1001 characters of keywords (limit 1000, checked before word counts)",
             pictured(transform=seo(1001)))
    plan.add("too_long_3000_chars", stages.reason("text", "too_long_chars"), "3000 characters of keywords",
             pictured(transform=seo(3000)))
    plan.add("exactly_1000_chars", stages.reason("text_length", "too_many_words"),
             "exactly 1000 characters: allowed by the character limit, but far more than 20 words",
             pictured(transform=seo(1000)))
    few = stages.reason("text_length", "too_few_words")
    plan.add("one_word", few, "a single word", fixed("circle"))
    plan.add("one_word_filename", few, "a camera file name is one word (letters, digits, underscore)",
             fixed("IMG_4032"))
    plan.add("two_words", few, "two words", fixed("blue square"))
    plan.add("twenty_one_words", stages.reason("text_length", "too_many_words"),
             "21 words (limit 20, inclusive)", pictured(accept=lambda c: word_count(c) == 21, photo_share=0))
    plan.add("many_words", stages.reason("text_length", "too_many_words"), "a long SEO sentence",
             pictured(transform=seo(260)))
    plan.add("exactly_three_words", WRITTEN, "3 words, the minimum (inclusive)",
             pictured(accept=lambda c: word_count(c) == 3))
    plan.add("exactly_twenty_words", WRITTEN, "20 words, the maximum (inclusive)",
             pictured(accept=lambda c: word_count(c) == 20, photo_share=0))

    def zero_width(text, rng):
        spaces = [i for i, ch in enumerate(text) if ch == " "]
        i = spaces[int(rng.integers(0, len(spaces)))]
        return text[:i] + "\u200b" + text[i + 1:]

    plan.add("zero_width_inside", WRITTEN,
             "a zero-width space stands between two words: normalises to an ordinary alt-text",
             pictured(transform=zero_width), count=2)
    plan.add("padded_caption", WRITTEN, "leading/trailing whitespace, a tab and a newline",
             pictured(transform=lambda text, rng: "  " + text.replace(" ", " \t", 1) + " \n"))
    for text in MOJIBAKE_CAPTIONS:
        plan.add("mojibake", WRITTEN,
                 "UTF-8 read as Latin-1 upstream ('cafÃ© au lait'): valid text, kept; its words are frequent enough",
                 pictured(caption=text, photo_share=1.0, photo="coffee"), count=2, shared_caption=True)
    for text in NFC_CAPTIONS:
        for form in ("NFC", "NFD"):
            plan.add(f"unicode_{form.lower()}", WRITTEN,
                     f"the same words in {form} form: different raw alt-texts (and keys), one normalised text",
                     pictured(caption=unicodedata.normalize(form, text), photo_share=1.0, photo="coffee"),
                     shared_caption=True)


def plant_frequency_cases(plan: Plan) -> None:
    few = stages.reason("text_length", "too_few_words")
    for text, images in SHORT_BOILERPLATE.items():
        plan.add("boilerplate_short", few,
                 f"'{text}' on {images} images: fewer than 3 words, rejected before the images-per-text rule",
                 pictured(caption=text), count=images, shared_caption=True)
    shared = stages.reason("images_per_text", "shared_text")
    for text, images in BOILERPLATE.items():
        plan.add("boilerplate", shared, f"'{text}' on {images} distinct images (> {MAX_IMAGES_PER_TEXT})",
                 pictured(caption=text), count=images, shared_caption=True)
    text, images = SHARED_OVER
    plan.add("shared_text_11_images", shared, f"'{text}' on 11 distinct pictures of it: more than 10",
             pictured(caption=text, photo_share=0, dominant="circle", colour="red", background="white",
                      second_group=0, count=1), count=images, shared_caption=True)
    text, images = SHARED_AT
    plan.add("shared_text_10_images", WRITTEN, f"'{text}' on 10 distinct pictures of it: at most 10, kept",
             pictured(caption=text, photo_share=0, dominant="square", colour="blue", background="white",
                      second_group=0, count=1), count=images, shared_caption=True)

    def many_texts(unit, rng):
        spec = draw_content(rng, size=(260, 260), photo_share=0, dominant="star", colour="orange",
                            background="white", second_group=0, count=1)
        recipe = Recipe(content=spec, size=(260, 260), encode=("jpeg", 85))
        seen = set()
        for row in unit.rows:
            while True:
                _, text = content_with_caption(rng)
                if text_identity(text) not in seen:
                    seen.add(text_identity(text))
                    break
            row.caption, row.recipe = text, recipe

    plan.add("many_texts_one_image", stages.reason("texts_per_image", "too_many_texts"),
             f"one image (one URL, same bytes) with {TEXTS_PER_IMAGE_ROWS} distinct alt-texts (> {MAX_TEXTS_PER_IMAGE})",
             many_texts, count=TEXTS_PER_IMAGE_ROWS, url="https://img.example.com/static/placeholder/no-image.jpg")

    def junk(unit, rng):
        for row in unit.rows:
            row.caption = _junk_caption(rng)
            spec = draw_content(rng)
            row.recipe = Recipe(content=spec, size=tuple(spec["size"]))

    plan.add("junk_rare_tokens", stages.reason("rare_ngrams", "rare_ngram"),
             "a file-name / query-string alt-text: its random tokens occur once in the corpus", junk, count=8)

    def duplicated(unit, rng):
        spec, text = content_with_caption(rng)
        recipe = Recipe(content=spec, size=tuple(spec["size"]))
        for row in unit.rows:
            row.caption, row.recipe = text, recipe

    for copies in (2, 3):
        plan.add("duplicate_pair", WRITTEN_ONCE,
                 f"the same (url, caption) {copies} times: one is written, the rest are duplicate_pair/repeat",
                 duplicated, count=copies, url=f"https://img.example.com/uploads/repeated-{copies}.jpg")


def plant_near_duplicates(plan: Plan, guard: "NearDuplicateGuard", count: int = 14) -> None:
    """Edited copies of eval/test images, each one the near-duplicate embedder really detects.

    Sources are taken class by class; a source whose edited copy does not
    clear the embedder's threshold by ``NEAR_DUPLICATE_MARGIN / 5`` on the
    production path (JPEG bytes in, index built by ``dedup.index_sets``) is
    skipped for the next one, so the expectation is a fact, not a hope.
    """
    reason = stages.reason("near_duplicate_eval", EVAL_SET)
    per_class = collections.defaultdict(list)
    for path, spec in plan.eval_test:
        per_class[scenes.dominant_class(spec)].append((path, spec))
    sources = [per_class[label][rank] for rank in range(EVAL_PER_CLASS["test"]) for label in scenes.SHAPES]
    needed = guard.embedder.threshold + NEAR_DUPLICATE_MARGIN / 5
    planted = 0
    for edit in NEAR_DUPLICATE_EDITS[:count]:
        quality = edit[1] if edit[0] == "jpeg" else 88
        while sources:
            path, spec = sources.pop(0)
            recipe = Recipe(content=spec, size=tuple(spec["size"]), encode=("jpeg", quality), edit=edit)
            if guard.similarity_to(render_bytes(recipe), path) >= needed:
                break
        else:
            raise PlanError(f"only {planted} eval/test images survive the near-duplicate edits as detectable copies")
        described = scenes.flip_scene(spec) if edit[0] == "mirror" else spec

        def draw(unit, rng, spec=spec, described=described, recipe=recipe):
            for row in unit.rows:
                row.caption = draw_caption(described, rng) or scenes.SHAPES[0]
                row.recipe = dataclasses.replace(recipe)

        plan.add("near_duplicate_eval", reason, f"copy of {path}, edit {'/'.join(map(str, edit))}", draw)
        planted += 1


def plant_missing_column(plan: Plan, count: int = 8) -> None:
    plan.add("missing_caption_column", stages.reason("read", "missing_column"),
             "this part file has no caption column at all", pictured(), count=count, missing_column=True)


def plant_ordinary(plan: Plan, count: int) -> None:
    for _ in range(count):
        plan.add("ordinary", WRITTEN, "an ordinary picture and its alt-text", pictured())


# ---------------------------------------------------------------------------
# Evaluation images
# ---------------------------------------------------------------------------


def eval_path(split: str, label: str, index: int) -> str:
    return f"eval/{split}/{label}/{label}_{index:03d}.png"


def eval_specs(seed: int) -> List[Tuple[str, str, int, dict]]:
    """(split, class, index, spec) of every evaluation image."""
    specs = []
    for split_id, (split, per_class) in enumerate(EVAL_PER_CLASS.items()):
        for class_id, label in enumerate(scenes.SHAPES):
            for index in range(per_class):
                rng = _rng(seed, STREAM_EVAL, split_id, class_id, index)
                side = int(rng.integers(*EVAL_SIZES))
                spec = draw_content(rng, size=(side, side), photo_share=0, dominant=label, second_group=0.3)
                specs.append((split, label, index, spec))
    return specs


def _render_png(spec: dict) -> bytes:
    return _save(scenes.render(spec), "PNG")


# ---------------------------------------------------------------------------
# Checks: the plan's expectations hold
# ---------------------------------------------------------------------------


class PlanError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def ngram_list(caption: str) -> tuple:
    return tuple(ngrams(normalize_text(caption)))


@functools.lru_cache(maxsize=None)
def ngram_set(caption: str) -> frozenset:
    return frozenset(ngram_list(caption))


def ngram_support(plan: Plan) -> collections.Counter:
    """n-gram occurrences over the alt-texts of every row that passes the read stage."""
    support = collections.Counter()
    for row in plan.rows:
        if row.reaches("image_header"):
            support.update(ngram_list(row.caption))
    return support


def rare_rows(plan: Plan) -> List[Row]:
    """Rows expected to be written whose alt-text has an n-gram short of the margin."""
    support = ngram_support(plan)
    return [row for row in plan.rows
            if row.should_be_frequent and any(support[g] < NGRAM_SUPPORT for g in ngram_set(row.caption))]


def overused_rows(plan: Plan) -> List[Row]:
    """Ordinary rows whose alt-text is already used by 3 other images, or is a planted shared one."""
    reserved = {wording_key(r.caption) for r in plan.rows if r.shared_caption and r.caption}
    images = collections.defaultdict(list)
    for row in plan.rows:
        if row.reaches("images_per_text") and not row.shared_caption:
            images[wording_key(row.caption)].append(row)
    bad = []
    for key, rows in images.items():
        distinct, kept = set(), 0
        for row in sorted(rows, key=lambda r: r.slot):
            if key in reserved:
                bad.append(row)
            elif id(row.recipe) in distinct:
                continue
            elif kept < MAX_IMAGES_PER_ORDINARY_TEXT:
                distinct.add(id(row.recipe))
                kept += 1
            else:
                bad.append(row)
    return bad


class NearDuplicateGuard:
    """The build's near-duplicate embedder and eval/test index, for the plan's checks.

    The index is built exactly as the build builds it (``dedup.index_sets``,
    with its flipped and centre-cropped variants). Ordinary pictures are
    embedded from a 32x32 rendering (cheap) and kept ``NEAR_DUPLICATE_MARGIN``
    below the threshold; planted copies are embedded from their real bytes.
    """

    def __init__(self, eval_test: List[Tuple[str, bytes]], workers: Workers):
        from dedup import embedders
        from dedup.index_sets import IndexImage, build_index

        self.embedder = embedders.get(NEAR_DUPLICATE_EMBEDDER)
        self.limit = self.embedder.threshold - NEAR_DUPLICATE_MARGIN
        self.workers = workers
        index = build_index([IndexImage(EVAL_SET, path, data) for path, data in eval_test], self.embedder)
        self.index, self.keys = index.vectors, index.keys
        self.cache: Dict[Tuple[int, int], float] = {}

    def similarity_to(self, data: bytes, key: str) -> float:
        vector = self.embedder.embed([data])[0]
        return float((self.index[self.keys == key] @ vector).max())

    @staticmethod
    def applies(row: Row) -> bool:
        """Pictures that reach the near-duplicate stage and are not planted copies."""
        return (row.reaches("near_duplicate_eval") and row.stage != "near_duplicate_eval"
                and row.recipe is not None and row.recipe.content is not None)

    def final_max(self, plan: Plan) -> float:
        values = [self.cache.get((u.slot, u.attempt), 0.0) for u in plan.units if self.applies(u.rows[0])]
        return max(values, default=0.0)

    def similarity(self, specs: List[dict]) -> np.ndarray:
        if not specs:
            return np.zeros(0)
        vectors = self.embedder.embed_pil(self.workers.map(_thumbnail, specs, chunksize=64))
        return (vectors @ self.index.T).max(axis=1)

    def too_close(self, plan: Plan) -> List[Row]:
        todo, keys = [], []
        for unit in plan.units:
            row = unit.rows[0]
            if self.applies(row):
                key = (unit.slot, unit.attempt)
                if key not in self.cache:
                    todo.append(row.recipe.content)
                    keys.append(key)
        for key, value in zip(keys, self.similarity(todo)):
            self.cache[key] = float(value)
        bad = []
        for unit in plan.units:
            value = self.cache.get((unit.slot, unit.attempt))
            if value is not None and self.applies(unit.rows[0]):
                if value > self.limit:
                    bad.extend(unit.rows)
        return bad


def settle(plan: Plan, guard: Optional[NearDuplicateGuard], max_rounds: int = 60) -> int:
    """Re-draw units until every expectation about alt-texts and pictures holds.

    A unit whose alt-text is rare or overused is re-worded (and re-drawn);
    one whose picture is close to an evaluation image is re-drawn. Units are
    visited in slot order and each draws from its own (slot, attempt) stream,
    so the outcome depends on the seed only.
    """
    by_slot = {row.slot: unit for unit in plan.units for row in unit.rows}
    for round_index in range(max_rounds):
        wording = rare_rows(plan) + overused_rows(plan)
        stuck = sorted({r.case for r in wording if by_slot[r.slot].fixed_caption})
        if stuck:
            raise PlanError(f"planted alt-texts break the plan's expectations: {stuck}")
        bad_rows = wording + (guard.too_close(plan) if guard else [])
        if not bad_rows:
            return round_index
        units = {by_slot[r.slot].slot: by_slot[r.slot] for r in bad_rows}
        for slot in sorted(units):
            plan.redraw(units[slot], units[slot].attempt + 1)
    raise PlanError(f"alt-texts still rare or overused after {max_rounds} rounds of re-drawing")


def verify_plan(plan: Plan) -> Dict[str, object]:
    """Recompute every whole-corpus expectation from the rows; fail loudly on a mismatch."""
    rows = [r for r in plan.rows if not r.missing_column]
    problems = []
    # Rows expected to pass the per-record text rules have a 3..20-word alt-text.
    for row in rows:
        if row.reaches("text_repetition") and not (3 <= word_count(row.caption) <= 20):
            problems.append(f"{row.case}: {row.caption!r} should pass the length rule")
    # texts per image: per recipe (one image), distinct alt-texts of the rows reaching the stage.
    texts = collections.defaultdict(set)
    for row in rows:
        if row.reaches("texts_per_image"):
            texts[id(row.recipe)].add(text_identity(row.caption))
    for row in rows:
        if row.reaches("texts_per_image"):
            too_many = len(texts[id(row.recipe)]) > MAX_TEXTS_PER_IMAGE
            if too_many != (row.stage == "texts_per_image"):
                problems.append(f"{row.case}: texts_per_image expectation does not match the rows")
    # images per text: per alt-text, distinct images among rows reaching the stage.
    images = collections.defaultdict(set)
    for row in rows:
        if row.reaches("images_per_text"):
            images[text_identity(row.caption)].add(id(row.recipe))
    for row in rows:
        if row.reaches("images_per_text"):
            shared = len(images[text_identity(row.caption)]) > MAX_IMAGES_PER_TEXT
            if shared != (row.stage == "images_per_text"):
                problems.append(f"{row.case}: images_per_text expectation does not match ({row.caption!r})")
    # rare n-grams: vocabulary = n-grams with >= MIN_NGRAM_COUNT occurrences over *all* alt-texts
    # (an upper bound for what the pipeline counts); junk must have one n-gram outside it.
    occurrences = collections.Counter()
    for row in rows:
        if row.caption is not None:
            occurrences.update(ngrams(normalize_text(row.caption)))
    for row in rows:
        if row.reaches("rare_ngrams") and row.stage == "rare_ngrams":
            if all(occurrences[g] >= MIN_NGRAM_COUNT for g in ngrams(normalize_text(row.caption))):
                problems.append(f"{row.case}: {row.caption!r} has no rare n-gram")
    rare = rare_rows(plan)
    problems += [f"{r.case}: {r.caption!r} has a rare n-gram" for r in rare]
    # One pipeline key per row, except the planted repeats.
    keys = collections.Counter(row_key(r) for r in plan.rows)
    for row in plan.rows:
        if (keys[row_key(row)] > 1) != (row.expected == WRITTEN_ONCE):
            problems.append(f"{row.case}: pipeline key {row_key(row)} repeats unexpectedly")
    if problems:
        raise PlanError("the sample's expectations do not hold:\n  " + "\n  ".join(sorted(set(problems))[:30]))
    return {"vocabulary_ngrams": sum(1 for g, c in occurrences.items() if c >= MIN_NGRAM_COUNT),
            "ngrams": len(occurrences)}


def row_key(row: Row) -> str:
    return make_key(row.url, "" if row.missing_column or row.caption is None else row.caption)


# ---------------------------------------------------------------------------
# URLs
# ---------------------------------------------------------------------------


def _slug(caption: Optional[str]) -> str:
    ascii_words = [w for w in words(normalize_text(caption or "")) if w.isascii() and w.isalnum()]
    return "-".join(ascii_words[:5]) or "image"


def assign_urls(plan: Plan) -> None:
    for row in plan.rows:
        if row.url:
            continue
        rng = _rng(plan.seed, STREAM_URL, row.slot)
        token = rng.bytes(5).hex()
        slug = _slug(row.caption)
        form = int(rng.integers(0, 4))
        if form == 0:
            path = f"uploads/{int(rng.integers(2012, 2024))}/{int(rng.integers(1, 13)):02d}/{slug}-{token}"
        elif form == 1:
            path = f"products/{int(rng.integers(10000, 999999))}/{slug}-{token}"
        elif form == 2:
            path = f"photos/{token[:2]}/{token}"
        else:
            path = f"blog/images/{slug}_{token}"
        row.url = f"https://img.example.com/{path}.{row.url_ext}"


# ---------------------------------------------------------------------------
# Build the plan, write the files
# ---------------------------------------------------------------------------


def build_plan(num_candidates: int, seed: int, workers: Optional[Workers] = None) -> Plan:
    """Every row with its picture recipe, alt-text, URL and expected fate; checked."""
    plan = Plan(seed)
    plan.num_candidates = num_candidates
    plan.evaluation = eval_specs(seed)
    plan.eval_test = [(eval_path(split, label, index), spec) for split, label, index, spec in plan.evaluation
                      if split == "test"]
    plant_read_cases(plan)
    plant_header_cases(plan)
    plant_format_cases(plan)
    plant_size_cases(plan)
    plant_exif_cases(plan)
    plant_decode_cases(plan)
    plant_text_cases(plan)
    plant_frequency_cases(plan)
    workers = workers or Workers(1)
    pngs = workers.map(_render_png, [spec for _, spec in plan.eval_test], chunksize=8)
    guard = NearDuplicateGuard([(path, png) for (path, _), png in zip(plan.eval_test, pngs)], workers)
    plant_near_duplicates(plan, guard)
    plant_missing_column(plan)
    plant_ordinary(plan, num_candidates)
    rounds = settle(plan, guard)
    assign_urls(plan)
    plan.facts = verify_plan(plan)
    plan.facts.update({
        "settle_rounds": rounds,
        "near_duplicate_embedder": NEAR_DUPLICATE_EMBEDDER,
        "near_duplicate_limit": round(guard.limit, 4),
        "max_ordinary_eval_similarity": round(guard.final_max(plan), 4),
    })
    return plan


def _reported_size(row: Row, data: Optional[bytes]):
    if row.reported_size is None or data is None:
        return None, None
    if row.reported_size != "header":
        return row.reported_size
    with Image.open(io.BytesIO(data)) as img:
        return img.size


def _oriented_size(row: Row) -> Optional[List[int]]:
    recipe = row.recipe
    if recipe is None or recipe.raw is not None:
        return None
    if recipe.header_size:
        return list(recipe.header_size)
    size = recipe.size
    if recipe.edit and recipe.edit[0] == "resize":
        size = (round(size[0] * recipe.edit[1]), round(size[1] * recipe.edit[1]))
    return list(size)


def write_sample(out: str, num_candidates: int = 3000, seed: int = 0, processes: int = 0, log=print) -> dict:
    """Plan and write the sample under ``out``; returns what sample_info.json holds."""
    started, cpu_started = time.time(), _cpu_seconds()
    processes = processes or os.cpu_count() or 1
    with Workers(processes) as workers:
        plan = build_plan(num_candidates, seed, workers)
        planned = time.time()
        info = write_plan(plan, out, workers)
    elapsed = time.time() - started
    fates = info["expected_fates"]
    log(f"sample: {info['num_rows']} rows ({num_candidates} ordinary + {info['num_planted_rows']} planted) "
        f"in {len(info['parts'])} parts, {info['num_cases']} cases, {info['num_eval_images']} eval images")
    log("sample: expected fates: " + ", ".join(f"{k} {v}" for k, v in sorted(fates.items())))
    cpu = _cpu_seconds() - cpu_started
    log(f"sample: {info['num_bytes'] / 1e6:.1f} MB in {elapsed:.1f} s (planning {planned - started:.1f} s), "
        f"{info['num_rows'] / elapsed:.0f} rows/s, {processes} processes, {cpu:.1f} CPU-s -> {out}")
    return info


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the pool's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def write_plan(plan: Plan, out: str, workers: Optional[Workers] = None) -> dict:
    """Render and write a plan's files; returns what sample_info.json holds."""
    seed, evaluation = plan.seed, plan.evaluation
    workers = workers or Workers(1)

    main_rows = [r for r in plan.rows if not r.missing_column]
    extra_rows = [r for r in plan.rows if r.missing_column]
    order = _rng(seed, STREAM_SHUFFLE).permutation(len(main_rows))
    main_rows = [main_rows[i] for i in order]
    num_main_parts = max(MIN_PARTS, math.ceil(len(main_rows) / ROWS_PER_PART))
    num_parts = num_main_parts + 1
    bounds = np.linspace(0, len(main_rows), num_main_parts + 1).round().astype(int)
    parts = [main_rows[bounds[i]:bounds[i + 1]] for i in range(num_main_parts)] + [extra_rows]

    os.makedirs(os.path.join(out, "candidates"), exist_ok=True)
    cache: Dict[int, bytes] = {}  # recipes used by several rows, rendered once
    uses = collections.Counter(id(r.recipe) for r in plan.rows if r.recipe is not None)
    manifest, total_bytes = [], 0
    for part_index, rows in enumerate(parts):
        name = f"part-{part_index:05d}-of-{num_parts:05d}.parquet"
        todo = {id(r.recipe): r.recipe for r in rows if r.recipe is not None and id(r.recipe) not in cache}
        rendered = dict(zip(todo, workers.map(render_bytes, list(todo.values()))))
        columns = collections.defaultdict(list)
        for row_index, row in enumerate(rows):
            data = None
            if row.recipe is not None:
                data = cache[id(row.recipe)] if id(row.recipe) in cache else rendered[id(row.recipe)]
                if uses[id(row.recipe)] > 1:
                    cache[id(row.recipe)] = data
            key = f"{part_index:05d}{row_index:04d}"
            width, height = _reported_size(row, data)
            columns["key"].append(key)
            columns["url"].append(row.url)
            columns["caption"].append(row.caption)
            columns["status"].append(row.status)
            columns["error_message"].append(row.error_message)
            columns["width"].append(width)
            columns["height"].append(height)
            columns["jpg"].append(data)
            manifest.append({
                "pipeline_key": row_key(row), "url": row.url, "case": row.case, "expected": row.expected,
                "note": row.note, "key": key, "file": name, "size": _oriented_size(row),
            })
        schema = MISSING_COLUMN_SCHEMA if rows is extra_rows else CANDIDATE_SCHEMA
        table = pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema}, schema=schema)
        path = os.path.join(out, "candidates", name)
        pq.write_table(table, path, row_group_size=ROW_GROUP_SIZE, compression="snappy")
        total_bytes += os.path.getsize(path)

    with open(os.path.join(out, "manifest.jsonl"), "w", encoding="utf-8") as f:
        for line in manifest:
            f.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")

    pngs = workers.map(_render_png, [spec for *_, spec in evaluation], chunksize=8)
    for (split, label, index, _), data in zip(evaluation, pngs):
        path = os.path.join(out, eval_path(split, label, index))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        total_bytes += len(data)

    fates = collections.Counter(line["expected"] for line in manifest)
    info = {
        "num_candidates": plan.num_candidates,
        "num_rows": len(manifest),
        "num_planted_rows": len(manifest) - plan.num_candidates,
        "num_cases": len({line["case"] for line in manifest}),
        "num_eval_images": len(evaluation),
        "num_bytes": total_bytes,
        "seed": seed,
        "parts": [f"candidates/part-{i:05d}-of-{num_parts:05d}.parquet" for i in range(num_parts)],
        "eval_images": f"{EVAL_SET}=eval/test",
        "eval_train_images": "eval/train",
        "zeroshot_classes": list(scenes.SHAPES),
        "build_overrides": build_overrides(),
        "expected_fates": dict(sorted(fates.items())),
        "checks": plan.facts,
    }
    with open(os.path.join(out, "sample_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    return info


def build_overrides() -> List[str]:
    """``--set`` values the build needs for this tiny corpus (see the module doc)."""
    return ["vocab_size=0", f"min_ngram_count={MIN_NGRAM_COUNT}", f"num_clusters={SAMPLE_NUM_CLUSTERS}"]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--num-candidates", type=int, default=3000, help="ordinary candidates (planted rows come on top)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=0, help="worker processes (0: one per CPU); never changes the output")
    args = parser.parse_args(argv)
    if args.num_candidates < 0:
        parser.error("--num-candidates must be >= 0")
    write_sample(args.out, args.num_candidates, args.seed, args.processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
