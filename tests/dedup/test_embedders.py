"""Embedder interface, the "dct" descriptor, the checkpoint adapter and the ONNX embedder."""

import json
import pickle

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from dedup import embedders
from dedup.calibration_images import real_photographs
from tests import images as made


@pytest.fixture(scope="module")
def photos():
    """Two unrelated real photographs, RGB uint8, resized to typical web size."""
    by_name = dict(real_photographs())
    return [np.asarray(Image.fromarray(by_name[n]).resize((400, 300))) for n in ("coffee", "rocket")]


def jpeg(pixels, quality=90, **save_args):
    return made.encode(pixels, quality=quality, **save_args)


def cosine(a, b):
    return float(np.dot(a, b))


# ---------------------------------------------------------------------------
# Interface and registry
# ---------------------------------------------------------------------------


def test_registry_builds_every_named_embedder_type():
    assert {"dct", "onnx", "checkpoint"} <= set(embedders.names())
    dct = embedders.get()
    assert dct.name == "dct" and isinstance(dct, embedders.Embedder)
    with pytest.raises(ValueError, match="unknown embedder"):
        embedders.get("nope")


def test_dct_has_a_calibrated_default_threshold_and_accepts_an_override():
    assert 0.0 < embedders.get("dct").threshold < 1.0
    assert embedders.get("dct", threshold=0.9).threshold == 0.9
    with pytest.raises(ValueError):
        embedders.get("dct", threshold=1.5)


# ---------------------------------------------------------------------------
# "dct"
# ---------------------------------------------------------------------------


def test_dct_rows_are_unit_float32_of_fixed_dim(photos):
    dct = embedders.get("dct")
    out = dct.embed([jpeg(p) for p in photos])
    assert out.shape == (2, dct.dim) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_dct_bad_bytes_give_zero_rows_without_disturbing_the_batch(photos):
    dct = embedders.get("dct", batch_size=2)
    good = [jpeg(p) for p in photos]
    truncated = good[0][: len(good[0]) // 3]
    out = dct.embed([good[0], b"not an image", truncated, good[1], b""])
    np.testing.assert_array_equal(embedders.valid_rows(out), [True, False, False, True, False])
    assert not out[[1, 2, 4]].any()
    np.testing.assert_allclose(out[[0, 3]], dct.embed(good), atol=1e-6)


def test_dct_flat_image_is_featureless():
    flat = np.full((120, 160, 3), 128, np.uint8)
    out = embedders.get("dct").embed([jpeg(flat)])
    assert not embedders.valid_rows(out)[0]


def test_dct_ignores_brightness_offset_and_contrast_gain(photos):
    # Dropping DC removes the offset, L2 the gain: exact up to rounding.
    dct = embedders.get("dct")
    base = photos[0].astype(np.float32) * 0.5 + 40  # room on both sides, no clipping
    variants = np.stack([base, base + 60, (base - 40) * 1.8 + 20]).round().astype(np.uint8)
    out = dct.embed_arrays(variants)
    assert cosine(out[0], out[1]) > 0.999
    assert cosine(out[0], out[2]) > 0.995


def test_dct_copies_above_threshold_unrelated_below(photos):
    dct = embedders.get("dct")
    original, other = photos
    small = np.asarray(Image.fromarray(original).resize((200, 150)))
    darker = np.asarray(ImageEnhance.Brightness(Image.fromarray(original)).enhance(0.8))
    out = dct.embed([jpeg(original, 95), jpeg(original, 40), jpeg(small), jpeg(darker), jpeg(other)])
    for copy in (1, 2, 3):
        assert cosine(out[0], out[copy]) > dct.threshold
    assert cosine(out[0], out[4]) < dct.threshold


def test_dct_bytes_and_array_paths_agree(photos):
    dct = embedders.get("dct")
    from_bytes = dct.embed([jpeg(photos[0], 98)])[0]
    from_array = dct.embed_arrays(photos[:1])[0]
    assert cosine(from_bytes, from_array) > 0.99


def test_dct_applies_exif_orientation(photos):
    upright = photos[0]
    # Stored rotated, with the EXIF tag (6: rotate 90 CW to display) that rights it.
    stored = np.asarray(Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90))
    exif = Image.Exif()
    exif[0x0112] = 6
    dct = embedders.get("dct")
    out = dct.embed([jpeg(upright), jpeg(stored, exif=exif.tobytes()), jpeg(stored)])
    assert cosine(out[0], out[1]) > 0.99
    assert cosine(out[0], out[2]) < dct.threshold


