"""The NSFW stage's note is the workers' word, not the launcher's environment."""

import importlib.util
import json

import pytest

from corpus_paths import committed
from pipeline.build import launcher
from tests.pipeline.build.test_build_safety import write_candidates

QUICK = ["--set", "vocab_size=0", "--set", "min_shorter_side=0"]


@pytest.fixture
def launcher_has_nudenet(monkeypatch):
    """The launcher's environment claims nudenet; the workers (this process's FnApiRunner) have none."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: (
        object() if name == "nudenet" else real(name, *a, **k)))
    try:
        import nudenet  # noqa: F401
    except ImportError:
        return
    pytest.skip("nudenet is installed here: the workers would score")


def test_funnel_note_counts_the_records_the_workers_passed_unscored(tmp_path, launcher_has_nudenet):
    pattern = write_candidates(tmp_path / "in", rows=6)
    funnel = launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK])
    row = next(r for r in funnel["stages"] if r["stage"] == "nsfw")
    assert row["note"].startswith("6 records passed UNSCORED: nudenet not installed")
    on_disk = json.loads((committed(tmp_path / "out") / "stats" / "funnel.json").read_text())
    assert next(r for r in on_disk["stages"] if r["stage"] == "nsfw")["note"] == row["note"]


def test_preset_can_fail_rather_than_pass_unscored(tmp_path):
    pattern = write_candidates(tmp_path / "in", rows=4)
    with pytest.raises(Exception, match="nsfw_unscored=fail"):
        launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK, "--set", "nsfw_unscored=fail"])
    assert not (tmp_path / "out" / "dataset_info.json").exists()  # nothing committed
