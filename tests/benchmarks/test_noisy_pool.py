"""The noisy benchmark pool (``benchmarks.noisy_pool``): the stated shares, a manifest that names each pair, and
pairs a build reads."""

import collections
import json

import pyarrow.parquet as pq
import pytest

from benchmarks import noisy_pool
from common.schema import make_key


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    out = tmp_path_factory.mktemp("noisy_pool")
    info = noisy_pool.write_pool(str(out), pairs=60, mismatched_share=0.3, heldout_pairs=6, seed=3, processes=1)
    lines = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    return out, info, lines


def test_the_stated_shares_and_kinds(pool):
    _, info, lines = pool
    assert noisy_pool.kind_counts(60, 0.3) == {"clean": 40, "small": 2, "another_image": 12, "boilerplate": 3,
                                              "wrong_count": 2, "wrong_colour": 1}
    assert info["kinds"] == noisy_pool.kind_counts(60, 0.3)
    assert info["pairings"] == {"clean": 42, "mismatched": 18}
    held = [m for m in lines if m["part"] == "heldout"]
    assert len(held) == 6 and {m["kind"] for m in held} == {"clean"}
    assert info["eval_images"] == 240


def test_the_manifest_names_every_row_of_the_parquet_files(pool):
    out, _, lines = pool
    rows = []
    for path in sorted((out / "candidates").glob("*.parquet")) + sorted((out / "heldout").glob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    assert [r["key"] for r in rows] == [m["key"] for m in lines]
    for row, line in zip(rows, lines):
        assert line["pipeline_key"] == make_key(row["url"], row["caption"]) and row["caption"] == line["caption"]
        assert row["jpg"][:2] == b"\xff\xd8" and row["status"] == "success"
        small = min(row["width"], row["height"]) < 200
        assert small == (line["kind"] == "small")
    assert len({m["pipeline_key"] for m in lines}) == len(lines)


def test_each_kind_is_what_it_says(pool):
    _, _, lines = pool
    by_kind = collections.defaultdict(list)
    for m in lines:
        by_kind[m["kind"]].append(m["caption"])
    assert set(by_kind["boilerplate"]) <= set(noisy_pool.BOILERPLATE_TEXTS)
    numbers = ("a ", "an ", "one ", "two ", "three ", "four ", "five ", "single ")
    assert all(any(n in c.lower() for n in numbers) for c in by_kind["wrong_count"])
    colours = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white", "grey")
    assert all(any(f" {c} " in f" {caption.lower()} " for c in colours) for caption in by_kind["wrong_colour"])


def test_the_same_seed_gives_the_same_pool(pool, tmp_path):
    _, _, lines = pool
    noisy_pool.write_pool(str(tmp_path), pairs=60, mismatched_share=0.3, heldout_pairs=6, seed=3, processes=1)
    again = [json.loads(line) for line in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert again == lines


def test_the_command_line_errors_are_one_line(capsys):
    with pytest.raises(SystemExit):
        noisy_pool.main(["--out", "x", "--mismatched_share", "1.5"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--mismatched_share must be in [0, 1]" in err