def test_dct_mirror_is_not_built_in(photos):
    # The index side adds flipped copies instead (tests/dedup/test_index_sets.py).
    dct = embedders.get("dct")
    out = dct.embed_arrays(np.stack([photos[0], photos[0][:, ::-1]]))
    assert cosine(out[0], out[1]) < dct.threshold


def test_dct_pickles_with_its_configuration(photos):
    dct = embedders.get("dct", block=8, weight_exponent=1.0, threshold=0.8)
    clone = pickle.loads(pickle.dumps(dct))
    assert (clone.dim, clone.threshold) == (63, 0.8)
    data = [jpeg(p) for p in photos]
    np.testing.assert_array_equal(clone.embed(data), dct.embed(data))


# ---------------------------------------------------------------------------
# "checkpoint": adapter around trainer.checkpoint.load_image_encoder
# ---------------------------------------------------------------------------


class FakeImageTower:
    """Stands in for a restored image tower: records its inputs, returns raw features."""

    def __init__(self, size=16):
        self.size = size
        self.calls = []

    def __call__(self, images):
        self.calls.append(np.array(images))
        # Per-channel means and a few pixels: deterministic, not normalised.
        return np.concatenate([images.mean(axis=(1, 2)), images[:, ::4, ::4, 0].reshape(len(images), -1)], axis=1) + 2


def test_checkpoint_adapter_feeds_the_tower_its_input_format(photos):
    tower = FakeImageTower(size=16)
    embedder = embedders.get("checkpoint", encoder=(tower, 16), batch_size=2, threshold=0.9)
    data = [jpeg(photos[0]), b"junk", jpeg(photos[1]), jpeg(photos[0], 60)]
    out = embedder.embed(data)
    assert out.shape == (4, embedder.dim) and embedder.dim == 3 + 16
    np.testing.assert_array_equal(embedders.valid_rows(out), [True, False, True, True])
    np.testing.assert_allclose(np.linalg.norm(out[[0, 2, 3]], axis=1), 1.0, atol=1e-5)
    batches = [c for c in tower.calls if c.shape[0] and c.any()]
    assert all(c.shape[1:] == (16, 16, 3) and c.dtype == np.float32 for c in batches)
    assert all(len(c) <= 2 for c in batches)
    pixels = np.concatenate(batches)
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0 and pixels.min() < -0.5 < 0.5 < pixels.max()


def test_checkpoint_adapter_needs_a_threshold_or_a_calibration_file(tmp_path):
    tower = FakeImageTower()
    uncalibrated = embedders.get("checkpoint", workdir=str(tmp_path), encoder=(tower, 16))
    with pytest.raises(embedders.UncalibratedEmbedderError, match="dedup.calibrate"):
        uncalibrated.threshold
    report = {"embedder": {"name": "checkpoint"}, "recommended_threshold": 0.93}
    (tmp_path / "near_duplicate_calibration.json").write_text(json.dumps(report))
    calibrated = embedders.get("checkpoint", workdir=str(tmp_path), encoder=(tower, 16))
    assert calibrated.threshold == 0.93
    (tmp_path / "near_duplicate_calibration.json").write_text(json.dumps(dict(report, embedder={"name": "dct"})))
    with pytest.raises(ValueError, match="calibrates embedder"):
        embedders.get("checkpoint", workdir=str(tmp_path), encoder=(tower, 16))
    for damaged, what in (("{\"embedder\": {\"name\": \"checkpoint\"}, \"recomm", "not valid JSON"),
                          (json.dumps(dict(report, recommended_threshold="high")), "recommended_threshold: \"high\"")):
        (tmp_path / "near_duplicate_calibration.json").write_text(damaged)
        with pytest.raises(ValueError) as error:  # one line naming the file, not a traceback
            embedders.get("checkpoint", workdir=str(tmp_path), encoder=(tower, 16))
        assert str(error.value).startswith(str(tmp_path / "near_duplicate_calibration.json")) and what in str(error.value)


