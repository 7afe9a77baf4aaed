"""Audit: funnel table, checks and the self-contained HTML report.

``write_fixture_stats`` builds a realistic ``stats/`` directory in the format
``pipeline.build`` writes (all 16 stages, two histogram conventions, the
n-gram count of counts, thumbnails as base64 JPEG); test_report_browser.py
reuses it.
"""

import base64
import html.parser
import io
import json
import os
import subprocess
import sys

import pytest
from PIL import Image, ImageDraw

import repo_root
from filters import stages
from filters.presets import get_preset
from pipeline.audit import auditor as audit
from pipeline.audit import plots as report_plots
from pipeline.audit import read_stats, report
from pipeline.funnel import table as funnel_table

REPO = repo_root.ROOT

# stage -> {reason: count}; stages absent here ran and rejected nothing,
# except NOT_RUN.
REJECTED = {
    "read": {"read/no_image": 310, "read/bad_status": 120},
    "image_header": {"image_header/undecodable": 41, "image_header/decompression_bomb": 2},
    "image_format": {"image_format/not_allowed": 57},
    "image_size": {"image_size/too_small": 1874},
    "image_aspect": {"image_aspect/too_elongated": 403},
    "text": {"text/empty": 96},
    "text_length": {"text_length/too_short": 1122, "text_length/too_long": 388},
    "image_decode": {"image_decode/truncated": 13},
    "nsfw": {"nsfw/pornographic": 21},
    "texts_per_image": {"texts_per_image/too_many": 3},
    "images_per_text": {"images_per_text/too_many": 217},
    "rare_ngrams": {"rare_ngrams/rare": 640},
    "near_duplicate_eval": {"near_duplicate_eval/imagenet": 9},
    "duplicate_pair": {"duplicate_pair/repeat": 31},
}
NOT_RUN = {"near_duplicate_corpus"}
INPUT = 10_000
VALIDATION = 233
NOTES = {"nsfw": "nudenet 3.4.2 (onnxruntime 1.31.1)", "near_duplicate_corpus": "dedup_in_corpus is false"}


def make_funnel(preset_name="align"):
    remaining = INPUT
    rows = []
    for name, description in stages.STAGES:
        rejected = REJECTED.get(name, {})
        out = remaining - sum(rejected.values())
        row = {"stage": name, "description": description, "ran": name not in NOT_RUN, "in": remaining,
               "rejected": dict(rejected), "out": out}
        if name in NOTES:
            row["note"] = NOTES[name]
        rows.append(row)
        remaining = out
    rejected_total = INPUT - remaining
    preset = get_preset(preset_name)
    return {
        "dataset": "fixture_corpus",
        "preset_name": preset.name,
        "preset": {k: list(v) if isinstance(v, tuple) else v for k, v in preset.as_dict().items()},
        "input": INPUT,
        "stages": rows,
        "written": {"train": remaining - VALIDATION, "validation": VALIDATION},
        "rejected_total": rejected_total,
        "conserved": True,
    }


def thumbnail(seed, size=(128, 96)):
    """A small, distinct, benign JPEG (a coloured gradient with a shape)."""
    img = Image.new("RGB", size)
    draw = ImageDraw.Draw(img)
    r, g, b = (seed * 67) % 256, (seed * 131) % 256, (seed * 199) % 256
    for x in range(size[0]):
        draw.line([(x, 0), (x, size[1])], fill=(r, (g + x) % 256, b))
    draw.ellipse([20 + seed % 30, 20, 80 + seed % 30, 70], fill=(255 - r, 255 - g, 255 - b))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=80)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def make_samples(per_reason=4):
    rows = []
    seed = 0
    for name in stages.STAGE_NAMES:
        for reason in sorted(REJECTED.get(name, {})):
            for i in range(per_reason):
                seed += 1
                no_image = reason in ("read/no_image", "image_header/undecodable")
                rows.append({
                    "reason": reason, "stage": name, "key": f"{seed:024x}",
                    "url": f"https://img.example.com/{seed}.jpg",
                    "alt_text": f"sample {seed} of {reason}: a photo of a red bicycle leaning on a wall",
                    "width": 0 if no_image else 180 + seed, "height": 0 if no_image else 150 + seed,
                    "format": "" if no_image else "JPEG",
                    "thumbnail": None if no_image else thumbnail(seed),
                })
    return rows


