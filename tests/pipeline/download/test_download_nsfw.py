"""NSFW scoring with ``--download``: the crawl's images are scored by the real model (open_nsfw) where they were
fetched, and each row carries its image's score to the funnel, the histogram, the ledger and the gallery."""

import hashlib
import json

import pytest

import repo_root
from common.schema import make_key
from corpus_paths import committed
from filters import nsfw, open_nsfw
from pipeline.build import launcher
from pipeline.funnel.counts import NSFW_MEASURE
from pipeline.funnel.stats_files import NSFW_GALLERY_FILE
from tests.pipeline.download.test_download_stage import LIMITS
from tests.pipeline.download_server import MisbehavingServer, jpeg

IMAGES = {f"{i}.jpg": jpeg(240 + 40 * i, 200, seed=7 * i) for i in range(4)}
QUICK = ["--set", "vocab_size=0", "--set", "min_shorter_side=0", "--set", "min_words=1"]


def SERVER():  # noqa: N802 (the name the fixture ``server`` reads, tests/conftest.py)
    return MisbehavingServer(dict(IMAGES, **{"good.jpg": IMAGES["0.jpg"]}))


def test_downloaded_images_are_scored_once_and_each_row_keeps_the_score(tmp_path, server, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", repo_root.ROOT)
    stage = nsfw.NsfwScoring(0.5)
    stage.load()
    _, found = stage.judge_with_scores(list(IMAGES.values()))
    want = dict(zip(IMAGES, found))
    low = sorted(found)
    threshold = float(f"{(low[1] + low[2]) / 2:.6g}")  # the two lowest kept, the other two rejected
    assert low[1] < threshold <= low[2]
    rows = [(server.url(f"/img/{name}"), f"picture {name} caption {c}") for name in IMAGES for c in "ab"]
    tsv = tmp_path / "urls.tsv"
    tsv.write_text("url\tcaption\n" + "".join(f"{url}\t{caption}\n" for url, caption in rows))
    funnel = launcher.run(["--input", str(tsv), "--output", str(tmp_path / "corpus"), "--download", *LIMITS,
                           *QUICK, "--set", f"nsfw_threshold={threshold}"])

    row = next(s for s in funnel["stages"] if s["stage"] == "nsfw")
    assert row["note"] == (f"scored by {open_nsfw.OpenNsfwScorer(precision='auto').label}, "
                           f"rejected if score >= {threshold}")
    rejected = {name for name, score in want.items() if score >= threshold}
    assert row["in"] == len(rows) and row["rejected"] == {nsfw.REJECT_REASON: 2 * len(rejected)}
    stats = committed(tmp_path / "corpus") / "stats"
    assert sum(json.loads((stats / "distributions.json").read_text())[NSFW_MEASURE]["counts"]) == len(rows)
    ledger = {}
    for path in (stats / "rejected").glob("*.jsonl"):
        ledger.update((line["key"], line) for line in map(json.loads, path.read_text().splitlines()))
    for (url, caption) in rows:
        name = url.rsplit("/", 1)[1]
        if name in rejected:
            line = ledger[make_key(url, caption)]
            assert line["reason"] == nsfw.REJECT_REASON
            assert line["nsfw_score"] == pytest.approx(want[name], abs=1e-6)
    gallery = [json.loads(line) for line in (stats / NSFW_GALLERY_FILE).read_text().splitlines()]
    by_image = {hashlib.sha256(IMAGES[name]).hexdigest(): name for name in IMAGES}
    assert sorted(by_image[g["sha256"]] for g in gallery) == sorted(IMAGES)  # each image once
    for g in gallery:
        name = by_image[g["sha256"]]
        assert g["side"] == ("rejected" if name in rejected else "kept")
        assert g["nsfw_score"] == pytest.approx(want[name], abs=1e-6)
        assert g["thumbnail"]  # read back from the crawl's staging file