def test_checkpoint_adapter_loads_the_trainer_lazily(tmp_path):
    # Building it must not import the trainer (Beam pickles it first).
    embedder = embedders.get("checkpoint", workdir=str(tmp_path), threshold=0.9)
    clone = pickle.loads(pickle.dumps(embedder))
    assert clone.workdir == str(tmp_path) and clone._encoder is None


# ---------------------------------------------------------------------------
# "onnx"
# ---------------------------------------------------------------------------


def _flatten_model(path, size=8):
    """A tiny ONNX graph, NCHW in, flattened pixels out: the reference is numpy."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Flatten", ["pixels"], ["features"], axis=1)],
        "flatten",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 3 * size * size])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_onnx_embedder_matches_numpy_reference(tmp_path, photos):
    pytest.importorskip("onnxruntime")
    path = tmp_path / "tower.onnx"
    _flatten_model(path)
    embedder = embedders.get("onnx", model_path=str(path), threshold=0.95)
    assert (embedder.layout, embedder.image_size, embedder.dim) == ("NCHW", 8, 192)
    # Already at the model's size, so preprocessing is only scaling and layout.
    pixels = np.asarray(Image.fromarray(photos[0]).resize((8, 8)))
    out = embedder.embed_arrays(pixels[None])
    reference = ((pixels / 255.0 - 0.5) / 0.5).transpose(2, 0, 1).reshape(-1)
    np.testing.assert_allclose(out[0], reference / np.linalg.norm(reference), atol=1e-5)
    from_bytes = embedder.embed([jpeg(photos[0]), b"junk"])
    assert cosine(from_bytes[0], out[0]) > 0.9
    assert not embedders.valid_rows(from_bytes)[1]


def test_onnx_embedder_reads_its_calibration_file(tmp_path):
    pytest.importorskip("onnxruntime")
    path = tmp_path / "tower.onnx"
    _flatten_model(path)
    with pytest.raises(embedders.UncalibratedEmbedderError):
        embedders.get("onnx", model_path=str(path)).threshold
    report = {"embedder": {"name": "onnx"}, "recommended_threshold": 0.97}
    (tmp_path / "tower.onnx.calibration.json").write_text(json.dumps(report))
    embedder = embedders.get("onnx", model_path=str(path))
    assert embedder.threshold == 0.97
    clone = pickle.loads(pickle.dumps(embedder))
    assert clone._session is None and clone.embed_arrays(np.zeros((1, 8, 8, 3), np.uint8)).shape == (1, 192)


def test_checkpoint_adapter_centre_crop_shows_the_tower_the_central_square():
    tower = FakeImageTower(size=16)
    wide = np.zeros((100, 300, 3), np.uint8)
    wide[:, 100:200] = 255  # white central square, black sides
    embedders.get("checkpoint", encoder=(tower, 16), threshold=0.9, center_crop=True).embed_arrays(wide[None])
    assert tower.calls[-1][:, :, 1:-1].min() > 0.99  # only the white square (edges blend a little)
    embedders.get("checkpoint", encoder=(tower, 16), threshold=0.9).embed_arrays(wide[None])
    assert tower.calls[-1].min() == -1.0  # squashed: the black sides too
