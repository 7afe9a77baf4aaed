"""The build job's options on a small hand-made input: presets, in-corpus dedup, bad files."""

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from corpus_paths import committed
from pipeline.build import launcher


def photo(seed, size=(420, 300), fmt="JPEG", quality=90):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0 : size[1], 0 : size[0]]
    freq = rng.uniform(0.01, 0.05, 3)
    arr = np.stack([127 + 120 * np.sin(xx * f + yy * f * (i + 1) + seed) for i, f in enumerate(freq)], -1)
    out = io.BytesIO()
    Image.fromarray(arr.astype("uint8")).save(out, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return out.getvalue()


CAPTIONS = ["a striped pattern in warm colours", "waves of colour across a wall", "soft bands of light and shade"]


def write_input(directory):
    rows = []
    for i in range(12):
        rows.append({"url": f"https://e.x/{i}.jpg", "caption": CAPTIONS[i % 3] + f" number {i}", "jpg": photo(i)})
    # A re-encoded copy of image 0 and a byte-identical copy of image 1, under other captions.
    rows.append({"url": "https://e.x/copy0.jpg", "caption": "another caption for the first one", "jpg": photo(0, quality=60)})
    rows.append({"url": "https://e.x/copy1.jpg", "caption": "another caption for the second one", "jpg": photo(1)})
    rows.append({"url": "https://e.x/p.png", "caption": "a png image of colour bands", "jpg": photo(5, (900, 450), "PNG")})
    pq.write_table(pa.Table.from_pylist(rows), directory / "part-0.parquet")
    (directory / "part-1.parquet").write_bytes(b"PAR1 this is not a parquet file")
    return len(rows) + 1  # the unreadable file counts as one rejected input


def run(tmp_path, *args):
    inputs = tmp_path / "in"
    inputs.mkdir(exist_ok=True)
    n = write_input(inputs)
    out = tmp_path / "out"
    funnel = launcher.run(["--input", str(inputs / "*.parquet"), "--output", str(out), "--overwrite",
                        "--set", "vocab_size=0", "--set", "nsfw_threshold=1.0", *args])
    rejected = {}
    for path in sorted((committed(out) / "stats" / "rejected").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rejected[row["url"]] = row["reason"]
    assert funnel["conserved"] and funnel["input"] == n
    return funnel, rejected


def test_cc12m_and_in_corpus_dedup(tmp_path):
    funnel, rejected = run(tmp_path, "--preset", "cc12m", "--set", "dedup_in_corpus=true", "--set", "min_ngram_count=0",
                           "--set", "min_both_sides=250", "--set", "min_shorter_side=250")
    assert funnel["preset_name"] == "cc12m"
    assert rejected["https://e.x/p.png"] == "image_format/not_allowed"  # cc12m keeps JPEG only
    assert any(r == "read/unreadable_file" for r in rejected.values())
    # Of each pair of copies, the one with the larger key goes; both copies' reasons are in-corpus.
    copies = {u: r for u, r in rejected.items() if r.startswith("near_duplicate_corpus/")}
    assert len(copies) == 2, rejected
    assert {r.split("/")[1] for r in copies.values()} <= {"sha256", "phash", "embedding"}


def test_beam_counters_equal_the_funnel(tmp_path):
    funnel, _ = run(tmp_path)
    counters = json.loads((committed(tmp_path / "out") / "stats" / "metrics.json").read_text())
    assert counters.pop("input") == funnel["input"]
    for split, count in funnel["written"].items():
        assert counters.pop(f"written/{split}") == count
    reasons = {r: c for row in funnel["stages"] for r, c in row["rejected"].items()}
    assert counters == reasons


def test_existing_output_needs_overwrite(tmp_path):
    from pipeline.publish.output_contract import OutputRefused

    (tmp_path / "in").mkdir()
    write_input(tmp_path / "in")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("old")
    with pytest.raises(OutputRefused, match="--overwrite"):
        launcher.run(["--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out")])
    assert (tmp_path / "out" / "x").read_text() == "old"


def test_print_preset(capsys):
    launcher.run(["--preset", "cc12m", "--set", "max_words=30", "--print_preset"])
    printed = capsys.readouterr().out
    assert "preset: cc12m" in printed and "max_words" in printed and "30" in printed
