"""Hostile URL lists (JSONL, TSV): deep JSON, non-finite numbers, compressed files, cut streams, bombs.

Read as a ``--download`` build reads them (a well-formed row is a candidate
for the download stage, ``written`` here), in one child process under a
memory limit (``read_harness``).
"""

import gzip
import json

import pytest

from hostile_inputs import good_text, nested_json
from read_harness import TEST_LIMITS, fates, read_bounded

BOMB_LINE_BYTES = 300 << 20  # one line inflating to 300 MB from a few hundred kB


def json_line(name, i, **extra):
    url, caption = good_text(name, i)
    return json.dumps({"url": url, "caption": caption, **extra}).encode() + b"\n"


def tsv_lines(name, count):
    return b"url\tcaption\n" + b"".join(f"{good_text(name, i)[0]}\t{good_text(name, i)[1]}\n".encode() for i in range(count))


def gzip_with_bomb_line(name):
    """A good line, one line of ``BOMB_LINE_BYTES`` bytes, a good line: gzip members, one compressed megabyte
    repeated (a reader decodes concatenated members as one stream, as gzip does)."""
    block = gzip.compress(b"x" * (1 << 20))
    return (gzip.compress(json_line(name, 0)) + block * (BOMB_LINE_BYTES >> 20)
            + gzip.compress(b"\n" + json_line(name, 1)))


def write_cases(root):
    cases = {}

    def case(file_name, data, expected):
        (root / file_name).write_bytes(data)
        cases[file_name] = (root / file_name, expected)

    case("deep.jsonl", json_line("deep", 0) + nested_json(30_000) + b"\n" + json_line("deep", 1),
         ["written", "read/malformed_line", "written"])
    sizes = [("Infinity", "600"), ("-Infinity", "600"), ("1e400", "600"), ("NaN", "600"), (str(2**31), "600"), ("800", "600")]
    lines = b"".join(
        json_line("sizes", i)[:-2] + f', "original_width": {w}, "original_height": {h}}}\n'.encode()
        for i, (w, h) in enumerate(sizes)
    )
    case("non_finite.jsonl", lines, ["read/bad_source_size"] * 3 + ["written", "read/bad_source_size", "written"])
    case("valid.tsv.gz", gzip.compress(tsv_lines("valid_tsv", 3)), ["written"] * 3)
    case("valid.jsonl.gz", gzip.compress(b"".join(json_line("valid_jsonl", i) for i in range(3))), ["written"] * 3)
    whole = gzip.compress(tsv_lines("cut_tsv", 2000))
    case("cut.tsv.gz", whole[: len(whole) // 2], None)  # as many lines as the half holds, then the marker
    case("bomb.jsonl.gz", gzip_with_bomb_line("bomb"), ["written", "read/too_large", "written"])
    long_line = b"https://bad.example/" + b"a" * (TEST_LIMITS["max_line_bytes"] * 2) + b"\tcaption\n"
    case("long_line.tsv", tsv_lines("long", 1) + long_line + tsv_lines("long", 2)[len(b"url\tcaption\n"):],
         ["written", "read/too_large", "written", "written"])
    return cases


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    cases = write_cases(tmp_path_factory.mktemp("text"))
    return cases, read_bounded([p for p, _ in cases.values()], download=True)


def check(outcome, name):
    cases, result = outcome
    path, expected = cases[name]
    got = result["files"][str(path)]
    assert expected is None or fates(got) == expected, got.get("records", got)[:8]
    fates(got)  # read whole, and the same twice
    assert result["peak_rss"] < result["limit"]
    return got["records"]


def test_deeply_nested_json_line_is_one_malformed_line(outcome):
    records = check(outcome, "deep.jsonl")
    assert "nested 30,000 deep" in records[1][3]


def test_non_finite_and_huge_source_sizes_reject_their_line(outcome):
    check(outcome, "non_finite.jsonl")


@pytest.mark.parametrize("name", ["valid.tsv.gz", "valid.jsonl.gz"])
def test_compressed_url_lists_are_read(outcome, name):
    records = check(outcome, name)
    stem = "valid_tsv" if "tsv" in name else "valid_jsonl"
    assert [r[1] for r in records] == [good_text(stem, i)[0] for i in range(3)]


def test_cut_gzip_stream_ends_with_one_truncated_file_record(outcome):
    records = check(outcome, "cut.tsv.gz")
    assert [r[0] for r in records[:-1]] == ["written"] * (len(records) - 1) and len(records) > 100
    assert records[-1][0] == "read/truncated_file" and records[-1][2] == {"unread_records": "unknown"}
    assert "ends before its end-of-stream marker" in records[-1][3]


def test_gzip_bomb_line_is_too_large_and_never_held(outcome):
    records = check(outcome, "bomb.jsonl.gz")
    assert f"line of {BOMB_LINE_BYTES + 1:,} bytes" in records[1][3]


def test_line_over_the_cap_is_too_large(outcome):
    check(outcome, "long_line.tsv")
