"""The per-record rules in two parts (``filters.record``): the image part once per image, the row part per row.

``judge_row(row, judge_image(bytes, ...))`` must give what ``judge_record``
gives for every record: planted bad images, text failures, stated source
sizes, extra stages at every anchor, both counting bases and identities.
The image part is judged only as far as the row parts need
(``row_needs``), as the download path judges a URL for the union of its
rows' needs; the file path keeps its short-circuit (no decode when the
text fails).
"""

import dataclasses
import io
import itertools
import random
import struct

import pytest
from PIL import Image

from common.schema import Candidate
from filters import image as image_rules
from filters import record
from filters.extra_stages import RecordStage
from filters.presets import get_preset


def encoded(size, fmt="JPEG", mode="RGB", seed=0, exif_orientation=None):
    img = Image.new(mode, size)
    w, h = size
    if mode in ("RGB", "CMYK"):
        img.putdata([((x * 7 + seed) % 256, (y * 5 + seed) % 256, ((x ^ y) + seed) % 256) + ((0,) if mode == "CMYK" else ())
                     for y in range(h) for x in range(w)])
    out = io.BytesIO()
    kwargs = {}
    if exif_orientation:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        kwargs["exif"] = exif
    img.save(out, format=fmt, **kwargs)
    return out.getvalue()


def bomb_header():
    """A PNG whose header claims 100000 x 100000 pixels."""
    data = encoded((8, 8), "PNG")
    ihdr = data.index(b"IHDR")
    return data[: ihdr + 4] + struct.pack(">II", 100_000, 100_000) + data[ihdr + 12:]


