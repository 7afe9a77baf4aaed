"""Threshold calibration: the data it builds, its metrics, and the acceptance bar
for the default "dct" embedder on real photographs."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from dedup import calibrate, calibration_images, edits, embedders
from dedup.index_sets import DEFAULT_VARIANTS

# Seeds 0, 1, 2 calibrated the shipped threshold; the acceptance test uses others.
HELD_OUT_SEED = 11


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_disjoint_boxes_tile_without_overlap(seed):
    rng = np.random.default_rng(seed)
    boxes = calibration_images.disjoint_boxes(640, 427, rng, min_side=64, max_side=256)
    assert len(boxes) > 4
    covered = np.zeros((427, 640), np.int32)
    for left, top, right, bottom in boxes:
        w, h = right - left, bottom - top
        assert 64 <= min(w, h) and max(w, h) <= 256 and max(w, h) <= 2 * min(w, h)
        covered[top:bottom, left:right] += 1
    assert covered.max() == 1  # disjoint crops share no pixel: unrelated images


def test_crops_are_real_distinct_and_deterministic():
    crops = calibration_images.make_crops(seed=5)
    again = calibration_images.make_crops(seed=5)
    assert [c.key for c in crops] == [c.key for c in again]
    assert len({c.key for c in crops}) == len(crops) > 200
    assert len({c.photo for c in crops}) >= 15
    assert all(calibration_images.luma_contrast(c.pixels) >= 10 for c in crops)


def test_every_edit_yields_a_decodable_jpeg_deterministically():
    image = Image.fromarray(calibration_images.make_crops(seed=0)[0].pixels)
    for edit in edits.EDITS:
        first = edits.apply(edit, image, np.random.default_rng(3))
        assert first == edits.apply(edit, image, np.random.default_rng(3)), edit.name
        decoded = Image.open(io.BytesIO(first))
        assert decoded.format == "JPEG" and min(decoded.size) >= 16, edit.name


def test_edit_family_selection():
    photometric = edits.select(["photometric"])
    assert photometric and all(e.photometric for e in photometric)
    assert {e.family for e in edits.select(["flip", "crop"])} == {"flip", "crop"}
    assert len(edits.select([])) == len(edits.EDITS)
    with pytest.raises(ValueError, match="unknown edit family"):
        edits.select(["sepia"])


# ---------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------


def test_recommended_threshold_is_the_lowest_grid_value_within_budget():
    negatives = np.random.default_rng(0).normal(0.2, 0.15, 200_000).astype(np.float32)
    for budget in (1e-3, 1e-4):
        t = calibrate.recommend_threshold(negatives, budget)
        assert (negatives > t).mean() <= budget
        assert (negatives > t - 1e-3).mean() > budget


def test_pooled_runs_only_pair_queries_with_their_own_sources():
    def run(offset):
        pairs = np.array([[0.9, 0.1], [0.2, 0.95], [0.3, 0.4]], np.float32) + offset
        return calibrate.Scores(pairs, np.array([0, 1, -1]), ["jpeg/q75", "flip/horizontal", ""], ["a"] * 3, ["a", "b"])

    pooled = calibrate.pool([run(0.0), run(0.01)])
    assert pooled.pairs.shape == (6, 4)
    np.testing.assert_allclose(np.sort(pooled.positives()), [0.9, 0.91, 0.95, 0.96])
    assert len(pooled.negatives) == 2 * 4  # 2 x (3 x 2 - 2 related); cross-run pairs are not pairs
    summary = calibrate.at_threshold(pooled, 0.5)
    assert summary["recall"] == 1.0 and summary["fpr"] == 0.0 and summary["distractor_drop_rate"] == 0.0
    assert summary["fpr_same_photograph"] == 0.0
    at_092 = calibrate.at_threshold(pooled, 0.92)
    assert (at_092["recall_photometric"], at_092["recall_geometric"]) == (0.0, 1.0)


# ---------------------------------------------------------------------------
# Acceptance: the shipped "dct" threshold on real photographs it was not calibrated on
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def held_out_scores():
    dct = embedders.get("dct")
    (scores,), description = calibrate.compute_scores(
        dct, num_sources=40, families=["photometric"], seed=HELD_OUT_SEED, index_configs=[DEFAULT_VARIANTS]
    )
    return dct, scores, description


def test_dct_threshold_meets_the_photometric_recall_and_fpr_bar(held_out_scores):
    dct, scores, description = held_out_scores
    assert description["sources"] == 40 and description["distractors"] > 100
    result = calibrate.at_threshold(scores, dct.threshold)
    assert result["recall_photometric"] >= 0.95, result
    assert result["fpr"] <= 0.001, result
    families, _ = calibrate.per_edit_recall(scores, dct.threshold)
    assert set(families) == set(edits.PHOTOMETRIC_FAMILIES)
    assert min(families.values()) >= 0.9, families


def test_flipped_copies_are_caught_only_through_index_variants():
    dct = embedders.get("dct")
    (with_variants, original_only), _ = calibrate.compute_scores(
        dct, num_sources=20, num_distractors=20, families=["flip"], seed=HELD_OUT_SEED
    )
    assert calibrate.at_threshold(with_variants, dct.threshold)["recall"] >= 0.95
    assert calibrate.at_threshold(original_only, dct.threshold)["recall"] <= 0.2


def test_command_line_writes_a_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = calibrate.main(
        ["--num_sources", "12", "--num_distractors", "10", "--families", "jpeg,flip", "--seeds", "4", "--out", str(out)]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["embedder"]["name"] == "dct"
    assert 0 < report["recommended_threshold"] < 1
    assert set(report["index_with_variants"]["recall_per_family"]) == {"jpeg", "flip"}
    assert report["data"]["sources"] == 12 and report["data"]["queries"] == 12 * 4 + 10
    printed = capsys.readouterr().out
    assert "recommended threshold" in printed and "flip/horizontal" in printed
    # The file is what a checkpoint/onnx embedder reads its threshold from.
    assert embedders.read_calibrated_threshold(str(out), "dct") == report["recommended_threshold"]


def test_average_precision_matches_scikit_learn():
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(1)
    positives = np.round(rng.normal(0.8, 0.1, 300), 2)  # rounded: ties, as cosines have
    negatives = np.round(rng.normal(0.3, 0.2, 5000), 2)
    labels = np.r_[np.ones(300), np.zeros(5000)]
    expected = average_precision_score(labels, np.r_[positives, negatives])
    assert calibrate.average_precision(positives, negatives) == pytest.approx(expected, abs=1e-9)
