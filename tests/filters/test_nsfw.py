"""NSFW stage: score conversion, threshold rule, scorer loading, the stage on a batch.

No explicit image is in this repository or made by these tests: the stage is
tested with a fake scorer, and the real NudeNet path only on benign images
that scikit-image ships (a portrait, a cup of coffee, a cat, a rocket).
"""

import io
import sys

import numpy as np
import pytest
from PIL import Image

from filters import nsfw
from filters import nudenet as nudenet_scorer
from filters.presets import get_preset
from tests import images as made

#: The cut the preset's comment gives for nudenet's box confidences.
NUDENET_THRESHOLD = 0.8


def _has_nudenet():
    try:
        import nudenet  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


needs_nudenet = pytest.mark.skipif(not _has_nudenet(), reason="optional extra absent: pip install '.[nsfw]'")


def _png(width, height=64, color=(40, 90, 160), mode="RGB"):
    return made.solid((width, height), color, "PNG", mode)


def _benign_images():
    skdata = pytest.importorskip("skimage.data")
    return {name: Image.fromarray(getattr(skdata, name)()) for name in ("astronaut", "coffee", "chelsea", "rocket")}


# ---------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------


def _raw(class_scores_per_anchor):
    """[N][A][C] class confidences -> detector output [N, 4 + C, A]."""
    scores = np.asarray(class_scores_per_anchor, np.float32)
    n, a, _ = scores.shape
    boxes = np.ones((n, a, 4), np.float32)
    return np.concatenate([boxes, scores], axis=2).transpose(0, 2, 1)


def test_detections_to_scores_takes_max_over_boxes_labelled_with_counted_classes():
    # One image, three anchors; anchor 1's top class is the counted class 2.
    output = _raw([[[0.9, 0.0, 0.1], [0.1, 0.2, 0.7], [0.0, 0.0, 0.3]]])
    np.testing.assert_allclose(nudenet_scorer.detections_to_scores(output, [2]), [0.7])
    # Class 2 reaches 0.6 on anchor 0, but that anchor's top class is 0 (0.8):
    # as in NudeNet's post-processing, a box counts only for its top class.
    output = _raw([[[0.8, 0.0, 0.6], [0.01, 0.0, 0.05]]])
    np.testing.assert_allclose(nudenet_scorer.detections_to_scores(output, [2]), [0.05])
    np.testing.assert_allclose(nudenet_scorer.detections_to_scores(output, [0, 2]), [0.8])
    np.testing.assert_allclose(nudenet_scorer.detections_to_scores(output, [1]), [0.0])


def test_detections_to_scores_is_float32_in_unit_interval_and_checks_shape():
    output = _raw([[[1.5, 0.0]], [[0.2, 0.0]]])
    scores = nudenet_scorer.detections_to_scores(output, [0])
    assert scores.dtype == np.float32 and scores.shape == (2,)
    np.testing.assert_allclose(scores, [1.0, 0.2])
    with pytest.raises(ValueError):
        nudenet_scorer.detections_to_scores(np.zeros((2, 4, 10), np.float32), [0])


def test_threshold_rule_is_inclusive_and_one_disables():
    assert nsfw.is_pornographic(0.8, 0.8)
    assert not nsfw.is_pornographic(0.79, 0.8)
    assert nsfw.is_pornographic(0.0, 0.0)
    assert not nsfw.is_pornographic(1.0, 1.0)  # 1.0 means the stage is off
    assert not nsfw.stage_enabled(1.0) and nsfw.stage_enabled(0.99)


def test_pornographic_classes_are_nudenet_classes_and_exclude_faces_feet_and_covered():
    assert set(nudenet_scorer.PORNOGRAPHIC_CLASSES) <= set(nudenet_scorer.NUDENET_CLASSES)
    assert not any(("COVERED" in c) or c.startswith(("FACE", "FEET", "ARMPITS")) for c in nudenet_scorer.PORNOGRAPHIC_CLASSES)
    assert nsfw.REJECT_REASON == "nsfw/pornographic"


def test_decode_for_scoring_is_rgb_upright_and_reduced_but_not_below_model_size():
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: stored 2000x1000, displayed 1000x2000
    Image.new("RGB", (2000, 1000), (200, 10, 10)).save(buf, "JPEG", exif=exif)
    img = nsfw.decode_for_scoring(buf.getvalue(), size=320)
    assert img.mode == "RGB"
    # upright; JPEG-draft decoded at 1/2 scale (1/4 would be < 320), then fit in 640
    assert img.size == (320, 640)


