"""``--embedder checkpoint`` in a build: its workdir reaches the workers through ``--embedder_arg``."""

import numpy as np
import pytest

from corpus_paths import committed
from pipeline.build import launcher
from tests.pipeline.build.test_build_safety import write_candidates

QUICK = ["--set", "vocab_size=0", "--set", "nsfw_threshold=1.0", "--set", "min_shorter_side=0",
         "--set", "dedup_in_corpus=true"]


def test_checkpoint_embedder_without_workdir_is_a_usage_error(tmp_path):
    pattern = write_candidates(tmp_path / "in", rows=3)
    with pytest.raises(launcher.UsageError, match="workdir"):
        launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), "--embedder", "checkpoint", *QUICK])
    assert not (tmp_path / "out").exists()


def test_checkpoint_embedder_gets_its_workdir_on_the_workers(tmp_path, monkeypatch):
    checkpoint = pytest.importorskip("trainer.checkpoint")
    loaded = []

    def fake_tower(workdir, step=None):
        loaded.append((workdir, step))  # the in-process runner's worker: this process
        return (lambda images: np.concatenate([images.mean(axis=(1, 2)), images[:, ::4, ::4, 0].reshape(
            len(images), -1)], axis=1) + 2), 16

    monkeypatch.setattr(checkpoint, "load_image_encoder", fake_tower)
    workdir = tmp_path / "run"
    workdir.mkdir()
    pattern = write_candidates(tmp_path / "in", rows=5)
    funnel = launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), "--embedder", "checkpoint",
                        "--embedder_arg", f"workdir={workdir}", "--embedder_arg", "threshold=0.99",
                        "--embedder_arg", "step=7", *QUICK])
    assert committed(tmp_path / "out").is_dir()
    assert loaded and set(loaded) == {(str(workdir), 7)}
    note = next(r for r in funnel["stages"] if r["stage"] == "near_duplicate_corpus")["note"]
    assert "embedder checkpoint" in note and "cosine > 0.99" in note
