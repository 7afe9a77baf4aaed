"""The NSFW stage's note is the workers' word, not the launcher's; a default build scores every record it keeps."""

import hashlib
import json

import pytest

from corpus_paths import committed
from filters import open_nsfw
from pipeline.build import launcher
from pipeline.funnel.counts import NSFW_MEASURE
from pipeline.funnel.stats_files import NSFW_GALLERY_FILE
from pipeline.what_if.rules import WHAT_IF_FILE
from tests import images as made
from tests.pipeline.build.test_build_safety import write_candidates

QUICK = ["--set", "vocab_size=0", "--set", "min_shorter_side=0"]


@pytest.fixture
def nudenet_absent():
    """nudenet (the optional AGPL extra) is not installed here: a build that names it cannot score."""
    try:
        import nudenet  # noqa: F401
    except ImportError:
        return
    pytest.skip("nudenet is installed here: the workers would score")


def nsfw_row(funnel):
    return next(r for r in funnel["stages"] if r["stage"] == "nsfw")


def test_funnel_note_counts_the_records_the_workers_passed_unscored(tmp_path, nudenet_absent):
    pattern = write_candidates(tmp_path / "in", rows=6)
    funnel = launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK,
                           "--set", "nsfw_model=nudenet"])
    row = nsfw_row(funnel)
    assert row["note"].startswith("6 records passed UNSCORED: nudenet not installed")
    on_disk = json.loads((committed(tmp_path / "out") / "stats" / "funnel.json").read_text())
    assert nsfw_row(on_disk)["note"] == row["note"]
    stats = committed(tmp_path / "out") / "stats"
    assert NSFW_MEASURE not in json.loads((stats / "distributions.json").read_text())  # nothing scored
    assert not (stats / NSFW_GALLERY_FILE).read_text()


def test_preset_can_fail_rather_than_pass_unscored(tmp_path, nudenet_absent):
    pattern = write_candidates(tmp_path / "in", rows=4)
    with pytest.raises(Exception, match="nsfw_unscored=fail"):
        launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK,
                      "--set", "nsfw_model=nudenet", "--set", "nsfw_unscored=fail"])
    assert not (tmp_path / "out" / "dataset_info.json").exists()  # nothing committed


def test_a_default_build_scores_with_open_nsfw_and_keeps_the_scores(tmp_path):
    """The real model on the build's images: the note, the histogram, the what-if's rule, the gallery."""
    pattern = write_candidates(tmp_path / "in", rows=6)
    funnel = launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK])
    row = nsfw_row(funnel)
    assert row["note"] == f"scored by {open_nsfw.OpenNsfwScorer(precision='auto').label}, rejected if score >= 0.5"
    assert row["in"] == 6 and not row["rejected"]  # small drawn pictures: nothing pornographic
    stats = committed(tmp_path / "out") / "stats"
    histogram = json.loads((stats / "distributions.json").read_text())[NSFW_MEASURE]
    assert sum(histogram["counts"]) == 6
    what_if = json.loads((stats / WHAT_IF_FILE).read_text())
    assert sum(n for pairs in what_if["rules"]["nsfw"].values() for _, n in pairs) == 6
    gallery = [json.loads(line) for line in (stats / NSFW_GALLERY_FILE).read_text().splitlines()]
    distinct = {hashlib.sha256(made.swatch(i)).hexdigest() for i in range(6)}  # some of the six pictures are equal
    assert {g["side"] for g in gallery} == {"kept"}
    assert sorted(g["sha256"] for g in gallery) == sorted(distinct)  # each image once
    scores = [g["nsfw_score"] for g in gallery]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s < 0.5 for s in scores)
    assert all(g["thumbnail"] for g in gallery)  # read again from the source file
