"""Pieces of the build job: pure functions without Beam, transforms with TestPipeline."""

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from common import schema
from common.histogram import HistogramFn
from common.schema import Candidate, make_key
from pipeline.funnel import counts as stats
from pipeline.readers.parquet import batch_to_records
from pipeline.readers.rows import Rejection
from pipeline.stages.light_rows import LightRow
from pipeline.stages.verdicts import JoinVerdicts, resolve_group
from pipeline.write import shards


def cand(url, caption, sha="a", ordinal=0):
    """A record that passed the per-record stages, as its light row."""
    return LightRow(make_key(url, caption), url, caption, "", True, sha, "", 300, 200, "JPEG", "part.parquet",
                    "parquet", ordinal)


def test_key_depends_on_url_and_caption_only():
    assert make_key("u", "c") == make_key("u", "c")
    assert make_key("u", "c") != make_key("u", "c ")
    assert make_key("ab", "c") != make_key("a", "bc")


def test_resolve_group_keeps_one_and_names_repeats():
    a, b = cand("u", "three word caption", sha="b"), cand("u", "three word caption", sha="a")
    keep, reject = resolve_group(a.key, [a, b], [])
    assert keep == [b] and reject == [(a, "duplicate_pair/repeat")]
    # Arrival order does not matter.
    assert resolve_group(a.key, [b, a], []) == (keep, reject)


def test_resolve_group_verdict_applies_to_all_and_earliest_stage_wins():
    a = cand("u", "three word caption")
    keep, reject = resolve_group(a.key, [a, a], ["rare_ngrams/rare_ngram", "images_per_text/shared_text"])
    assert keep == [] and [r for _, r in reject] == ["images_per_text/shared_text"] * 2


def test_join_verdicts_transform():
    a, b, c = cand("u1", "one two three"), cand("u2", "four five six"), cand("u3", "seven eight nine")
    with TestPipeline(runner="FnApiRunner") as p:
        survivors = p | "S" >> beam.Create([a, b, c, c])
        verdicts = p | "V" >> beam.Create([(b.key, "images_per_text/shared_text")])
        joined = (survivors, verdicts) | JoinVerdicts()
        written, rejected = joined["survivors"], joined["rejected"]
        assert_that(written | beam.Map(lambda r: r.key), equal_to([a.key, c.key]), label="written")
        assert_that(
            rejected | beam.Map(lambda r: (r.key, r.reason)),
            equal_to([(b.key, "images_per_text/shared_text"), (c.key, "duplicate_pair/repeat")]),
            label="rejected",
        )


def test_rows_missing_columns_or_bytes_are_rejected_with_reasons():
    table = pa.table({"url": ["a", "b", "c", "d"], "caption": ["x y z", None, "x y z", "x y z"],
                      "jpg": [b"img", b"img", None, b"img"], "status": ["success", "success", "success", "failed_to_download"]})
    (batch,) = table.to_batches()
    out = list(batch_to_records("f", batch, 1))
    assert isinstance(out[0], Candidate)
    assert [o.reason for o in out[1:]] == ["read/missing_caption", "read/no_image", "read/download_failed/failed_to_download"]
    no_caption = pa.table({"url": ["a"], "jpg": [b"img"]})
    (only,) = batch_to_records("f", no_caption.to_batches()[0], 1)
    assert isinstance(only, Rejection) and only.reason == "read/missing_column"


def test_funnel_conservation_and_order():
    funnel = stats.build_funnel(10, {"image_size/too_small": 3, "text/empty": 1}, {"train": 5, "validation": 1}, ["image_size"])
    assert funnel["conserved"] and funnel["rejected_total"] == 4
    rows = {row["stage"]: row for row in funnel["stages"]}
    assert rows["image_size"]["in"] == 10 and rows["image_size"]["out"] == 7 and rows["text"]["out"] == 6
    broken = stats.build_funnel(10, {"text/empty": 1}, {"train": 5}, [])
    assert not broken["conserved"]
    with pytest.raises(ValueError):
        stats.build_funnel(1, {"made_up/x": 1}, {}, [])


def test_split_and_ledger_file_are_functions_of_the_key():
    keys = [make_key(f"u{i}", "c") for i in range(20_000)]
    fraction = sum(schema.split_of(k, 0.05) == "validation" for k in keys) / len(keys)
    assert 0.04 < fraction < 0.06
    counts = [0] * 8
    for k in keys:
        counts[schema.shard_of(k, 8)] += 1
    assert max(counts) < 1.1 * len(keys) / 8


def test_shards_hold_at_most_the_bound_and_are_numbered_over_files_in_path_order():
    assert shards.chunk_sizes(2000, 2000) == [2000] and shards.chunk_sizes(2001, 2000) == [1001, 1000]
    assert shards.chunk_sizes(7, 3) == [3, 2, 2] and shards.chunk_sizes(0, 5) == []
    firsts, totals = shards.shard_plan([("b.parquet", "train", 5), ("a.parquet", "train", 2001),
                                        ("b.parquet", "validation", 1), ("c.parquet", "train", 1)], 2000)
    assert firsts == {"a.parquet": {"train": 0}, "b.parquet": {"train": 2, "validation": 0}, "c.parquet": {"train": 3}}
    assert totals == {"train": 4, "validation": 1}


def test_histogram_combine():
    fn = HistogramFn([0, 10, 100])
    acc = fn.create_accumulator()
    for v in [0, 5, 10, 99, 100, 1e9]:
        acc = fn.add_input(acc, v)
    assert fn.extract_output(fn.merge_accumulators([acc, acc]))["counts"] == [4, 4, 4]


def test_rows_between_stages_have_deterministic_schema_coders():
    from pipeline.stages.light_rows import HashRow

    for row in (cand("u", "three word caption"), HashRow("k", "ab" * 32, "")):
        coder = beam.coders.registry.get_coder(type(row))
        assert isinstance(coder, beam.coders.RowCoder) and coder.is_deterministic()
        decoded = coder.decode(coder.encode(row))
        assert type(decoded) is type(row) and decoded == row


def test_stages_run_come_from_the_stages_applied(tmp_path):
    from filters.frequency import stages_run as corpus_stages_run
    from pipeline.build.config import resolve
    from pipeline.build.graph import build_pipeline
    from pipeline.build.options import parse
    from pipeline.stages.judge import RECORD_STAGES
    from tests.pipeline.build.test_build_safety import write_candidates

    pattern = str(write_candidates(tmp_path / "in"))

    def graph(*overrides):
        config, _ = resolve(*parse(["--input", pattern, "--output", str(tmp_path / "out"), *overrides]))
        return config, build_pipeline(beam.Pipeline(runner="FnApiRunner"), config, {"nsfw": "a note"})

    align, ran = graph()
    assert ran.names == ["read", *RECORD_STAGES, "nsfw", *corpus_stages_run(align.preset), "duplicate_pair"]
    assert ran.notes == {"nsfw": "a note"}
    _, off = graph("--set", "nsfw_threshold=1.0", "--set", "dedup_in_corpus=true")
    assert "nsfw" not in off.names and off.names[-2:] == ["near_duplicate_corpus", "duplicate_pair"]
    _, cc12m = graph("--preset", "cc12m")
    assert "texts_per_image" not in cc12m.names and "rare_ngrams" in cc12m.names  # cc12m has no sharing limits
    assert off.notes["near_duplicate_corpus"].startswith("same sha256, same pHash, or embedding cosine > ")
