"""Pair scores (``filters.model_score``): the registry, decoding, batching and one model per process.

The model here is one a user could register: an image's mean colour against
the colour its alt-text names, both as vectors around mid-grey. This
project's own checkpoint model is tested against ``trainer.embed`` in
``tests/trainer/test_pair_score.py``.
"""

import collections
import io
import pickle
import threading
import time

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from filters import model_score
from tests import images as made

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 60, 220), "white": (255, 255, 255)}
LOADS = collections.Counter()  # factory calls per decode_size


def _unit(vectors):
    vectors = np.asarray(vectors, np.float32) - 127.5
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


class MeanColourModel:
    """Image tower: the picture's mean RGB; text tower: the RGB of the colour it names."""

    name = "mean_colour"

    def __init__(self, batch_size=4, decode_size=0):
        self.batch_size, self.decode_size = int(batch_size), int(decode_size)
        self.batches, self.sizes = [], []

    def describe(self):
        return f"mean colour, batches of {self.batch_size}"

    def score_images(self, images, texts):
        self.batches.append(len(images))
        self.sizes += [image.size for image in images]
        assert all(image.mode == "RGB" for image in images)
        means = _unit([np.asarray(image, np.float32).reshape(-1, 3).mean(0) for image in images])
        named = _unit([COLOURS[next(w for w in text.split() if w in COLOURS)] for text in texts])
        return np.einsum("nd,nd->n", means, named)


@model_score.register("mean_colour_test")
def mean_colour(batch_size=4, decode_size=0):
    LOADS[decode_size] += 1
    time.sleep(0.05)  # loading takes a while: threads arriving meanwhile must wait, not load again
    return MeanColourModel(batch_size, decode_size)


@pytest.fixture(autouse=True)
def fresh_process_table(monkeypatch):
    """Each test starts as a fresh worker process would: no model loaded yet."""
    monkeypatch.setattr(model_score, "_MODELS", {})
    LOADS.clear()


def _encoded(colour, size=(64, 48), fmt="JPEG", mode="RGB", orientation=None):
    image = Image.new(mode, size, colour)
    return made.with_orientation(image, orientation, fmt) if orientation else made.encode(image, fmt)


def test_a_registered_model_scores_each_pair_in_its_batches():
    names = ["red", "green", "blue", "red", "green", "blue", "red", "green", "blue", "red"]
    images = [_encoded(COLOURS[n], fmt="PNG") for n in names]
    said = list(names)
    said[:3] = ["green", "blue", "red"]  # the first three alt-texts name another picture's colour
    texts = [f"a {n} square" for n in said]
    scorer = model_score.PairScorer("mean_colour_test", batch_size=4)
    scores = scorer.score(images, texts)
    assert scores.dtype == np.float32 and scores.shape == (10,)
    want = np.einsum("nd,nd->n", _unit([COLOURS[n] for n in names]), _unit([COLOURS[n] for n in said]))
    np.testing.assert_allclose(scores, want, atol=1e-6)  # PNG: the exact colours
    assert scores[3:].min() > 0.99 and scores[:3].max() < 0.5  # the mismatched pairs stand out
    assert scorer.model.batches == [4, 4, 2]
    # The batch size changes how the model is called, never a score.
    np.testing.assert_allclose(model_score.PairScorer("mean_colour_test", batch_size=3).score(images, texts),
                               scores, atol=1e-6)


def test_an_image_that_does_not_decode_scores_nan_alone():
    images = [_encoded(COLOURS["red"]), b"<html>not an image</html>", _encoded(COLOURS["blue"])[:40],
              _encoded(COLOURS["blue"])]
    scores = model_score.PairScorer("mean_colour_test").score(images, ["red"] * 2 + ["blue"] * 2)
    assert np.isnan(scores[1]) and np.isnan(scores[2])
    assert scores[0] > 0.99 and scores[3] > 0.99
    assert model_score.PairScorer("mean_colour_test").score([], []).shape == (0,)
    with pytest.raises(ValueError, match="2 images but 1 texts"):
        model_score.PairScorer("mean_colour_test").score(images[:2], ["red"])