def test_decode_for_scoring_converts_palette_transparency_to_rgb():
    buf = io.BytesIO()
    Image.new("P", (50, 40)).save(buf, "GIF", transparency=0)
    img = nsfw.decode_for_scoring(buf.getvalue())
    assert img.mode == "RGB" and img.size == (50, 40)


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def test_load_scorer_unknown_name_is_an_error():
    with pytest.raises(ValueError, match="unknown NSFW scorer"):
        nsfw.load_scorer("no-such-scorer")
    with pytest.raises(ValueError, match="unknown NSFW scorer"):
        nsfw.NsfwScoring(0.5, scorer_name="no-such-scorer")


def test_load_scorer_reports_missing_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "nudenet", None)  # import nudenet -> ImportError
    scorer, status = nsfw.load_scorer("nudenet")
    assert scorer is None
    assert status == nsfw.NUDENET_MISSING
    assert "pip install '.[nsfw]'" in status and "AGPL-3.0" in status


@needs_nudenet
def test_class_list_matches_installed_nudenet():
    import nudenet.nudenet as module

    assert tuple(getattr(module, "__labels")) == nudenet_scorer.NUDENET_CLASSES


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails: the model must come from the wheel."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@needs_nudenet
def test_nudenet_scores_benign_images_low_and_matches_nudenet_detect(no_network):
    from nudenet import NudeDetector

    images = _benign_images()
    scorer, status = nsfw.load_scorer("nudenet", batch_size=3)
    assert scorer is not None and status.startswith("nudenet ")
    scores = scorer.score(list(images.values()))
    assert scores.dtype == np.float32 and scores.shape == (len(images),)
    assert np.all(scores >= 0.0) and np.all(scores < NUDENET_THRESHOLD), dict(zip(images, scores))

    # Same number as NudeNet's own detect(): the best box among the counted
    # classes (RGBA input because NudeNet's reader converts RGBA -> BGR).
    detector = NudeDetector()
    for (name, img), score in zip(images.items(), scores):
        found = [d["score"] for d in detector.detect(np.asarray(img.convert("RGBA"))) if d["class"] in nudenet_scorer.PORNOGRAPHIC_CLASSES]
        # detect() drops boxes under 0.2, so below that only an upper bound holds.
        expected = max(found, default=0.0)
        if expected:
            assert score == pytest.approx(expected, abs=1e-4), name
        else:
            assert score < 0.2, name


@needs_nudenet
def test_nudenet_model_really_runs_face_class_fires_on_the_portrait():
    # The counted classes never fire on benign images, so a scorer returning
    # zeros would pass the test above; the face class proves the model runs.
    images = _benign_images()
    face = nudenet_scorer.NudenetScorer(classes=("FACE_FEMALE",))
    scores = dict(zip(images, face.score(list(images.values()))))
    assert scores["astronaut"] > 0.5
    assert scores["rocket"] < 0.2


# ---------------------------------------------------------------------------
# The DoFn (fake scorer)
# ---------------------------------------------------------------------------


class WidthScorer:
    """Fake scorer: score = (width - 100) / 100, so width 150 scores 0.5."""

    name = "width"

    def score(self, images):
        return np.asarray([(img.width - 100) / 100.0 for img in images], np.float32)


def width_scorer_factory():
    return WidthScorer(), "fake width scorer"


def absent_scorer_factory():
    return None, "fake scorer not installed"


def failing_factory():
    raise AssertionError("the scorer must not be loaded when the stage is disabled")


def scoring(threshold=0.5, factory=width_scorer_factory, unscored="pass"):
    stage = nsfw.NsfwScoring(threshold, scorer_factory=factory, unscored=unscored)
    stage.load()
    return stage


def test_scoring_splits_kept_and_rejected_at_the_threshold():
    widths = [110, 140, 150, 199, 120, 160, 101]
    stage = scoring()
    reasons = stage.judge([_png(w) for w in widths])
    assert reasons == [None, None, "nsfw/pornographic", "nsfw/pornographic", None, "nsfw/pornographic", None]
    assert stage.take_outcomes() == {(True, "width"): 7} and stage.outcomes == {}


