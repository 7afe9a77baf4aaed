"""``--model_score`` with ``--download``: the crawl's rows are scored as a file's are, each image read back from
its staging file, against the loopback server and the registered ``colour_words`` pair model."""

import json

import numpy as np
import pytest

import repo_root
from common.schema import make_key
from corpus_paths import committed
from filters import model_score, score_cut
from filters.text import normalize_text
from pipeline.build import launcher
from tests import images as made
from tests.pipeline import score_models
from tests.pipeline.download.test_download_stage import LIMITS
from tests.pipeline.download_server import MisbehavingServer
from tests.pipeline.stages.test_model_score_stage import MODEL, QUICK

COLOURS = ("red", "green", "blue", "yellow")


def SERVER():  # noqa: N802 (the name the fixture ``server`` reads, tests/conftest.py)
    rng = np.random.default_rng(0)
    images = {f"{name}.jpg": made.noisy_colour(score_models.COLOURS[name], rng, (64, 48)) for name in COLOURS}
    images["good.jpg"] = images["red.jpg"]  # the server's routes expect one
    return MisbehavingServer(images)


def test_downloaded_pairs_are_scored_per_row_and_cut(tmp_path, server, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", repo_root.ROOT)
    rows = []
    for i, shown in enumerate(COLOURS):
        for said in (shown, COLOURS[(i + 1) % len(COLOURS)], "plain"):  # one image, three alt-texts
            rows.append((server.url(f"/img/{shown}.jpg"), f"a {said} thing on a page"))
    rows.append((server.url("/status/404"), "a red thing that is gone"))
    tsv = tmp_path / "urls.tsv"
    tsv.write_text("url\tcaption\n" + "".join(f"{url}\t{caption}\n" for url, caption in rows))
    funnel = launcher.run(["--input", str(tsv), "--output", str(tmp_path / "corpus"), "--download", *LIMITS,
                           *QUICK, "--set", "min_words=1", "--model_score", MODEL,
                           "--set", "model_score_threshold=0.5"])
    scorer = model_score.PairScorer(MODEL)
    images = [server.images[url.rsplit("/", 1)[1]] for url, _ in rows[:-1]]
    want = scorer.score(images, [normalize_text(c) for _, c in rows[:-1]])
    keys = [make_key(url, caption) for url, caption in rows]
    expected_cut = {keys[i] for i, score in enumerate(want) if score < 0.5}
    assert 0 < len(expected_cut) < len(want)

    stage = next(s for s in funnel["stages"] if s["stage"] == "model_score")
    assert stage["in"] == len(want) and stage["rejected"] == {score_cut.BELOW_THRESHOLD: len(expected_cut)}
    assert next(s for s in funnel["stages"] if s["stage"] == "download")["rejected"] == {"download/http_404": 1}
    ledger = {}
    for path in (committed(tmp_path / "corpus") / "stats" / "rejected").glob("*.jsonl"):
        ledger.update((line["key"], line) for line in map(json.loads, path.read_text().splitlines()))
    assert {k for k, line in ledger.items() if line["reason"] == score_cut.BELOW_THRESHOLD} == expected_cut
    for i in range(len(want)):  # each cut pair carries the score it was judged by: its own row's
        if keys[i] in expected_cut:
            assert ledger[keys[i]]["model_score"] == pytest.approx(float(want[i]), abs=1e-6)
    distribution = json.loads((committed(tmp_path / "corpus") / "stats" / "distributions.json").read_text())
    assert distribution["model_score"]["scored"] == len(want)
