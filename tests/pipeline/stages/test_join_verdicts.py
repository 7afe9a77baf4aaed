"""JoinVerdicts decides from a bounded per-key fate what resolve_group decides from the whole list."""

import collections
import random

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from common.schema import make_key
from filters import stages
from pipeline.stages import verdicts as v
from pipeline.stages.light_rows import LightRow, ngram_count_row, rejected, verdict_row
from pipeline.stages.verdicts import JoinVerdicts, resolve_group

URL, TEXT = "https://e.x/logo.png", "company logo"
KEY = make_key(URL, TEXT)


def row(key, url, text, sha256, width=64, fmt="JPEG", source="page-0.parquet", ordinal=0):
    return LightRow(key, url, text, "", True, sha256, "", width, 48, fmt, source, "parquet", ordinal)


def repeat(i, rng):
    """A repeat of one (url, alt-text) pair: few distinct images, sizes and places, so ties happen."""
    return row(KEY, URL, TEXT, f"sha{rng.randrange(4)}", rng.choice([64, 80]), rng.choice(["JPEG", "PNG"]),
               f"page-{rng.randrange(3)}.parquet", rng.randrange(5))


def combine(records, rng, fn):
    """The combine as a runner may run it: partial accumulators per bundle, merged in any order."""
    rng.shuffle(records)
    accs, i = [], 0
    while i < len(records):
        size = rng.randrange(1, 40)
        acc = fn.create_accumulator()
        for record in records[i:i + size]:
            acc = fn.add_input(acc, record)
        accs.append(acc)
        i += size
    rng.shuffle(accs)
    return fn.extract_output(fn.merge_accumulators(accs) if accs else fn.create_accumulator())


def emitted(kept_and_rejections):
    kept, rejections = kept_and_rejections
    rows = [rejected(r, reason) for r, reason, times in rejections for _ in range(times)]
    return kept, rows


@pytest.mark.parametrize("count", [1, 2, 3, 5, 300])
@pytest.mark.parametrize("verdict", [None, "images_per_text/shared_text"])
def test_fate_gives_what_the_whole_list_gives(count, verdict):
    rng = random.Random(count)
    fn = v.KeyFate()
    for trial in range(5):
        records = [repeat(i, rng) for i in range(count)]
        keep, reject = v.resolve_group(KEY, list(records), [verdict] if verdict else [])
        verdicts = [verdict_row(KEY, verdict)] * 3 if verdict else []
        fate = combine(list(records) + verdicts, rng, fn)
        # A count, two rows, a reason, the verdicts folded in, the stages that gave them and the lowest
        # n-gram count (none here), whatever the count.
        assert fate[0] == count and len(fate) == 7 and fate[4] == len(verdicts) and fate[6] == 0
        assert fate[5] == (1 << stages.STAGE_INDEX["images_per_text"] if verdict else 0)
        kept, rows = emitted(v.fate_rejections(fate))
        expected = [rejected(r, reason) for r, reason in reject]
        assert (kept,) == tuple(keep) or (kept is None and keep == [])
        assert collections.Counter(r.reason for r in rows) == collections.Counter(r.reason for r in expected)
        # The ledger (key, reason, url) sees the same; the audit shows the smallest row rejected.
        assert {(r.key, r.reason, r.url) for r in rows} == {(r.key, r.reason, r.url) for r in expected}
        assert min(rows, default=None) == (expected[0] if expected else None)


def test_join_verdicts_on_a_pair_repeated_many_times():
    rng = random.Random(0)
    records = [repeat(i, rng) for i in range(500)]
    other = row(make_key("u2", "t2"), "u2", "t2", "z")
    keep, _ = v.resolve_group(KEY, list(records), [])
    with TestPipeline(runner="FnApiRunner") as p:
        joined = (p | "Records" >> beam.Create(records + [other]),
                  p | "Verdicts" >> beam.Create([(other.key, "rare_ngrams/rare_ngram")] * 3)) | v.JoinVerdicts()
        assert_that(joined["survivors"], equal_to(keep), label="written")
        reasons = joined["rejected"] | beam.Map(lambda r: r.reason) | beam.combiners.Count.PerElement()
        assert_that(reasons, equal_to([("duplicate_pair/repeat", 499), ("rare_ngrams/rare_ngram", 1)]), label="why")


def test_the_fate_coder_round_trips_and_is_deterministic():
    rng = random.Random(1)
    coder = v.KeyFate().get_accumulator_coder()
    for fate in [(0, None, None, "", 0, 0, 0),
                 (3, repeat(0, rng), repeat(1, rng), "rare_ngrams/rare_ngram", 2, 1 << 13 | 1 << 11, 4)]:
        assert coder.decode(coder.encode(fate)) == fate
    assert coder.is_deterministic()


def test_the_fate_keeps_every_verdict_stage_and_the_lowest_ngram_count():
    """Whatever the order the rows arrive in: the stages that rejected the key, and its rarest n-gram's count."""
    rng = random.Random(2)
    rows = [repeat(i, rng) for i in range(4)] + [
        verdict_row(KEY, "rare_ngrams/rare_ngram"), verdict_row(KEY, "texts_per_image/too_many_texts"),
        ngram_count_row(KEY, 7), ngram_count_row(KEY, 3), ngram_count_row(KEY, 5)]
    fate = combine(rows, rng, v.KeyFate())
    assert v.first_of(fate[3]) == "texts_per_image/too_many_texts" and fate[4] == 2
    assert fate[5] == 1 << stages.STAGE_INDEX["texts_per_image"] | 1 << stages.STAGE_INDEX["rare_ngrams"]
    assert fate[6] == 3


def test_a_key_several_stages_reject_is_counted_under_the_first_and_reported_as_an_overlap():
    """The first stage in run order decides, whatever the arrival order; with ``overlaps`` the later ones are said."""
    rng = random.Random(2)
    fn = v.KeyFate()
    verdicts = ["rare_ngrams/rare_ngram", "model_score/outside_top_fraction", "images_per_text/shared_text",
                "near_duplicate_eval/b", "near_duplicate_eval/a"]
    for trial in range(20):
        records = [repeat(i, rng)._replace(model_score=0.125) for i in range(3)]
        fate = combine(records + [verdict_row(KEY, r) for r in verdicts * 2], rng, fn)
        assert fate[3] == ("model_score/outside_top_fraction|images_per_text/shared_text|rare_ngrams/rare_ngram|"
                           "near_duplicate_eval/a|near_duplicate_eval/b")
        assert {reason for _, reason, _ in v.fate_rejections(fate)[1]} == {"model_score/outside_top_fraction"}
    single = row(make_key("u2", "t2"), "u2", "t2", "z")._replace(model_score=0.5)
    with TestPipeline(runner="FnApiRunner") as p:
        joined = (p | "Records" >> beam.Create(records + [single]),
                  p | "Verdicts" >> beam.Create([(KEY, r) for r in verdicts] + [(single.key, "rare_ngrams/rare_ngram")])
                  ) | v.JoinVerdicts(overlaps=True)
        assert_that(joined[v.OVERLAPS], equal_to([(
            "model_score/outside_top_fraction",
            ("images_per_text/shared_text", "rare_ngrams/rare_ngram", "near_duplicate_eval/a", "near_duplicate_eval/b"),
            0.125, 3)]))


def cand(url, caption, sha="a", ordinal=0):
    """A record that passed the per-record stages, as its light row."""
    return LightRow(make_key(url, caption), url, caption, "", True, sha, "", 300, 200, "JPEG", "part.parquet",
                    "parquet", ordinal)


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
