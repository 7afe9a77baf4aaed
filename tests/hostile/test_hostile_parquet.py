"""Hostile Parquet files: footers that lie about row counts and sizes, non-finite numbers, huge cells.

The footers are rewritten by ``parquet_footer`` (the Thrift compact
protocol) after pyarrow wrote honest files: the pages stay as they were, so
the good rows are there to be read. One child process reads them all under
a memory limit (``read_harness``).
"""

import pytest

from hostile_inputs import good, good_rows, lying_parquet, write_parquet
from parquet_footer import set_chunk
from read_harness import TEST_LIMITS, fates, read_bounded

SIX = ["written"] * 6


def write_cases(root):
    cases = {}

    def path(name):
        return root / f"{name}.parquet"

    # A 1,271-byte file: 6 rows, a footer (file and row group) claiming 100,000.
    lying_parquet(path("claims_100000"), file_rows=100_000, group_rows=100_000)
    cases["claims_100000"] = SIX + ["read/inconsistent_metadata"]
    # The same claim at 2^40: work in proportion to it never ends.
    lying_parquet(path("claims_2_40"), file_rows=1 << 40, group_rows=1 << 40)
    cases["claims_2_40"] = SIX + ["read/inconsistent_metadata"]
    # The row group says 10, the file footer 6 (and the pages hold 6): "read 10 records, the file says 6".
    lying_parquet(path("group_says_10_file_6"), group_rows=10)
    cases["group_says_10_file_6"] = ["read/inconsistent_metadata"] + SIX + ["read/inconsistent_metadata"]
    # The row group says 3 over pages of 6: pyarrow gives 3; the column chunks' value counts say 6.
    lying_parquet(path("group_says_3_of_6"), group_rows=3)
    cases["group_says_3_of_6"] = ["read/inconsistent_metadata"] + ["written"] * 3 + ["read/inconsistent_metadata"]
    # A column chunk claiming 2^40 bytes: past the end of the file, checked before reading it.
    write_parquet(path("chunk_past_the_end"), good_rows("chunk_past_the_end", 6))
    set_chunk(path("chunk_past_the_end"), column=2, total_compressed_size=1 << 40)
    cases["chunk_past_the_end"] = ["read/unreadable_row_group"]
    # Source sizes that are no sizes: +inf, -inf and 1e300 (OverflowError in int()); NaN is unknown.
    rows = good_rows("non_finite", 6)
    for row, (width, height) in zip(rows, [(800.0, 600.0), (float("inf"), 600.0), (1e300, 600.0),
                                           (800.0, float("-inf")), (float("nan"), 600.0), (2.0**31, 600.0)]):
        row.update(original_width=width, original_height=height)
    write_parquet(path("non_finite"), rows)
    cases["non_finite"] = ["written", "read/bad_source_size", "read/bad_source_size", "read/bad_source_size",
                           "written", "read/bad_source_size"]
    # One row whose image is over the record cap, between good rows, in a row group of its own size.
    rows = good_rows("huge_cell", 4)
    rows[2]["jpg"] = b"\xff" * (TEST_LIMITS["max_record_bytes"] + 1)
    write_parquet(path("huge_cell"), rows)
    cases["huge_cell"] = ["written", "written", "read/too_large", "written"]
    return {name: (path(name), expected) for name, expected in cases.items()}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    cases = write_cases(tmp_path_factory.mktemp("parquet"))
    return cases, read_bounded([p for p, _ in cases.values()])


def check(outcome, name):
    cases, result = outcome
    path, expected = cases[name]
    got = result["files"][str(path)]
    assert fates(got) == expected, got.get("records", got)[:8]
    assert result["peak_rss"] < result["limit"]
    written = [record[1] for record in got["records"] if record[0] == "written"]
    return got["records"], written


@pytest.mark.parametrize("name, claim", [("claims_100000", 100_000), ("claims_2_40", 1 << 40)])
def test_footer_claiming_more_rows_than_its_pages_costs_one_record(outcome, name, claim):
    records, written = check(outcome, name)
    assert written == [good(name, i)[0] for i in range(6)]
    assert records[-1][2] == {"unread_records": claim - 6}  # the file's count reconciled: 6 read + the rest unread
    assert f"states {claim:,} rows, its pages hold 6" in records[-1][3]


def test_row_group_disagreeing_with_the_file_footer_does_not_stop_the_build(outcome):
    records, written = check(outcome, "group_says_10_file_6")
    assert len(written) == 6
    # file footer 6 = 6 read + 4 unread (row group) - 4 unstated (file vs row groups)
    assert records[0][2] == {"unread_records": 0, "unstated_records": 4}
    assert records[-1][2] == {"unread_records": 4}


def test_row_group_stating_fewer_rows_than_its_chunks_hold_says_so(outcome):
    records, written = check(outcome, "group_says_3_of_6")
    assert written == [good("group_says_3_of_6", i)[0] for i in range(3)]
    assert records[0][2] == {"unread_records": 3}  # the file footer's 6 = 3 read + 3 unread
    assert "column chunks 6 values" in records[-1][3]


def test_column_chunk_past_the_end_of_the_file_is_one_record(outcome):
    records, _ = check(outcome, "chunk_past_the_end")
    assert records[0][2] == {"unread_records": 6} and "past the end" in records[0][3]


def test_non_finite_and_huge_source_sizes_reject_their_row(outcome):
    check(outcome, "non_finite")


def test_cell_over_the_record_cap_rejects_its_row(outcome):
    records, _ = check(outcome, "huge_cell")
    assert records[2][1] == good("huge_cell", 2)[0]
