"""The NSFW gallery: the highest scores per side, each image once, the same choice however the rows are split."""

import json
import math
import random

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline

from pipeline.stages.light_rows import LightRow
from pipeline.write import nsfw_gallery
from pipeline.write.nsfw_gallery import KEPT, REJECTED, HighestScoresFn, gallery_side


def row(key, score, sha="", reason=""):
    return LightRow(key=key, url=f"https://e.x/{key}", text=f"text {key}", reason=reason, counted=True,
                    sha256=sha or f"sha-{key}", phash="", width=10, height=10, format="JPEG", source="",
                    reader="", ordinal=0, nsfw_score=score)


def test_only_scored_rows_kept_or_rejected_by_the_stage_have_a_side():
    assert list(gallery_side(row("a", 0.3))) == [(KEPT, row("a", 0.3))]
    assert list(gallery_side(row("b", 0.9, reason="nsfw/pornographic")))[0][0] == REJECTED
    assert list(gallery_side(row("c", -math.inf))) == []  # never scored
    assert list(gallery_side(row("d", 0.2, reason="rare_ngrams/rare"))) == []  # a later stage's rejection


def combine(fn, parts):
    accumulators = []
    for part in parts:
        acc = fn.create_accumulator()
        for r in part:
            acc = fn.add_input(acc, r)
        accumulators.append(acc)
    return fn.extract_output(fn.merge_accumulators(accumulators))


def test_highest_scores_one_row_per_image_in_any_split():
    rng = random.Random(0)
    rows = [row(f"k{i:03d}", round(rng.random(), 2), sha=f"img{i % 40}") for i in range(300)]
    best = {}  # the answer by brute force: each image's highest score, its smallest key among those
    for r in rows:
        if r.sha256 not in best or (-r.nsfw_score, r.key) < (-best[r.sha256].nsfw_score, best[r.sha256].key):
            best[r.sha256] = r
    expected = sorted(best.values(), key=lambda r: (-r.nsfw_score, r.key))[:5]
    fn = HighestScoresFn(5)
    for _ in range(5):
        rng.shuffle(rows)
        cuts = sorted(rng.sample(range(1, len(rows)), 3))
        parts = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)])]
        assert combine(fn, parts) == expected
    assert combine(fn, [[]]) == []


def test_the_transform_writes_both_sides_highest_first(tmp_path):
    kept = [row(f"k{i}", s) for i, s in enumerate([0.1, 0.45, 0.3, 0.2])]
    rejected = [row(f"r{i}", s, reason="nsfw/pornographic") for i, s in enumerate([0.7, 0.99])]
    rejected.append(row("x", -math.inf, reason="image_size/too_small"))
    with TestPipeline() as p:
        _ = ((p | "Kept" >> beam.Create(kept), p | "Rejected" >> beam.Create(rejected))
             | nsfw_gallery.WriteNsfwGallery(str(tmp_path), size=3))
    lines = [json.loads(line) for line in (tmp_path / "stats" / nsfw_gallery.NSFW_GALLERY_FILE).read_text().splitlines()]
    assert [(g["side"], g["key"], g["nsfw_score"]) for g in lines] == [
        ("kept", "k1", 0.45), ("kept", "k2", 0.3), ("kept", "k3", 0.2),
        ("rejected", "r1", 0.99), ("rejected", "r0", 0.7)]
    assert all(g["thumbnail"] is None for g in lines)  # no source file to read the images again from
