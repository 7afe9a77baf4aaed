"""The planted cases: one group of rows per fault or threshold, each with its fate.

Every ``plant_*`` adds units to the plan with the fate a correct ALIGN build
must give them: read faults, header faults and bombs, formats, sizes and
aspect ratios at and around each threshold, EXIF orientation, corrupt pixel
data, caption faults, whole-corpus frequency cases, near-duplicates of
evaluation images, a part file without a caption column, and the ordinary
rows.
"""

from __future__ import annotations

import collections
import dataclasses
import unicodedata

from common.images import upright_size
from filters import stages
from filters.text import text_identity
from pipeline.readers.rows import download_reason
from samplegen import scenes
from samplegen.checks import PlanError
from samplegen.drawers import content_with_caption, draw_caption, draw_content, fixed_bytes, pictured
from samplegen.evalset import EVAL_PER_CLASS, EVAL_SET
from samplegen.faults import HTML_CAPTCHA_PAGE, HTML_ERROR_PAGE, PDF_DOCUMENT, SVG_IMAGE
from samplegen.plan import (
    CLEAN, MAX_ASPECT, MAX_IMAGES_PER_TEXT, MAX_TEXTS_PER_IMAGE, MIN_SHORTER_SIDE, MISMATCHED, MISMATCHED_SHARE,
    NEAR_DUPLICATE_MARGIN, TEXTS_PER_IMAGE_ROWS, WRITTEN, WRITTEN_ONCE, Plan, Recipe, expected_image_fate,
    word_count,
)
from samplegen.render import render_bytes


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
        raw = upright_size(size, orientation)  # the stored size: the same swap
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
             pictured(transform=zero_width, describes=True), count=2)
    plan.add("padded_caption", WRITTEN, "leading/trailing whitespace, a tab and a newline",
             pictured(transform=lambda text, rng: "  " + text.replace(" ", " \t", 1) + " \n", describes=True))
    for text in MOJIBAKE_CAPTIONS:
        plan.add("mojibake", WRITTEN,
                 "UTF-8 read as Latin-1 upstream ('cafÃ© au lait'): valid text, kept; its words are frequent enough",
                 pictured(caption=text, photo_share=1.0, photo="coffee", describes=True), count=2,
                 shared_caption=True)
    for text in NFC_CAPTIONS:
        for form in ("NFC", "NFD"):
            plan.add(f"unicode_{form.lower()}", WRITTEN,
                     f"the same words in {form} form: different raw alt-texts (and keys), one normalised text",
                     pictured(caption=unicodedata.normalize(form, text), photo_share=1.0, photo="coffee",
                              describes=True),
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
                      second_group=0, count=1, describes=True), count=images, shared_caption=True)
    text, images = SHARED_AT
    plan.add("shared_text_10_images", WRITTEN, f"'{text}' on 10 distinct pictures of it: at most 10, kept",
             pictured(caption=text, photo_share=0, dominant="square", colour="blue", background="white",
                      second_group=0, count=1, describes=True), count=images, shared_caption=True)

    def many_texts(unit, rng):
        spec = draw_content(rng, size=(260, 260), photo_share=0, dominant="star", colour="orange",
                            background="white", second_group=0, count=1)
        recipe = Recipe(content=spec, size=(260, 260), encode=("jpeg", 85))
        seen = set()
        for row in unit.rows:
            while True:
                worded_from, text = content_with_caption(rng)
                if text_identity(text) not in seen:
                    seen.add(text_identity(text))
                    break
            row.caption, row.recipe = text, recipe
            # Worded for other drawings: one without a star describes another picture; one with a
            # star may fit this one, so it has no stated pairing.
            row.pairing = None if "star" in scenes.scene_shapes(worded_from) else MISMATCHED

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
            row.caption, row.recipe, row.pairing = text, recipe, CLEAN

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
                row.pairing = CLEAN

        plan.add("near_duplicate_eval", reason, f"copy of {path}, edit {'/'.join(map(str, edit))}", draw)
        planted += 1


def plant_missing_column(plan: Plan, count: int = 8) -> None:
    plan.add("missing_caption_column", stages.reason("read", "missing_column"),
             "this part file has no caption column at all", pictured(), count=count, missing_column=True)


def plant_ordinary(plan: Plan, count: int) -> None:
    for _ in range(count):
        plan.add("ordinary", WRITTEN, "an ordinary picture and its alt-text", pictured())


def describe_another_scene(rng, spec: dict) -> str:
    """The alt-text of another drawn scene, one that shows none of ``spec``'s shapes."""
    shown = set(scenes.scene_shapes(spec))
    for _ in range(200):
        other = draw_content(rng, size=spec["size"], photo_share=0)
        if shown.isdisjoint(scenes.scene_shapes(other)):
            caption = draw_caption(other, rng)
            if caption is not None:
                return caption
    raise PlanError(f"no scene without the shapes {sorted(shown)}")


def mismatched(unit, rng):
    for row in unit.rows:
        spec = draw_content(rng)
        row.caption = describe_another_scene(rng, spec)
        row.recipe = Recipe(content=spec, size=tuple(spec["size"]))
        row.pairing = MISMATCHED


def plant_mismatched(plan: Plan, num_candidates: int) -> None:
    """Ordinary-looking pairs whose alt-text describes another picture (web alt-text noise).

    The picture is drawn as an ordinary one is (a scene or a photo crop) and
    the alt-text is a real one, worded for another drawn scene that shows
    none of the picture's shapes: every rule of ALIGN keeps it; only a
    model that looks at both can tell. Planted after the ordinary rows, so
    that every other row keeps its slot and its drawing.
    """
    for _ in range(round(MISMATCHED_SHARE * num_candidates)):
        plan.add("mismatched_pair", WRITTEN, "an alt-text worded for another drawn scene (none of this picture's "
                 "shapes): a well-formed pair that does not match", mismatched)
