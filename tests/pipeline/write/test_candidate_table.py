"""The candidate table: one row per input record with its facts and fate, as plain Parquet inside the version.

A tiny real build (planted fates: a repeat pair, a short caption, a small
picture) checks the rules row by row and the reading back of a written
record from its shard and offset; the sample build checks conservation
against its funnel. The fate rules and the publication's checks are also
tested on their own, without Beam.
"""

import glob
import json
import math

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import tfrecord_io
from common.corpus_dir import resolve
from pipeline.build import launcher
from pipeline.funnel import candidate_counts
from pipeline.stages.light_rows import LightRow
from pipeline.stages.verdicts import REPEAT
from pipeline.write import candidate_table
from pipeline.write.candidate_table import _entries, _KeyDecision, read_table, table_row
from tests import images as made
from tests.pipeline.build.test_build_safety import QUICK


def photo(seed, side=256):
    return made.noise(seed, (side, side), cells=(side // 16, side // 16), quality=90)


PLANTED = [  # (url, caption, picture seed, side, the fate the table must give)
    ("https://e.x/0.jpg", "a red bicycle leaning on a wall", 0, 256, "written"),
    ("https://e.x/1.jpg", "two dogs running on a sandy beach", 1, 256, "written"),
    ("https://e.x/2.jpg", "a bowl of fresh green apples", 2, 256, "written"),
    ("https://e.x/2.jpg", "a bowl of fresh green apples", 2, 256, REPEAT),
    ("https://e.x/3.jpg", "a lighthouse on a rocky coast at dusk", 3, 24, "image_size/too_small"),
    ("https://e.x/4.jpg", "a wooden table with three chairs", 4, 256, "written"),
]


def write_planted(directory):
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "url": [p[0] for p in PLANTED], "caption": [p[1] for p in PLANTED],
        "jpg": [photo(p[2], p[3]) for p in PLANTED],
    }), directory / "part-0.parquet")
    return directory / "*.parquet"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    pattern = write_planted(root / "in")
    launcher.run(["--input", str(pattern), "--output", str(root / "corpus"), *QUICK])
    return resolve(str(root / "corpus"))


def test_the_planted_fates(planted):
    table = read_table(planted).to_pandas()
    assert list(table.columns) == candidate_table.SCHEMA.names
    assert len(table) == len(PLANTED)
    for (url, caption, _, _, fate), (_, row) in zip(PLANTED, table.sort_values("ordinal").iterrows()):
        assert (row["url"], row["text"]) == (url, caption)
        got = "written" if pd.notna(row["split"]) else row["reason"]
        assert got == fate, (url, got)
        assert row["words"] == len(caption.split())
    assert table["source"].nunique() == 1 and sorted(table["ordinal"]) == list(range(len(PLANTED)))


def test_a_written_row_names_its_record_in_its_shard(planted):
    table = read_table(planted).to_pandas()
    written = table[table["split"].notna()]
    assert len(written) == sum(p[4] == "written" for p in PLANTED)
    for _, row in written.iterrows():
        with open(f"{planted}/{row['shard']}", "rb") as handle:
            handle.seek(int(row["offset"]))
            example = tfrecord_io.decode_example(next(tfrecord_io.read_frames(handle)), names=("key",))
        assert bytes(example["key"][0]).decode() == row["key"]


def test_the_summary_accounts_for_the_funnel_and_the_files(planted):
    summary = json.loads(open(f"{planted}/{candidate_counts.SUMMARY_FILE}").read())
    funnel = json.loads(open(f"{planted}/stats/funnel.json").read())
    assert candidate_counts.table_problems(summary, funnel) == []
    listed = {f"{candidate_counts.CANDIDATES_DIR}/{p.rsplit('/', 1)[1]}": len(open(p, "rb").read())
              for p in glob.glob(f"{planted}/{candidate_counts.CANDIDATES_DIR}/*.parquet")}
    assert candidate_counts.file_problems(summary, listed) == []
    # plain Parquet: any tool reads the directory as one table
    assert len(pd.read_parquet(f"{planted}/{candidate_counts.CANDIDATES_DIR}")) == len(PLANTED)


