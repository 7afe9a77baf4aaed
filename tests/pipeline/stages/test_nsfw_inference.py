"""The NSFW step's model handler without Beam: the fused path's scores, one score per distinct image, --reuse.

``NsfwModelHandler`` is called as RunInference calls it (``load_model`` then
``run_inference`` on batches); its open_nsfw scores from the prepared JPEG
must be the fused stage's (``filters.nsfw.NsfwScoring``) bit for bit.
"""

import numpy as np
import pytest

from filters import nsfw, open_nsfw
from filters.presets import get_preset
from pipeline.stages import nsfw_inference
from tests import images as made
from tests.filters.test_nsfw import WidthScorer, _png, absent_scorer_factory

FP32 = get_preset("align", ["nsfw_precision=fp32", "nsfw_threshold=0.5"])


class Counting(WidthScorer):
    """The width scorer, counting its model calls and the images in each."""

    calls = []

    def score(self, images):
        Counting.calls.append(len(images))
        return super().score(images)


def counting_factory():
    return Counting(), "counting"


def inputs(preset, images, factory=None, known=None):
    return [(nsfw.hashlib.sha256(data).digest(), nsfw_inference.model_input(data, preset, factory),
             (known or {}).get(i)) for i, data in enumerate(images)]


def test_open_nsfw_scores_from_the_prepared_jpeg_are_the_fused_stages(tmp_path):
    photos = [made.noise(seed, (300 + 40 * seed, 260), cells=(12, 10), quality=90) for seed in range(3)]
    handler = nsfw_inference.NsfwModelHandler(FP32)
    model = handler.load_model()
    batch = inputs(FP32, photos + [b"not an image"])
    assert all(len(jpeg) < 20_000 for _, jpeg, _ in batch[:3]) and batch[3][1] is None
    results = handler.run_inference(batch, model)
    fused = nsfw.NsfwScoring.from_preset(FP32)
    fused.load()
    _, expected = fused.judge_with_scores(photos + [b"not an image"])
    assert [r.inference for r in results] == [(True, score) for score in expected]
    assert expected[3] is None and all(isinstance(score, float) for score in expected[:3])
    assert {r.model_id for r in results} == {fused.label()} and "fp32" in fused.label()
    assert [r.example for r in results] == [digest for digest, _, _ in batch]


def test_a_distinct_image_is_scored_once_per_process_and_alone_in_its_model_call():
    Counting.calls = []
    handler = nsfw_inference.NsfwModelHandler(FP32, counting_factory, max_batch_size=8)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 8}
    model = handler.load_model()
    wide, narrow = _png(180), _png(120)
    first = handler.run_inference(inputs(FP32, [wide, narrow, wide], counting_factory), model)
    again = handler.run_inference(inputs(FP32, [narrow, wide], counting_factory), model)
    assert Counting.calls == [1, 1]  # two distinct images, two model calls of one image each
    scores = [r.inference[1] for r in first + again]
    assert scores == pytest.approx([0.8, 0.2, 0.8, 0.2, 0.8])
    assert [nsfw_inference.verdict(FP32, *r.inference) for r in first] == ["nsfw/pornographic", None,
                                                                           "nsfw/pornographic"]


def test_a_known_score_is_taken_only_from_the_same_scorer():
    Counting.calls = []
    image = _png(180)
    batch = inputs(FP32, [image], counting_factory, known={0: 0.125})
    same = nsfw_inference.NsfwModelHandler(FP32, counting_factory, previous_scorers=["width"])
    assert [r.inference for r in same.run_inference(batch, same.load_model())] == [(True, 0.125)]
    assert Counting.calls == []
    other = nsfw_inference.NsfwModelHandler(FP32, counting_factory, previous_scorers=["another scorer"])
    assert [r.inference for r in other.run_inference(batch, other.load_model())] == [(True, pytest.approx(0.8))]
    assert Counting.calls == [1]


def test_without_a_scorer_records_pass_unscored_as_on_the_fused_path():
    handler = nsfw_inference.NsfwModelHandler(FP32, absent_scorer_factory)
    results = handler.run_inference(inputs(FP32, [_png(180)], absent_scorer_factory), handler.load_model())
    assert [(r.inference, r.model_id) for r in results] == [((False, None), "fake scorer not installed")]
    assert nsfw_inference.verdict(FP32, False, None) is None
    failing = get_preset("align", ["nsfw_unscored=fail"])
    with pytest.raises(nsfw.ScorerUnavailable):
        nsfw_inference.NsfwModelHandler(failing, absent_scorer_factory).load_model()


def test_the_step_runs_the_accelerators_precision_and_its_preparation():
    auto = get_preset("align")
    int8 = get_preset("align", ["nsfw_precision=int8"])
    assert nsfw_inference.precision(auto) == "fp32" and nsfw_inference.decode_side(auto) == 0
    assert nsfw_inference.decode_side(int8) == open_nsfw.INT8_DECODE_SIDE
    large = made.noise(1, (1200, 900), cells=(12, 9), quality=90)
    np.testing.assert_array_equal(open_nsfw.jpeg_input(nsfw_inference.model_input(large, int8)),
                                  open_nsfw.model_input(large, open_nsfw.INT8_DECODE_SIDE))


def test_accelerator_values():
    value = "type:nvidia-tesla-t4;count:1;install-nvidia-driver"
    assert nsfw_inference.parse_accelerator(value) == value
    assert nsfw_inference.parse_accelerator(" type:nvidia-l4 ") == "type:nvidia-l4"
    for bad in ("", "type:", "count:2", "type:t4;count:x", "type:t4;count:1;count:2", "type:t4;memory:16"):
        with pytest.raises(ValueError):
            nsfw_inference.parse_accelerator(bad)