def make_distributions():
    return {
        # pipeline/funnel/counts.py convention: len(counts) == len(edges), last bin open.
        "shorter_side": {
            "edges": [0, 50, 100, 150, 200, 201, 250, 300, 400, 401, 500, 750, 1000, 2000, 5000],
            "counts": [310, 420, 650, 494, 12, 800, 900, 1300, 7, 1500, 1100, 700, 350, 90, 4],
            "description": "shorter image side in pixels",
        },
        "aspect_ratio": {
            "edges": [1.0, 1.25, 1.5, 2.0, 2.5, 2.75, 3.0, 4.0, 6.0, 10.0],
            "counts": [2900, 2500, 1700, 650, 200, 110, 250, 100, 40, 13],
            "description": "longer/shorter side",
        },
        "words_per_text": {
            "edges": [0, 1, 2, 3, 5, 10, 15, 20, 21, 30, 50, 100, 257],
            "counts": [96, 600, 522, 1100, 2300, 1500, 700, 60, 250, 100, 30, 8, 0],
            "description": "unigrams per normalised alt-text",
        },
        # filters/frequency.py convention: len(counts) == len(edges) - 1.
        "texts_per_image": {
            "edges": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1001, 1002],
            "counts": [4100, 300, 80, 22, 9, 4, 1, 0, 0, 0, 3],
            "description": "distinct alt-texts per image",
            "log": True,
        },
        "images_per_text": {
            "edges": [1, 2, 4, 8, 11, 12],
            "counts": [3900, 350, 120, 40, 21],
            "description": "distinct images per alt-text",
            "cut": 10,
        },
        "count_of_counts": {
            "counts": {str(c): max(1, int(20000 / c**1.6)) for c in range(1, 400, 3)},
            "cut_count": 4,
            "vocab_size": 5210,
            "num_ngrams": 31844,
        },
    }


def make_near_duplicates(n=12):
    return [
        {"key": f"{i:024x}", "index_set": "imagenet_val", "index_key": f"ILSVRC2012_val_{i:08d}",
         "variant": "crop" if i % 2 else "exact", "cosine": round(0.991 - 0.0043 * i, 4),
         "thumbnail": thumbnail(100 + i), "index_thumbnail": thumbnail(100 + i, size=(112, 112))}
        for i in range(n)
    ]


def write_fixture_stats(data_dir, funnel=None, omit=(), samples=None):
    """Writes ``data_dir/stats/*``; returns the stats dir. ``omit``: file names to leave out."""
    stats_dir = os.path.join(str(data_dir), "stats")
    os.makedirs(stats_dir, exist_ok=True)
    files = {
        read_stats.FUNNEL_FILE: json.dumps(funnel or make_funnel(), indent=1),
        read_stats.DISTRIBUTIONS_FILE: json.dumps(make_distributions(), indent=1),
        read_stats.SAMPLES_FILE: "".join(json.dumps(r) + "\n" for r in (make_samples() if samples is None else samples)),
        read_stats.NEAR_DUPLICATES_FILE: "".join(json.dumps(r) + "\n" for r in make_near_duplicates()),
    }
    for name, text in files.items():
        if name not in omit:
            with open(os.path.join(stats_dir, name), "w") as handle:
                handle.write(text)
    open(os.path.join(str(data_dir), "COMPLETED"), "w").close()  # a finished build
    return stats_dir


class ImgCollector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.tags, self.hrefs = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.imgs.append(attrs)
        if "href" in attrs:
            self.hrefs.append(attrs["href"])


def parse(html_text):
    collector = ImgCollector()
    collector.feed(html_text)
    return collector


# ---------------------------------------------------------------------------
# The text table
# ---------------------------------------------------------------------------


def test_format_funnel_lists_every_stage_in_order_with_its_numbers():
    funnel = make_funnel()
    text = funnel_table.format_funnel(funnel)
    lines = text.splitlines()
    positions = []
    for i, name in enumerate(stages.STAGE_NAMES, 1):
        matching = [n for n, line in enumerate(lines) if line.split()[:2] == [str(i), name]]
        assert len(matching) == 1, name
        positions.append(matching[0])
        row = funnel["stages"][i - 1]
        cells = lines[matching[0]].split()
        assert cells[2] == f"{row['in']:,}"
        assert cells[4] == f"{row['out']:,}"
        assert cells[5] == f"{100 * row['out'] / INPUT:.1f}%"
    assert positions == sorted(positions)
    assert "10,000 input records" in text
    assert "too_small 1,874" in text and "too_short 1,122, too_long 388" in text
    near_corpus = next(line for line in lines if " near_duplicate_corpus " in line)
    assert "(not run)" in near_corpus
    assert f"validation {VALIDATION:,}" in text
    assert "conservation: input 10,000 == written" in text and text.rstrip().endswith("OK")
    assert "nsfw: nudenet 3.4.2" in text  # stage notes are printed
    assert "!!!" not in text


