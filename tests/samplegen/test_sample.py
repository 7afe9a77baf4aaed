"""The embedded sample corpus generator (``samplegen``).

One small sample (200 ordinary candidates plus every planted case) is
generated per module and checked file by file: layout, determinism, the
manifest against the real per-record filters, and that each planted file is
what its case says (truncated, a bomb, rotated by EXIF, ...).
"""

from __future__ import annotations

import collections
import glob
import io
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageOps

from common.schema import make_key
from filters import stages
from filters.presets import get_preset
from filters.text import ngrams, normalize_text, text_identity
from samplegen import checks, content, drawers, evalset, faults, generate, render, scenes, writer
from samplegen import plan as plan_lib

NUM_CANDIDATES = 200
SEED = 0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REASONS = {
    "read/missing_column", "read/no_image", "read/missing_caption", "read/caption_not_utf8",
    "read/download_failed/http_404", "read/download_failed/timeout", "read/download_failed/http_403",
    "read/download_failed/failed_to_resize",
    "image_header/undecodable", "image_header/decompression_bomb", "image_format/not_allowed",
    "image_size/too_small", "image_aspect/too_elongated", "text/empty", "text/invalid_encoding",
    "text/too_long_chars", "text_length/too_few_words", "text_length/too_many_words", "image_decode/corrupt",
    "texts_per_image/too_many_texts", "images_per_text/shared_text", "rare_ngrams/rare_ngram",
    "near_duplicate_eval/sample_eval", "duplicate_pair/repeat",
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sample"))
    info = generate.write_sample(out, NUM_CANDIDATES, SEED, processes=1, log=lambda *_: None)
    return out, info


@pytest.fixture(scope="module")
def other_plan():
    """A plan (not written) with another seed."""
    return generate.build_plan(60, seed=4)


@pytest.fixture(scope="module")
def manifest(generated):
    out, _ = generated
    with open(os.path.join(out, "manifest.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def rows(generated, manifest):
    """Every parquet row joined with its manifest line: {key: (row dict, manifest line)}."""
    out, _ = generated
    by_key = {m["key"]: m for m in manifest}
    joined = {}
    for path in sorted(glob.glob(os.path.join(out, "candidates", "*.parquet"))):
        for row in pq.read_table(path).to_pylist():
            joined[row["key"]] = (row, by_key[row["key"]])
    return joined


def _case(rows, case):
    found = [(r, m) for r, m in rows.values() if m["case"] == case]
    assert found, f"no rows of case {case!r}"
    return found


def _open(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


# ---------------------------------------------------------------------------
# Layout and determinism
# ---------------------------------------------------------------------------


def test_layout(generated, manifest, rows):
    out, info = generated
    parts = sorted(os.listdir(os.path.join(out, "candidates")))
    assert parts == [os.path.basename(p) for p in info["parts"]]
    k = len(parts)
    assert k >= writer.MIN_PARTS + 1
    assert parts == [f"part-{i:05d}-of-{k:05d}.parquet" for i in range(k)]
    for name in parts[:-1]:
        assert pq.read_schema(os.path.join(out, "candidates", name)).names == writer.CANDIDATE_SCHEMA.names
    last = pq.read_table(os.path.join(out, "candidates", parts[-1]))
    assert "caption" not in last.column_names and last.num_rows > 0
    assert {m["expected"] for m in manifest if m["file"] == parts[-1]} == {"read/missing_column"}
    # Exactly one manifest line per row, and pipeline keys as the reader computes them.
    assert len(rows) == len(manifest) == info["num_rows"]
    assert len({m["key"] for m in manifest}) == len(manifest)
    for row, line in rows.values():
        assert line["url"] == row["url"] and line["file"] in parts
        assert line["pipeline_key"] == make_key(row["url"], row.get("caption") or "")
    assert info["num_rows"] == NUM_CANDIDATES + info["num_planted_rows"]
    assert sum(1 for m in manifest if m["case"] == "ordinary") == NUM_CANDIDATES


def test_img2dataset_columns(rows):
    for row, line in rows.values():
        assert row["key"].isdigit() and len(row["key"]) == 9
        assert row["url"].startswith("https://img.example.com/")
        assert row["status"] in ("success", "failed_to_download")
        if row["status"] == "failed_to_download":
            assert row["jpg"] is None and row["error_message"]
    # URLs are unique per distinct image, except the planted shared ones.
    images_per_url = collections.defaultdict(set)
    for row, line in rows.values():
        images_per_url[row["url"]].add(row["jpg"])
    assert all(len(images) == 1 for images in images_per_url.values())
    counts = collections.Counter(row["url"] for row, _ in rows.values())
    cases = {line["case"] for row, line in rows.values() if counts[row["url"]] > 1}
    assert cases == {"many_texts_one_image", "duplicate_pair"}


def test_manifest_reasons_are_in_the_catalogue(manifest):
    fates = {m["expected"] for m in manifest}
    assert fates - {"written", "written_once"} <= REASONS
    for fate in fates - {"written", "written_once"}:
        assert stages.stage_of(fate) in stages.STAGE_NAMES
    # Every reason is planted, except one a string column cannot hold, and
    # repeats, which are "written_once" groups (the pipeline picks the kept row).
    assert REASONS - fates == {"read/caption_not_utf8", "duplicate_pair/repeat"}


def test_same_seed_same_bytes_whatever_the_processes(generated, tmp_path):
    out, _ = generated
    again = str(tmp_path / "again")
    # The command line, in a fresh interpreter, with a process pool (the fixture used none).
    subprocess.run([sys.executable, "-m", "samplegen", "--out", again, "--num_candidates", str(NUM_CANDIDATES),
                    "--seed", str(SEED), "--processes", "2"], check=True, cwd=ROOT, capture_output=True)
    names = sorted(os.path.relpath(p, out) for p in glob.glob(os.path.join(out, "**", "*"), recursive=True)
                   if os.path.isfile(p))
    assert names == sorted(os.path.relpath(p, again) for p in glob.glob(os.path.join(again, "**", "*"), recursive=True)
                           if os.path.isfile(p))
    for name in names:
        with open(os.path.join(out, name), "rb") as a, open(os.path.join(again, name), "rb") as b:
            assert a.read() == b.read(), name


def test_another_seed_another_sample(rows, other_plan):
    ours = {r["caption"] for r, m in rows.values() if m["case"] == "ordinary"}
    theirs = {r.caption for r in other_plan.rows if r.case == "ordinary"}
    assert len(theirs - ours) > len(theirs) // 2


def test_sample_info(generated, manifest):
    out, info = generated
    pairings = collections.Counter(m["pairing"] or "none" for m in manifest)
    assert info["pairings"] == dict(pairings) and set(pairings) == {"clean", "mismatched", "none"}
    mismatched = [m for m in manifest if m["case"] == "mismatched_pair"]
    assert len(mismatched) == round(plan_lib.MISMATCHED_SHARE * NUM_CANDIDATES)
    assert {(m["expected"], m["pairing"]) for m in mismatched} == {("written", "mismatched")}
    # Under the model-score stage every mismatched pair that reaches it is its rejection, nothing else changes.
    assert {m["expected_with_model_score"] for m in mismatched} == {"model_score"}
    many = [m for m in manifest if m["case"] == "many_texts_one_image"]
    assert {(m["pairing"], m["expected_with_model_score"]) for m in many} == {
        ("mismatched", "model_score"), (None, "texts_per_image/too_many_texts")}
    changed = [m for m in manifest if m["expected_with_model_score"] != m["expected"]]
    assert all(m["pairing"] == "mismatched" and m["expected_with_model_score"] == "model_score" for m in changed)
    assert {m["pairing"] for m in manifest if m["expected_with_model_score"] == m["expected"]} == {"clean", None}
    assert info["expected_with_model_score"] == {"model_score": len(changed)} and len(changed) > len(mismatched)
    assert info["seed"] == SEED and info["num_candidates"] == NUM_CANDIDATES
    name, path = info["eval_images"].split("=", 1)
    assert name == evalset.EVAL_SET and os.path.isdir(os.path.join(out, path))
    assert info["zeroshot_classes"] == list(scenes.SHAPES)
    preset = get_preset("align", info["build_overrides"])  # every override is a valid --set
    assert preset.min_ngram_count == plan_lib.MIN_NGRAM_COUNT and preset.vocab_size == 0
    with open(os.path.join(out, "sample_info.json")) as f:
        assert json.load(f) == info


def test_thresholds_match_the_align_preset():
    preset = get_preset("align")
    assert plan_lib.MIN_SHORTER_SIDE == preset.min_shorter_side
    assert plan_lib.MAX_ASPECT == preset.max_aspect_ratio and not preset.max_aspect_ratio_inclusive
    assert plan_lib.MAX_PIXELS == preset.max_pixels
    assert plan_lib.MAX_TEXTS_PER_IMAGE == preset.max_texts_per_image
    assert plan_lib.MAX_IMAGES_PER_TEXT == preset.max_images_per_text


# ---------------------------------------------------------------------------
# The manifest agrees with the real per-record filters
# ---------------------------------------------------------------------------


def test_per_record_fates_match_the_filters(generated, manifest):
    """Read + per-record stages of the pipeline, on the real files, give the manifest's fates."""
    from filters.record import judge_record
    from pipeline.readers.parquet import read_file as read_parquet_file, Rejection

    out, _ = generated
    preset = get_preset("align")
    by_key = {m["key"]: m for m in manifest}
    per_record = set(stages.STAGE_NAMES[: stages.STAGE_INDEX["image_decode"] + 1])
    checked = collections.Counter()
    for path in sorted(glob.glob(os.path.join(out, "candidates", "*.parquet"))):
        parquet = pq.ParquetFile(path)
        keys = parquet.read(columns=["key"]).column("key").to_pylist()
        items = list(read_parquet_file(path))
        assert len(items) == len(keys)
        for key, item in zip(keys, items):
            line = by_key[key]
            assert item.key == line["pipeline_key"]
            if isinstance(item, Rejection):
                got = item.reason
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                    got = judge_record(item, preset).reason
            expected = line["expected"]
            if expected not in ("written", "written_once") and stages.stage_of(expected) in per_record:
                assert got == expected, line
            else:
                assert got is None, line
            checked[got] += 1
    assert sum(checked.values()) == len(manifest)


# ---------------------------------------------------------------------------
# Planted files are what they claim
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case,fmt,mode", [
    ("png_rgb", "PNG", "RGB"), ("png_rgba", "PNG", "RGBA"), ("png_palette", "PNG", "P"),
    ("png_16bit", "PNG", "I;16"), ("gif", "GIF", "P"), ("gif_animated", "GIF", "P"), ("webp", "WEBP", "RGB"),
    ("webp_animated", "WEBP", None), ("bmp", "BMP", "RGB"), ("tiff", "TIFF", "RGB"), ("mpo", "MPO", "RGB"),
    ("jpeg_cmyk", "JPEG", "CMYK"), ("jpeg_grey", "JPEG", "L"), ("jpeg_progressive", "JPEG", "RGB"),
    ("format_ppm", "PPM", "RGB"), ("format_tga", "TGA", "RGB"), ("format_pcx", "PCX", None),
    ("format_jpeg2000", "JPEG2000", "RGB"), ("format_ico", "ICO", None), ("favicon_16px", "ICO", None),
])
def test_formats(rows, case, fmt, mode):
    for row, line in _case(rows, case):
        with _open(row["jpg"]) as img:
            assert img.format == fmt
            if mode:
                assert img.mode == mode
            if case.endswith("_animated") or case == "mpo":
                assert getattr(img, "n_frames", 1) > 1
            if case == "jpeg_progressive":
                assert img.info.get("progressive") or img.info.get("progression")
            img.load()
            assert list(img.size) == line["size"]


def test_not_images_do_not_open(rows):
    for case in ("garbage_bytes", "garbage_bytes_empty_caption", "html_error_page", "html_captcha_page",
                 "pdf_document", "svg_image", "jpeg_first_20_bytes"):
        for row, _ in _case(rows, case):
            assert row["jpg"]
            with pytest.raises(Exception):
                Image.open(io.BytesIO(row["jpg"]))


def test_truncated_files_open_but_do_not_decode(rows):
    assert not getattr(__import__("PIL.ImageFile").ImageFile, "LOAD_TRUNCATED_IMAGES")
    for case in ("truncated_jpeg", "truncated_png", "truncated_jpeg_one_word"):
        for row, line in _case(rows, case):
            img = _open(row["jpg"])
            assert list(img.size) == line["size"]  # the header is intact
            with pytest.raises(OSError):
                img.load()


def test_decompression_bombs_declare_more_than_max_pixels(rows):
    for case, declared in (("decompression_bomb", (20000, 20000)), ("decompression_bomb_near_limit", (9460, 9460))):
        (row, line), = _case(rows, case)
        data = row["jpg"]
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert (width, height) == declared and width * height > plan_lib.MAX_PIXELS
        assert len(data) < 100_000  # small file, enormous decode
        assert line["size"] == [width, height]


def test_bomb_png_is_a_valid_png():
    data = faults.bomb_png(300, 250)
    with _open(data) as img:
        img.load()
        assert img.size == (300, 250) and img.mode == "1"


def test_exif_orientation(rows):
    seen = set()
    for case in [c for c in {m["case"] for _, m in rows.values()} if c.startswith("exif_orientation_")]:
        orientation = int(case.rsplit("_", 1)[1])
        for row, line in _case(rows, case):
            img = _open(row["jpg"])
            assert img.getexif().get(0x0112) == orientation
            raw = list(img.size)
            upright = ImageOps.exif_transpose(img)
            assert list(upright.size) == line["size"]
            if orientation in (5, 6, 7, 8):
                assert raw == line["size"][::-1]
            seen.add(orientation)
    assert {2, 3, 5, 6, 8} <= seen


def test_exif_pixels_are_the_upright_picture():
    """Stored pixels + orientation tag display the rendered picture."""
    rng = np.random.default_rng(0)
    spec = drawers.draw_content(rng, size=(320, 240), photo_share=0)
    upright = content.render(spec).convert("RGB")
    for orientation in (2, 3, 5, 6, 8):
        data = render.render_bytes(plan_lib.Recipe(content=spec, size=(320, 240), encode=("jpeg_exif", orientation)))
        shown = ImageOps.exif_transpose(_open(data)).convert("RGB")
        assert shown.size == upright.size
        assert np.abs(np.asarray(shown, np.int16) - np.asarray(upright, np.int16)).mean() < 4


def test_threshold_sizes(rows):
    for shorter in (199, 200, 201):
        found = _case(rows, f"shorter_side_{shorter}")
        assert sorted(tuple(line["size"]) for _, line in found) == sorted([(320, shorter), (shorter, 320)])
        for row, line in found:
            assert list(_open(row["jpg"]).size) == line["size"]
    for label, longer in (("2.99", 897), ("3.00", 900), ("3.01", 903)):
        found = _case(rows, f"aspect_{label}")
        assert sorted(tuple(line["size"]) for _, line in found) == sorted([(longer, 300), (300, longer)])


def test_read_cases(rows):
    for row, _ in _case(rows, "failed_download"):
        assert row["status"] == "failed_to_download" and row["jpg"] is None and row["caption"]
    for row, _ in _case(rows, "null_image"):
        assert row["status"] == "success" and row["jpg"] is None
    for row, _ in _case(rows, "empty_image"):
        assert row["jpg"] == b""
    for row, _ in _case(rows, "null_caption"):
        assert row["caption"] is None and row["jpg"]
    for row, _ in _case(rows, "wrong_reported_size"):
        assert (row["width"], row["height"]) == (100, 100) and _open(row["jpg"]).size != (100, 100)


def test_caption_cases(rows):
    for row, _ in _case(rows, "too_long_1001_chars"):
        assert len(normalize_text(row["caption"])) == 1001
    for row, _ in _case(rows, "exactly_1000_chars"):
        assert len(normalize_text(row["caption"])) == 1000 and plan_lib.word_count(row["caption"]) > 20
    for case, words in (("exactly_three_words", 3), ("exactly_twenty_words", 20), ("twenty_one_words", 21),
                        ("two_words", 2), ("one_word", 1), ("one_word_filename", 1)):
        for row, _ in _case(rows, case):
            assert plan_lib.word_count(row["caption"]) == words
    for case in ("empty_caption", "whitespace_caption", "invisible_caption", "control_caption"):
        for row, _ in _case(rows, case):
            assert row["caption"] is not None and normalize_text(row["caption"]) == ""
    for row, _ in _case(rows, "replacement_char"):
        assert "\ufffd" in row["caption"]
    for row, _ in _case(rows, "zero_width_inside"):
        assert "\u200b" in row["caption"] and "\u200b" not in normalize_text(row["caption"])
    for row, _ in _case(rows, "mojibake"):
        assert "\u00c3\u00a9" in row["caption"]
    nfc = [r["caption"] for r, _ in _case(rows, "unicode_nfc")]
    nfd = [r["caption"] for r, _ in _case(rows, "unicode_nfd")]
    assert set(nfc).isdisjoint(nfd)
    assert {normalize_text(c) for c in nfc} == {normalize_text(c) for c in nfd}


# ---------------------------------------------------------------------------
# Whole-corpus cases: counts, identities, vocabulary
# ---------------------------------------------------------------------------


def _phash(data: bytes) -> str:
    from filters.image import perceptual_hash, to_rgb

    with _open(data) as img:
        return perceptual_hash(to_rgb(ImageOps.exif_transpose(img)))


def test_one_image_with_more_than_1000_texts(rows):
    found = _case(rows, "many_texts_one_image")
    assert len({r["jpg"] for r, _ in found}) == 1 and len({r["url"] for r, _ in found}) == 1
    assert len({text_identity(r["caption"]) for r, _ in found}) > plan_lib.MAX_TEXTS_PER_IMAGE
    # No other image that reaches the stage has its perceptual hash (image identity).
    target = _phash(found[0][0]["jpg"])
    others = [r for r, m in rows.values() if m["case"] != "many_texts_one_image" and m["size"]
              and (m["expected"] in ("written", "written_once") or stages.STAGE_INDEX[stages.stage_of(m["expected"])]
                   >= stages.STAGE_INDEX["texts_per_image"])]
    assert others and all(_phash(r["jpg"]) != target for r in others)


@pytest.mark.parametrize("case,more_than_ten", [
    ("boilerplate", True), ("shared_text_11_images", True), ("shared_text_10_images", False),
])
def test_shared_alt_texts_count_distinct_images(rows, case, more_than_ten):
    by_text = collections.defaultdict(set)
    for row, _ in _case(rows, case):
        by_text[text_identity(row["caption"])].add(_phash(row["jpg"]))
    for text, hashes in by_text.items():
        assert (len(hashes) > plan_lib.MAX_IMAGES_PER_TEXT) == more_than_ten, text
    if not more_than_ten:
        assert {len(h) for h in by_text.values()} == {plan_lib.MAX_IMAGES_PER_TEXT}


def test_ordinary_alt_texts_are_rarely_shared(rows):
    images = collections.defaultdict(set)
    for row, line in rows.values():
        if line["case"] == "ordinary":
            images[plan_lib.wording_key(row["caption"])].add(row["jpg"])
    assert max(len(v) for v in images.values()) <= plan_lib.MAX_IMAGES_PER_ORDINARY_TEXT


def test_vocabulary_keeps_written_alt_texts_and_drops_junk(generated, rows):
    """The build's rule (filters.ngram_vocab): occurrences over every read caption, cut by the overrides."""
    from filters.ngram_vocab import vocabulary_cut

    _, info = generated
    preset = get_preset("align", info["build_overrides"])
    counts = collections.Counter()
    for row, _ in rows.values():
        if row.get("caption") is not None:
            counts.update(ngrams(normalize_text(row["caption"])))
    count_of_counts = collections.Counter(counts.values())
    cut = vocabulary_cut(count_of_counts, preset.vocab_size, preset.min_ngram_count)
    assert cut == plan_lib.MIN_NGRAM_COUNT
    for row, line in rows.values():
        if line["expected"] == "rare_ngrams/rare_ngram":
            assert any(counts[g] < cut for g in ngrams(normalize_text(row["caption"]))), row["caption"]
        elif line["expected"] in ("written", "written_once", "near_duplicate_eval/sample_eval"):
            assert all(counts[g] >= cut for g in ngrams(normalize_text(row["caption"]))), row["caption"]


def test_duplicate_pairs(rows):
    groups = collections.defaultdict(list)
    for row, line in rows.values():
        if line["expected"] == "written_once":
            groups[line["pipeline_key"]].append(row)
    assert sorted(len(g) for g in groups.values()) == [2, 3]
    for group in groups.values():
        assert len({(r["url"], r["caption"], r["jpg"]) for r in group}) == 1
    keys = collections.Counter(m["pipeline_key"] for _, m in rows.values())
    assert {k for k, n in keys.items() if n > 1} == set(groups)


def test_plan_rejects_a_broken_expectation(other_plan):
    row = next(r for r in other_plan.rows if r.case == "shared_text_10_images")
    row.expected = stages.reason("images_per_text", "shared_text")  # 10 images is not more than 10
    try:
        with pytest.raises(checks.PlanError, match="images_per_text"):
            checks.verify_plan(other_plan)
    finally:
        row.expected = plan_lib.WRITTEN
    checks.verify_plan(other_plan)


# ---------------------------------------------------------------------------
# Evaluation images and near-duplicates
# ---------------------------------------------------------------------------


def test_eval_set_layout(generated):
    out, info = generated
    for split, per_class in evalset.EVAL_PER_CLASS.items():
        assert sorted(os.listdir(os.path.join(out, "eval", split))) == sorted(info["zeroshot_classes"])
        for label in info["zeroshot_classes"]:
            files = sorted(os.listdir(os.path.join(out, "eval", split, label)))
            assert len(files) == per_class
            with Image.open(os.path.join(out, "eval", split, label, files[0])) as img:
                assert img.format == "PNG" and min(img.size) > plan_lib.MIN_SHORTER_SIDE


def test_near_duplicates_of_eval_images(generated, rows):
    """With the build's embedder and index: planted copies match their eval image, written pictures do not."""
    from dedup import embedders
    from dedup.index_sets import load_index_sets

    out, info = generated
    embedder = embedders.get(plan_lib.NEAR_DUPLICATE_EMBEDDER)
    name, path = info["eval_images"].split("=", 1)
    index = load_index_sets([(name, os.path.join(out, path))], embedder)  # as the build does
    assert index.num_images == len(scenes.SHAPES) * evalset.EVAL_PER_CLASS["test"]
    copies = [(r, m) for r, m in rows.values() if m["expected"] == f"near_duplicate_eval/{name}"]
    assert 10 <= len(copies) <= 20
    assert sum("mirror" in m["note"] for _, m in copies) == 1
    sims = embedder.embed([r["jpg"] for r, _ in copies]) @ index.vectors.T
    for (row, line), sim in zip(copies, sims):
        source = line["note"].split()[2].rstrip(",")  # "copy of eval/test/<class>/<file>, edit ..."
        assert sim[index.keys == os.path.relpath(source, path)].max() >= embedder.threshold, line
    written = [r["jpg"] for r, m in rows.values() if m["expected"] in ("written", "written_once")]
    assert (embedder.embed(written) @ index.vectors.T).max() < embedder.threshold