def test_the_model_sees_the_upright_picture_the_build_keeps():
    scorer = model_score.PairScorer("mean_colour_test", decode_size=100)
    rotated = _encoded(COLOURS["red"], size=(300, 200), orientation=6)     # stored 300x200, shown 200x300
    transparent = _encoded((30, 60, 220, 0), size=(120, 120), fmt="PNG", mode="RGBA")  # all transparent
    large = _encoded(COLOURS["green"], size=(1600, 1200))
    small = _encoded(COLOURS["green"], size=(150, 120))
    scores = scorer.score([rotated, transparent, large, small], ["red", "white", "green", "green"])
    assert scores.min() > 0.99  # transparency is white, as the build stores it
    # Upright; a JPEG decoded DCT-reduced (1/2, 1/8, none) but never below decode_size; a PNG at full size.
    assert scorer.model.sizes == [(100, 150), (120, 120), (200, 150), (150, 120)]


def test_one_model_per_process_whatever_the_copies_and_threads():
    scorer = model_score.PairScorer("mean_colour_test", batch_size=2)
    copies = [pickle.loads(pickle.dumps(scorer)) for _ in range(3)]  # as Beam ships a DoFn's state
    assert LOADS[0] == 0  # nothing loads until a score is asked for
    barrier = threading.Barrier(4)
    models = []

    def first_call(copy):
        barrier.wait()
        models.append(copy.model)

    threads = [threading.Thread(target=first_call, args=(c,)) for c in [scorer] + copies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert LOADS[0] == 1 and len({id(m) for m in models}) == 1
    # Other arguments are another model.
    assert model_score.PairScorer("mean_colour_test", batch_size=2, decode_size=50).model is not models[0]
    assert LOADS == {0: 1, 50: 1}


class ScorePairs(beam.DoFn):
    def __init__(self, scorer):
        self.scorer = scorer

    def process(self, batch):
        images, texts = zip(*batch)
        for text, score in zip(texts, self.scorer.score(images, texts)):
            yield text, round(float(score), 3)


def test_beam_steps_share_the_process_model():
    """Two steps of one pipeline (each its own DoFn instances) load the model once in this process."""
    red, blue = _encoded(COLOURS["red"]), _encoded(COLOURS["blue"])
    red_pixels = np.asarray(Image.open(io.BytesIO(red)), np.float32).reshape(-1, 3).mean(0)  # as JPEG stores it
    mismatch = round(float(_unit(red_pixels) @ _unit(COLOURS["blue"])), 3)
    expected = [("red", 1.0), ("blue", 1.0), ("blue", mismatch)]
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        pairs = pipeline | beam.Create([(red, "red"), (blue, "blue"), (red, "blue")])
        batches = pairs | beam.BatchElements(min_batch_size=2, max_batch_size=2)
        for step in ("First", "Second"):
            scorer = model_score.PairScorer("mean_colour_test", batch_size=2)  # one per step, as a build has
            scored = batches | step >> beam.ParDo(ScorePairs(scorer))
            assert_that(scored, equal_to(expected), label=f"{step}Scores")
    assert LOADS[0] == 1


def test_names_and_arguments_are_checked_in_one_line():
    assert {"checkpoint", "mean_colour_test"} <= set(model_score.names())
    with pytest.raises(ValueError, match=r"^unknown pair model 'clip'; known: .*checkpoint"):
        model_score.PairScorer("clip")
    assert model_score.parse_args(["workdir=out/train", "step=200", "center=true"]) == {
        "workdir": "out/train", "step": 200, "center": True}
    with pytest.raises(ValueError, match="--model_score_arg expects KEY=VALUE, got 'workdir'"):
        model_score.parse_args(["workdir"])
    with pytest.raises(ValueError, match="registered twice"):
        model_score.register("mean_colour_test")(lambda: None)
    with pytest.raises(ValueError) as error:
        model_score.PairScorer("checkpoint").check()
    assert str(error.value) == "the checkpoint pair model needs workdir=... (--model_score_arg workdir=DIR)"