def test_format_funnel_columns_are_aligned():
    lines = funnel_table.format_funnel(make_funnel()).splitlines()
    table = lines[1:2 + 1 + len(stages.STAGES)]
    # right-aligned numeric columns end at the same offset on every row
    ends = {line.index("%") for line in table[2:]}
    assert len(ends) == 1


def test_non_conserved_funnel_is_flagged_loudly():
    funnel = make_funnel()
    funnel["written"]["train"] -= 10  # ten records lost without a reason
    text = funnel_table.format_funnel(funnel)
    assert "!!! CONSERVATION CHECK FAILED" in text
    assert "10 record(s) unaccounted for" in text
    assert "funnel.json says conserved=True" in text
    assert "OK" not in text.splitlines()[-1]


def test_check_funnel_finds_broken_stage_arithmetic():
    assert funnel_table.check_funnel(make_funnel()) == []
    funnel = make_funnel()
    funnel["stages"][stages.STAGE_INDEX["image_size"]]["out"] += 5
    problems = funnel_table.check_funnel(funnel)
    assert any("stage image_size: in" in p for p in problems)
    assert any("stage image_aspect: in" in p and "previous stage" in p for p in problems)
    funnel = make_funnel()
    funnel["stages"][0], funnel["stages"][1] = funnel["stages"][1], funnel["stages"][0]
    assert any("order" in p for p in funnel_table.check_funnel(funnel))


def test_audit_module_imports_without_matplotlib():
    # The build prints its funnel with format_funnel: keep that import light.
    code = "import sys, pipeline.audit; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))


# ---------------------------------------------------------------------------
# Plot helpers
# ---------------------------------------------------------------------------


def test_bins_read_both_histogram_conventions():
    closed = report_plots._bins({"edges": [1, 2, 4], "counts": [5, 6]})
    assert closed == [(1.0, 2.0, 5), (2.0, 4.0, 6)]
    open_last = report_plots._bins({"edges": [1, 2, 4], "counts": [5, 6, 7]})
    assert open_last[-1] == (4.0, None, 7)
    with pytest.raises(ValueError):
        report_plots._bins({"edges": [1, 2], "counts": [1, 2, 3, 4]})
    assert report_plots._bin_label(3, 5, True) == "3–4" and report_plots._bin_label(20, 21, True) == "20"
    assert report_plots._bin_label(2.5, 2.75, False) == "2.5–2.75" and report_plots._bin_label(1000, None, True) == "≥1,000"


def test_bin_colours_follow_the_preset_rules():
    align = make_funnel("align")["preset"]
    cuts = report_plots.distribution_cuts("shorter_side", {}, align)
    assert cuts == [("min_shorter_side", ">", 200.0)]  # min_both_sides = 0 is disabled
    assert report_plots._bin_colour(150, 200, cuts, True) == report_plots.CUT
    assert report_plots._bin_colour(200, 201, cuts, True) == report_plots.CUT  # 200 itself is not > 200
    assert report_plots._bin_colour(201, 250, cuts, True) == report_plots.KEPT
    assert report_plots._bin_colour(150, 250, cuts, True) == report_plots.MIXED
    words = report_plots.distribution_cuts("words_per_text", {}, align)
    assert report_plots._bin_colour(20, 21, words, True) == report_plots.KEPT and report_plots._bin_colour(21, 30, words, True) == report_plots.CUT
    assert report_plots._bin_colour(2, 3, words, True) == report_plots.CUT and report_plots._bin_colour(3, 5, words, True) == report_plots.KEPT
    aspect = report_plots.distribution_cuts("aspect_ratio", {}, align)
    assert report_plots._bin_colour(2.75, 3.0, aspect, False) == report_plots.KEPT and report_plots._bin_colour(3.0, 4.0, aspect, False) == report_plots.CUT
    cc12m = make_funnel("cc12m")["preset"]
    assert report_plots.distribution_cuts("aspect_ratio", {}, cc12m) == [("max_aspect_ratio", "<=", 2.5)]
    assert report_plots.distribution_cuts("something_else", {"cut": 7}, align) == [("cut", "", 7.0)]


def test_thumbnail_uri_accepts_only_real_images():
    jpeg = thumbnail(1)
    assert report.thumbnail_uri(jpeg).startswith("data:image/jpeg;base64,")
    svg = base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>').decode()
    assert report.thumbnail_uri(svg) is None
    assert report.thumbnail_uri('AAAA" onerror="alert(1)') is None
    assert report.thumbnail_uri(None) is None and report.thumbnail_uri("") is None


