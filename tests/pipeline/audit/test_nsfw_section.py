"""The report's NSFW section: the scorer, its cut, the scores' histogram and the gallery, blurred until clicked."""

import json
import os

from pipeline.audit import auditor as audit
from pipeline.audit import read_stats
from pipeline.funnel.counts import HISTOGRAM_EDGES, NSFW_MEASURE
from pipeline.funnel.stats_files import NSFW_GALLERY_FILE
from tests.pipeline.audit.test_audit import NO_PLOTS, parse, thumbnail, write_fixture_stats


def make_nsfw_gallery():
    """Four kept and three rejected images as ``pipeline.write.nsfw_gallery`` writes them (one kept without a
    thumbnail: its file changed since the build)."""
    rows = []
    for side, scores in (("kept", [0.41, 0.07, 0.33, 0.12]), ("rejected", [0.62, 0.97, 0.88])):
        for i, score in enumerate(scores):
            seed = 300 + len(rows)
            rows.append({"side": side, "nsfw_score": score, "key": f"{seed:024x}", "sha256": f"{seed:064x}",
                         "reason": "nsfw/pornographic" if side == "rejected" else "",
                         "url": f"https://img.example.com/{seed}.jpg", "alt_text": f"gallery {side} {i}",
                         "width": 300, "height": 200, "format": "JPEG",
                         "thumbnail": None if (side, i) == ("kept", 3) else thumbnail(seed)})
    return rows


def test_report_nsfw_section_shows_the_scores_cut_and_a_gallery_blurred_until_clicked(tmp_path):
    stats_dir = write_fixture_stats(tmp_path, omit=NO_PLOTS, samples=[])
    edges = HISTOGRAM_EDGES[NSFW_MEASURE]
    counts = [5000, 1200, 600, 300, 150, 60, 30, 20, 12, 4, 3, 3, 2, 3, 2, 4]
    with open(os.path.join(stats_dir, read_stats.DISTRIBUTIONS_FILE), "w") as handle:
        json.dump({NSFW_MEASURE: {"edges": edges, "counts": counts, "description": "nsfw scores"}}, handle)
    gallery = make_nsfw_gallery()
    with open(os.path.join(stats_dir, NSFW_GALLERY_FILE), "w") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in gallery))
    text = open(audit.render_report(str(tmp_path)), encoding="utf-8").read()
    section = text[text.index('<h2 id="nsfw">'):text.index('id="rejects"')]
    assert "<code>open_nsfw</code>" in section and "score &ge; 0.5" in section  # the preset's model and cut
    assert f"{sum(counts):,} records scored" in section and "<code>nsfw/pornographic</code> 21" in section
    assert "nudenet 3.4.2" in section  # the workers' note
    assert sum(1 for img in parse(section).imgs if img["src"].startswith("data:image/png")) == 1  # the histogram
    assert f"{NSFW_MEASURE} histogram" not in [img.get("alt") for img in parse(text).imgs]  # drawn once, here
    shown = [row for row in gallery if row["thumbnail"]]
    assert section.count('<label class="reveal"') == len(shown)  # every thumbnail blurred until clicked
    assert section.count('class="noimg"') == 1
    kept, rejected = section.split("Highest-scoring rejected images")
    assert [f"{s:.4f}" for s in (0.41, 0.33, 0.12, 0.07)] == [
        m.split("<")[0] for m in kept.split("<b>score ")[1:]]  # highest first
    assert [f"{s:.4f}" for s in (0.97, 0.88, 0.62)] == [m.split("<")[0] for m in rejected.split("<b>score ")[1:]]
    assert "script" not in parse(text).tags
