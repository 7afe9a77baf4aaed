"""common.state_files: the project's own JSON and JSONL files read back bounded and checked."""

import math

import pytest

from common import state_files as sf


def test_nesting_is_bounded_before_the_parser_recurses():
    assert sf.loads("[" * sf.MAX_JSON_DEPTH + "]" * sf.MAX_JSON_DEPTH) is not None
    with pytest.raises(sf.TooDeep, match="nested 100,000 deep"):
        sf.loads("[" * 100_000 + "]" * 100_000)
    # brackets inside strings are text, not nesting
    assert sf.loads('["' + "[" * 1000 + '"]') == ["[" * 1000]


@pytest.mark.parametrize("value", [3.0, True, -1, 1 << 63, float("nan"), "3", None])
def test_a_count_is_a_whole_number_in_range(value):
    with pytest.raises(sf.Problem):
        sf.whole(value, "n")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "0.5", False, 2.0])
def test_a_number_is_finite_and_within_its_bounds(value):
    with pytest.raises(sf.Problem):
        sf.number(value, "x", 0.0, 1.0)
    assert sf.number(0.5, "x", 0.0, 1.0) == 0.5 and sf.whole(7, "n") == 7


def test_a_damaged_file_is_one_line_naming_it_and_where(tmp_path):
    path = tmp_path / "state.json"
    schema = lambda doc: sf.mapping(doc, "", sf.whole)  # noqa: E731
    path.write_text('{"a": 1, "b": NaN}')
    with pytest.raises(sf.DamagedFile) as error:
        sf.read_json(str(path), schema, "rebuild it")
    assert str(error.value) == f"{path}: b: NaN, not a whole number >= 0: not what its writer wrote; rebuild it"
    path.write_bytes(b'{"a": 1, "b"')
    with pytest.raises(sf.DamagedFile, match="not valid JSON .*truncated or corrupt; rebuild it"):
        sf.read_json(str(path), schema, "rebuild it")
    path.write_bytes(b"x" * 101)
    with pytest.raises(sf.DamagedFile, match="larger than the 100 bytes"):
        sf.read_json(str(path), schema, max_bytes=100)
    assert sf.read_json(str(tmp_path / "absent.json"), schema) is None
    path.write_text('{"a": 1}')
    assert sf.read_json(str(path), schema) == {"a": 1}


def test_a_jsonl_file_skips_and_counts_its_damaged_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"n": 1}\n\n[1]\n{"n": "two"}\n' + b"[" * 1000 + b"\n" + b'{"n": 3' + b"\xff\n" + b'{"n": 4}')
    check = lambda row, where: sf.whole(sf.field(row, "n", where), f"{where}.n")  # noqa: E731
    lines = sf.read_jsonl(str(path), check)
    assert [row["n"] for row in lines.rows] == [1, 4]
    assert lines.skipped == 4 and lines.first_problem.startswith("line 3: ")
    long = tmp_path / "long.jsonl"
    long.write_bytes(b'{"n": 1}\n' + b'{"n": "' + b"x" * 200 + b'"}\n{"n": 2}\n')
    lines = sf.read_jsonl(str(long), check, max_line_bytes=100)
    assert [row["n"] for row in lines.rows] == [1, 2] and lines.skipped == 1 and "longer than 100" in lines.first_problem