# ---------------------------------------------------------------------------
# The HTML report
# ---------------------------------------------------------------------------


# Rendering every plot takes seconds on a loaded 2-core machine: the full
# report is rendered once; the other report tests leave the plots' inputs out.
NO_PLOTS = (read_stats.DISTRIBUTIONS_FILE,)


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("full")
    write_fixture_stats(data_dir)
    path = audit.render_report(str(data_dir))
    with open(path, encoding="utf-8") as handle:
        return str(data_dir), path, handle.read()


def test_report_is_self_contained_with_plots_and_thumbnails(full_report):
    data_dir, path, text = full_report
    assert path == os.path.join(data_dir, "stats", "report.html")
    page = parse(text)
    srcs = [img["src"] for img in page.imgs]
    assert all(src.startswith("data:image/") for src in srcs)
    plots = [s for s in srcs if s.startswith("data:image/png")]
    # funnel + 5 histograms + count of counts + near-duplicate cosines
    assert len(plots) == 8
    samples = make_samples()
    with_thumbs = sum(1 for s in samples if s["thumbnail"])
    jpegs = [s for s in srcs if s.startswith("data:image/jpeg")]
    assert len(jpegs) == with_thumbs + 2 * len(make_near_duplicates())
    for row in samples:
        if row["thumbnail"]:
            assert row["thumbnail"] in text
    assert text.count('class="noimg"') == sum(1 for s in samples if not s["thumbnail"])
    assert "script" not in page.tags and "link" not in page.tags
    assert all(h.startswith("#") for h in page.hrefs)  # no link leaves the page
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    for name in stages.STAGE_NAMES:
        assert f"<b>{name}</b>" in text
    for reason in (r for reasons in REJECTED.values() for r in reasons):
        assert f'id="r-{reason}"' in text
    assert "0.9910" in text and "ILSVRC2012_val_00000000" in text
    assert 'class="banner ok"' in text and "FUNNEL CHECK FAILED" not in text
    nsfw_thumbs = sum(1 for row in samples if row["stage"] == "nsfw" and row["thumbnail"])
    assert text.count('<label class="reveal"') == nsfw_thumbs > 0  # nsfw rejects are blurred until clicked
    assert 'id="nsfw"' not in text  # no scores and no gallery: the build's NSFW section is not shown


def test_report_escapes_alt_text_and_urls(tmp_path):
    evil = {"reason": "text/empty", "stage": "text", "key": "k", "url": 'https://x/"><script>alert(1)</script>',
            "alt_text": "<img src=https://tracker.example/x.gif> & <script>alert(2)</script>",
            "width": 300, "height": 300, "format": "JPEG", "thumbnail": thumbnail(3)}
    write_fixture_stats(tmp_path, samples=[evil], omit=NO_PLOTS)
    text = open(audit.render_report(str(tmp_path)), encoding="utf-8").read()
    page = parse(text)
    assert "script" not in page.tags
    assert all(img["src"].startswith("data:") for img in page.imgs)
    assert "&lt;img src=https://tracker.example/x.gif&gt; &amp; &lt;script&gt;" in text


def test_report_handles_missing_optional_files(tmp_path):
    write_fixture_stats(tmp_path, omit=(read_stats.SAMPLES_FILE, read_stats.DISTRIBUTIONS_FILE, read_stats.NEAR_DUPLICATES_FILE))
    text = open(audit.render_report(str(tmp_path)), encoding="utf-8").read()
    assert "rejected_samples.jsonl is missing" in text
    assert "distributions.json is missing" in text
    assert "near_duplicates.jsonl is missing: near-duplicate removal did not run" in text
    srcs = [img["src"] for img in parse(text).imgs]
    assert len(srcs) == 1 and srcs[0].startswith("data:image/png")  # only the funnel chart
    assert 'class="banner ok"' in text


def test_report_without_funnel_still_renders_and_says_so(tmp_path):
    write_fixture_stats(tmp_path, omit=(read_stats.FUNNEL_FILE,) + NO_PLOTS)
    text = open(audit.render_report(str(tmp_path)), encoding="utf-8").read()
    assert "funnel.json is missing" in text and "FUNNEL CHECK FAILED" in text
    assert "image_size/too_small" in text  # the samples are still shown


def test_report_flags_non_conserved_funnel(tmp_path):
    funnel = make_funnel()
    funnel["rejected_total"] -= 7
    funnel["stages"][stages.STAGE_INDEX["image_aspect"]]["rejected"]["image_aspect/too_elongated"] -= 7
    funnel["conserved"] = False
    write_fixture_stats(tmp_path, funnel=funnel, omit=NO_PLOTS)
    text = open(audit.render_report(str(tmp_path)), encoding="utf-8").read()
    assert 'class="banner fail"' in text
    assert "CONSERVATION CHECK FAILED: input 10,000 != written" in text