def test_the_publication_checks_find_a_lost_row_a_wrong_fate_and_a_changed_file():
    funnel = {"input": 3, "written": {"train": 2}, "stages": [{"rejected": {"text/empty": 1}}]}
    summary = {"rows": 3, "fates": {"train": 2, "text/empty": 1},
               "files": {"stats/candidates/part-00000-of-00001.parquet": {"rows": 3, "bytes": 10}}}
    assert candidate_counts.table_problems(summary, funnel) == []
    assert len(candidate_counts.table_problems({**summary, "rows": 2}, funnel)) == 1
    assert "text/empty" in candidate_counts.table_problems({**summary, "fates": {"train": 3}}, funnel)[0]
    assert candidate_counts.table_problems(None, funnel)
    assert candidate_counts.file_problems(summary, {"stats/candidates/part-00000-of-00001.parquet": 10}) == []
    assert "9 bytes" in candidate_counts.file_problems(summary, {"stats/candidates/part-00000-of-00001.parquet": 9})[0]
    assert "missing" in candidate_counts.file_problems(summary, {})[0]


def row(key, ordinal, reason="", **fields):
    return LightRow(key, "https://e.x/" + key, "a caption of five words", reason, True, "s" * 64, "p" * 16, 64, 64,
                    "JPEG", "in.parquet", "parquet", ordinal, **fields)


def test_each_row_gets_its_fate():
    rows = [row("a", 3, "text/empty"), row("b", 0), row("c", 1), row("c", 2)]
    written = [("b", 0, "train", "x-train.tfrecord-00000-of-00001", 0)]
    late = [(1, "c", "read/source_changed")]
    entries = list(_entries(rows, written, late))
    assert [records for _, records in entries] == [1, 1, 1, 1]  # none is a reader's marker of unread rows
    got = {(e["key"], e["ordinal"]): (e["split"], e["reason"], e["shard"], e["offset"]) for e, _ in entries}
    assert got == {("a", 3): (None, "text/empty", None, None), ("b", 0): ("train", None, written[0][3], 0),
                   ("c", 1): (None, "read/source_changed", None, None), ("c", 2): (None, REPEAT, None, None)}


def test_a_key_takes_the_first_verdict_in_run_order_and_the_lowest_count():
    decide = _KeyDecision()
    assert decide([("duplicate_pair/repeat", 0), ("", 7), ("texts_per_image/too_many", 0), ("", 3)]) == (
        "texts_per_image/too_many", 3)
    assert decide([("", 5)]) == ("", 5)
    assert decide([decide([("rare_ngrams/rare", 0)]), decide([("images_per_text/too_many", 0)])])[0] == (
        "images_per_text/too_many")


def test_a_row_is_bounded_and_measured_on_the_whole_text():
    long = " ".join(["word"] * 5000)
    entry = table_row(row("k", 0, "text/too_long_chars")._replace(text=long, url="https://e.x/" + "a" * 9000),
                      )
    assert len(entry["text"]) == candidate_table.MAX_CHARS and len(entry["url"]) == candidate_table.MAX_CHARS
    assert entry["words"] == 5000 and entry["repetition"] == pytest.approx(4999 / 5000)
    assert entry["nsfw_score"] is None and entry["model_score"] is None
    scored = table_row(row("k", 0)._replace(nsfw_score=0.25, model_score=-math.inf), "train", "s", 7)
    assert (scored["nsfw_score"], scored["model_score"], scored["offset"], scored["reason"]) == (0.25, None, 7, None)
    pa.Table.from_pylist([entry, scored], schema=candidate_table.SCHEMA)  # the schema takes both


def test_the_sample_table_holds_one_row_per_input_record(sample_build):
    version, funnel = sample_build
    table = read_table(str(version))
    summary = json.loads((version / candidate_counts.SUMMARY_FILE).read_text())
    assert table.num_rows == funnel["input"] == summary["rows"]
    assert candidate_table.fates(table) == candidate_counts.funnel_fates(funnel)
    assert table.column("key").null_count == 0
    assert summary["bytes"] / summary["rows"] < candidate_table.ROW_BOUND_BYTES


def test_a_measure_keeps_the_precision_its_rule_compared():
    """"a cat on a mat" repeats 1 word of 5: 0.2 exactly, so a where at the rule's threshold keeps it as the rule did."""
    entry = table_row(row("k", 0)._replace(text="a cat on a mat"), "train", "s", 0)
    table = pa.Table.from_pylist([entry], schema=candidate_table.SCHEMA)
    assert table.column("repetition")[0].as_py() == 0.2  # as a SQL tool or pandas in float64 reads it
    assert table.to_pandas()["repetition"].astype("float64").le(0.2).all()