def test_judge_with_scores_gives_each_scored_image_its_score_and_none_elsewhere():
    stage = scoring()
    reasons, scores = stage.judge_with_scores([_png(120), b"not an image", _png(160)])
    assert reasons == [None, "nsfw/undecodable", "nsfw/pornographic"]
    assert scores[0] == pytest.approx(0.2) and scores[1] is None and scores[2] == pytest.approx(0.6)
    assert all(isinstance(s, float) for s in (scores[0], scores[2]))
    assert scoring(factory=absent_scorer_factory).judge_with_scores([_png(150)]) == ([None], [None])
    assert scoring(1.0, failing_factory).judge_with_scores([_png(150)]) == ([None], [None])


class CountingScorer(WidthScorer):
    def __init__(self):
        self.scored = 0

    def score(self, images):
        self.scored += len(images)
        return super().score(images)


def test_an_image_repeated_on_many_rows_is_scored_once_but_counted_per_row(monkeypatch):
    counting = CountingScorer()
    stage = scoring(factory=lambda: (counting, "counting"))
    placeholder, other = _png(160), _png(120)
    assert stage.judge([placeholder] * 5 + [other]) == ["nsfw/pornographic"] * 5 + [None]
    assert stage.judge([placeholder, b"broken", b"broken"]) == ["nsfw/pornographic", "nsfw/undecodable",
                                                                "nsfw/undecodable"]
    assert counting.scored == 2  # the placeholder and the other image, once each
    assert stage.take_outcomes() == {(True, "width"): 7}
    monkeypatch.setattr(nsfw, "SCORE_CACHE_SIZE", 2)
    stage.judge([_png(130), _png(140)])  # the cache keeps the two most recent images
    assert len(stage._scores) == 2 and counting.scored == 4
    stage.judge([placeholder])
    assert counting.scored == 5  # forgotten, so scored again


def test_scoring_without_scorer_passes_everything_but_counts_it():
    stage = scoring(factory=absent_scorer_factory)
    assert stage.judge([_png(150 + i) for i in range(5)]) == [None] * 5
    assert stage.take_outcomes() == {(False, "fake scorer not installed"): 5}


def test_threshold_one_disables_without_loading_a_scorer():
    stage = scoring(1.0, failing_factory)
    assert not stage.enabled and stage.judge([_png(199)] * 3) == [None] * 3
    assert stage.take_outcomes() == {}


def test_undecodable_bytes_get_a_reason_not_a_crash():
    stage = scoring()
    assert stage.judge([_png(120), b"\xff\xd8\xff\xe0 not really a jpeg"]) == [None, "nsfw/undecodable"]


def test_a_scorer_returning_the_wrong_shape_is_an_error():
    class Broken:
        name = "broken"

        def score(self, images):
            return np.zeros(len(images) + 1, np.float32)

    with pytest.raises(ValueError, match="shape"):
        scoring(factory=lambda: (Broken(), "broken")).judge([_png(120)])


@needs_nudenet
def test_scoring_with_real_nudenet_keeps_benign_images():
    images = []
    for img in _benign_images().values():
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        images.append(buf.getvalue())
    stage = nsfw.NsfwScoring.from_preset(get_preset("align", ["nsfw_model=nudenet", f"nsfw_threshold={NUDENET_THRESHOLD}"]))
    stage.load()
    assert stage.scorer.name == "nudenet"
    assert stage.judge(images) == [None] * len(images)
    assert stage.take_outcomes() == {(True, "nudenet"): len(images)}


def test_without_scorer_the_worker_fails_when_the_preset_says_fail():
    with pytest.raises(nsfw.ScorerUnavailable, match="nsfw_unscored=fail"):
        scoring(factory=absent_scorer_factory, unscored="fail")
    assert get_preset("align").nsfw_unscored == "pass"
    assert get_preset("align", ["nsfw_unscored=fail"]).nsfw_unscored == "fail"


def test_stage_note_says_what_the_workers_did():
    assert nsfw.stage_note(0.8, "nudenet", {(True, "nudenet"): 7}) == "scored by nudenet, rejected if score >= 0.8"
    assert nsfw.stage_note(0.8, "nudenet", {(False, nsfw.NUDENET_MISSING): 1234}) == (
        f"1,234 records passed UNSCORED: {nsfw.NUDENET_MISSING}")
    assert nsfw.stage_note(0.8, "nudenet", {(True, "nudenet"): 5, (False, "gone"): 2}) == (
        "2 records passed UNSCORED (gone), 5 scored by nudenet, rejected if score >= 0.8")