GOOD = encoded((320, 240), seed=1)
IMAGES = {
    "good": GOOD,
    "rotated": encoded((300, 220), seed=2, exif_orientation=6),
    "png": encoded((260, 260), "PNG", seed=3),
    "gif": encoded((260, 230), "GIF", mode="P"),
    "cmyk": encoded((240, 260), "JPEG", mode="CMYK", seed=4),
    "small": encoded((120, 90), seed=5),
    "elongated": encoded((900, 210), seed=6),
    "big": encoded((700, 400), seed=7),
    "truncated": GOOD[: len(GOOD) // 2],
    "corrupt": GOOD[:600] + bytes(random.Random(0).getrandbits(8) for _ in range(len(GOOD) - 600)),
    "not_an_image": b"<html><body>not an image</body></html>",
    "empty": b"",
    "bomb": bomb_header(),
}
TEXTS = [
    "a red barn in a wide green field", "", "   ", "cat", "two words", "word " * 30, "dog dog dog dog dog dog",
    "caf\ufffd au lait on a table", "x" * 1200,
]
SOURCE_SIZES = [(0, 0), (1000, 600), (900, 700), (150, 150), (2000, 300), (1200, 420)]


def _red(view):
    return "red" if "red" in view.text else None


def _tiny_file(view):
    return "tiny" if len(view.image) < 3000 else None


def _wide(view):
    return "wide" if view.width > 1.5 * view.height else None


EXTRAS = [
    (),
    (RecordStage("no_red", after="text_repetition", check=_red, reasons=("red",)),),
    (RecordStage("small_file", after="image_aspect", check=_tiny_file, reasons=("tiny",)),
     RecordStage("late_wide", after="image_decode", check=_wide, reasons=("wide",))),
]
#: Each preset with a set of extra stages.
CASES = [
    (get_preset("align"), EXTRAS[1]),
    (get_preset("align", counting_base="survivors"), EXTRAS[2]),
    (get_preset("align", image_identity="phash", max_word_repetition=0.5), EXTRAS[0]),
    (get_preset("cc12m"), EXTRAS[2]),
    (get_preset("align", formats=("JPEG",), min_shorter_side=100, image_identity="phash"), EXTRAS[2]),
]


def records():
    for (name, data), text, (sw, sh) in itertools.product(IMAGES.items(), TEXTS, SOURCE_SIZES):
        yield name, Candidate(key=f"{name}/{len(text)}/{sw}", url=f"https://e.x/{name}.jpg", alt_text=text,
                              image=data, source_width=sw, source_height=sh, carried=(("k", "v"),))


def composed(candidate, preset, extras):
    """The download path's way: the image judged once for its rows' needs, then the row without its bytes."""
    facts = record.judge_image(candidate.image, preset,
                               decode=bool(record.row_needs(candidate, preset) & record.NEEDS_IDENTITY))
    return record.judge_row(candidate.replace(image=None), facts, preset, extras)


def without_image(judgement):
    return dataclasses.replace(judgement, candidate=judgement.candidate.replace(image=None))


@pytest.mark.parametrize("preset,extras", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_the_two_parts_give_what_judge_record_gives_for_every_record(preset, extras):
    reasons = set()
    for name, candidate in records():
        expected = without_image(record.judge_record(candidate, preset, extras))
        assert composed(candidate, preset, extras) == expected, (name, candidate.alt_text[:40], extras)
        reasons.add(expected.reason)
    # The inputs reach every kind of outcome.
    expected_stages = {"image_header", "image_size", "image_aspect", "text", "text_length", "image_decode"}
    expected_stages |= {"text_repetition"} if preset.max_word_repetition < 1 else set()
    expected_stages |= {"image_format"} if "GIF" not in preset.formats else set()
    expected_stages |= {stage.name for stage in extras}
    assert {r.split("/")[0] for r in reasons if r} >= expected_stages
    assert None in reasons


def test_one_image_judged_once_serves_all_of_its_rows():
    preset = get_preset("align", image_identity="phash")
    facts = record.judge_image(GOOD, preset)
    for text in TEXTS:
        candidate = Candidate(key=text[:8], url="https://e.x/good.jpg", alt_text=text, image=GOOD)
        assert record.judge_row(candidate.replace(image=None), facts, preset) == without_image(
            record.judge_record(candidate, preset))


def test_the_file_path_decodes_nothing_when_the_text_fails(monkeypatch):
    calls = []
    real = image_rules.identify
    monkeypatch.setattr(image_rules, "identify", lambda *a, **k: calls.append(1) or real(*a, **k))
    preset = get_preset("align", counting_base="survivors")
    judged = record.judge_record(Candidate("k", "u", "cat", GOOD), preset)
    assert judged.reason == "text_length/too_few_words" and calls == []
    record.judge_record(Candidate("k", "u", "a red barn in a wide green field", GOOD), preset)
    assert calls == [1]


def test_row_needs_says_what_the_image_part_may_skip():
    align, survivors = get_preset("align", image_identity="phash"), get_preset("align", counting_base="survivors")
    both = record.NEEDS_IDENTITY | record.NEEDS_SCORES
    assert record.row_needs(Candidate("k", "u", "a red barn in a field"), survivors) == both
    stated = Candidate("k", "u", "a red barn in a field", source_width=900, source_height=700)
    assert record.row_needs(stated, survivors) == both | record.STATES_SIZE
    assert record.row_needs(Candidate("k", "u", "cat"), survivors) == 0
    assert record.row_needs(Candidate("k", "u", "cat"), align) == record.NEEDS_IDENTITY  # counted in the raw pool
    assert record.row_needs(Candidate("k", "u", ""), align) == 0  # no readable text: not in the pool
    small = record.judge_image(IMAGES["small"], align)
    assert not record.scores_needed(small, both, align) and record.scores_needed(small, both | record.STATES_SIZE, align)
    assert record.scores_needed(record.judge_image(GOOD, align), both, align)
    assert not record.scores_needed(record.judge_image(GOOD, align), record.NEEDS_IDENTITY, align)
    with pytest.raises(ValueError, match="without the decode"):
        record.judge_row(Candidate("k", "u", "a red barn in a field"), record.judge_image(GOOD, align, decode=False),
                         align)
