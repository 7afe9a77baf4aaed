"""A file that states rows it does not hold is named in the funnel's notes, on the console and in the report.

The funnel's input is what the files state (a footer claiming 2^40 rows over
6 makes it 2^40, one ``read/inconsistent_metadata`` record standing for the
rest); the ``read`` stage's note says which file claims them.
"""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from corpus_paths import committed
from pipeline.audit import auditor
from pipeline.build import launcher
from pipeline.funnel.stats_files import claims_note
from tests.hostile.parquet_footer import set_rows
from tests.pipeline.build.test_build_safety import QUICK
from tests.images import swatch as jpeg


def write_parquet(path, rows):
    pq.write_table(pa.table({"url": [f"https://e.x/{path.stem}/{i}.jpg" for i in range(rows)],
                             "caption": [f"a small test picture number {i}" for i in range(rows)],
                             "jpg": [jpeg(i) for i in range(rows)]}), path)


def test_a_footer_claiming_2_40_rows_is_named_in_the_funnel_on_the_console_and_in_the_report(tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_parquet(inputs / "honest.parquet", 3)
    lying = inputs / "lying.parquet"
    write_parquet(lying, 6)
    set_rows(lying, file_rows=1 << 40, group_rows=1 << 40)
    launcher.main(["--input", str(inputs / "*.parquet"), "--output", str(tmp_path / "out"), *QUICK])
    console = capsys.readouterr().out
    funnel = json.loads((committed(tmp_path / "out") / "stats" / "funnel.json").read_text())
    assert funnel["input"] == 3 + (1 << 40)
    (read,) = [row for row in funnel["stages"] if row["stage"] == "read"]
    claimed = f"{lying} ({(1 << 40) - 6:,})"
    assert claimed in read["note"] and "honest" not in read["note"], read["note"]
    assert claimed in console, console
    assert auditor.main([str(tmp_path / "out")]) == 0
    report = (committed(tmp_path / "out") / "stats" / "report.html").read_text()
    assert claimed in report


def test_the_note_names_the_largest_claims_and_counts_the_rest():
    assert claims_note((0, [])) == ""
    note = claims_note((5, [("b.parquet", 1 << 40), ("a.parquet", 10), ("c.parquet", 10)]))
    assert note == ("5 file(s) state rows they do not hold, counted in the input as read/inconsistent_metadata: "
                    "b.parquet (1,099,511,627,776), a.parquet (10), c.parquet (10) and 2 more")