def test_unreadable_jsonl_lines_are_skipped_and_reported(tmp_path):
    stats_dir = write_fixture_stats(tmp_path, omit=NO_PLOTS)
    with open(os.path.join(stats_dir, read_stats.NEAR_DUPLICATES_FILE), "a") as handle:
        handle.write('{"key": truncated\n')
    loaded = read_stats.load_stats(str(tmp_path))
    assert len(loaded["near_duplicates"]) == len(make_near_duplicates())
    assert "1 unreadable line(s) skipped" in report.build_html(loaded)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def test_cli_prints_table_and_writes_report(tmp_path, capsys):
    write_fixture_stats(tmp_path, omit=NO_PLOTS)
    assert audit.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "near_duplicate_eval" in out and "report: " in out
    assert os.path.exists(os.path.join(str(tmp_path), "stats", "report.html"))


def test_cli_accepts_stats_dir_and_no_html(tmp_path, capsys):
    stats_dir = write_fixture_stats(tmp_path)
    assert audit.main([stats_dir, "--no_html"]) == 0
    assert "report: " not in capsys.readouterr().out
    assert not os.path.exists(os.path.join(stats_dir, "report.html"))


def test_cli_exit_status_on_failed_check_and_missing_funnel(tmp_path, capsys):
    funnel = make_funnel()
    funnel["input"] += 3
    write_fixture_stats(tmp_path / "bad", funnel=funnel)
    assert audit.main([str(tmp_path / "bad"), "--no_html"]) == 1
    assert "CONSERVATION CHECK FAILED" in capsys.readouterr().out
    os.makedirs(tmp_path / "empty")
    assert audit.main([str(tmp_path / "empty"), "--no_html", "--allow_incomplete"]) == 2
    assert "no funnel.json" in capsys.readouterr().err


def test_cli_refuses_a_build_that_did_not_finish(tmp_path, capsys):
    """A killed build (stats and shards, no COMPLETED) is not audited as if it were whole."""
    stats_dir = write_fixture_stats(tmp_path)
    os.remove(tmp_path / "COMPLETED")
    for target in (str(tmp_path), stats_dir):
        with pytest.raises(SystemExit) as exit_info:
            audit.main([target, "--no_html"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "has no COMPLETED" in err and "--allow_incomplete" in err
    assert audit.main([str(tmp_path), "--no_html", "--allow_incomplete"]) == 0


def test_cli_runs_as_a_module(tmp_path):
    write_fixture_stats(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.audit", str(tmp_path), "--no_html"],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "conservation: input 10,000" in done.stdout


@pytest.mark.parametrize("damage", ["truncated", "binary", "not an object"])
def test_cli_names_a_damaged_funnel_in_one_line(tmp_path, capsys, damage):
    """A truncated or corrupt funnel.json: one line naming it and what to do; the report still says what it can."""
    stats_dir = write_fixture_stats(tmp_path)
    path = os.path.join(stats_dir, read_stats.FUNNEL_FILE)
    text = open(path, "rb").read()
    damaged = {"truncated": text[: len(text) // 2], "binary": b"\xff\xfe\x00garbage" + text,
               "not an object": b"[1, 2, 3]"}[damage]
    open(path, "wb").write(damaged)
    assert audit.main([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"error: {path}: "), captured.err
    assert "rebuild the corpus" in captured.err and "Traceback" not in captured.err
    page = open(os.path.join(stats_dir, read_stats.REPORT_FILE), encoding="utf-8").read()
    assert "FUNNEL CHECK FAILED" in page and "funnel.json: " in page


def test_report_counts_what_it_cannot_read_in_the_other_stats_files(tmp_path):
    stats_dir = write_fixture_stats(tmp_path, omit=NO_PLOTS)
    with open(os.path.join(stats_dir, read_stats.SAMPLES_FILE), "ab") as handle:
        handle.write(b'{"reason": "text/too_short", "alt_te\n\xff\xfe\n')  # a cut line, then binary junk
    open(os.path.join(stats_dir, read_stats.CONCEPTS_FILE), "w").write('{"splits": {"tra')
    text = open(audit.render_report(str(tmp_path)), encoding="utf-8").read()
    assert "rejected_samples.jsonl: 2 unreadable line(s) skipped" in text
    assert "concepts.json: not valid JSON" in text
    assert 'class="banner ok"' in text  # the funnel itself is whole
