"""JoinVerdicts decides from a bounded per-key summary what resolve_group decides from the whole list."""

import collections
import random

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from common.schema import Candidate, make_key
from pipeline import verdicts as v
from pipeline.stage_rows import rejection
from pipeline.stats import SAMPLES_PER_REASON

URL, TEXT = "https://e.x/logo.png", "company logo"
KEY = make_key(URL, TEXT)


def repeat(i, rng):
    """A repeat of one (url, alt-text) pair: few distinct images, sizes and sources, so ties happen."""
    image = bytes([rng.randrange(4)]) * 10
    return Candidate(key=KEY, url=URL, alt_text=TEXT, image=image, sha256=f"sha{image[0]}", width=rng.choice([64, 80]),
                     height=48, format=rng.choice(["JPEG", "PNG"]), source=(("page", str(rng.randrange(3))),))


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
    rows = [rejection(r, reason) for r, reason, times in rejections for _ in range(times)]
    return kept, rows


@pytest.mark.parametrize("count", [1, 2, 5, SAMPLES_PER_REASON + 1, SAMPLES_PER_REASON + 2, 300])
@pytest.mark.parametrize("verdict", [None, "images_per_text/shared_text"])
def test_summary_gives_what_the_whole_list_gives(count, verdict):
    rng = random.Random(count)
    fn = v.RepeatSummary()
    for trial in range(5):
        records = [repeat(i, rng) for i in range(count)]
        keep, reject = v.resolve_group(KEY, list(records), [verdict] if verdict else [])
        summary = combine(list(records), rng, fn)
        assert summary[0] == count and len(summary[2]) <= SAMPLES_PER_REASON + 1  # bounded, whatever the count
        kept, rows = emitted(v.summary_rejections(summary, verdict))
        expected = sorted(rejection(r, reason) for r, reason in reject)
        assert (kept,) == tuple(keep) or (kept is None and keep == [])
        assert collections.Counter(r.reason for r in rows) == collections.Counter(r.reason for r in expected)
        # What the audit samples (the smallest per reason) and the ledger (key, reason, url) see is the same.
        assert sorted(rows)[:SAMPLES_PER_REASON] == expected[:SAMPLES_PER_REASON]
        assert {(r.key, r.reason, r.url) for r in rows} == {(r.key, r.reason, r.url) for r in expected}


def test_join_verdicts_on_a_pair_repeated_many_times():
    rng = random.Random(0)
    records = [repeat(i, rng) for i in range(500)]
    other = Candidate(key=make_key("u2", "t2"), url="u2", alt_text="t2", image=b"z", sha256="z")
    keep, _ = v.resolve_group(KEY, list(records), [])
    with TestPipeline(runner="FnApiRunner") as p:
        joined = (p | "Records" >> beam.Create(records + [other]),
                  p | "Verdicts" >> beam.Create([(other.key, "rare_ngrams/rare_ngram")] * 3)) | v.JoinVerdicts()
        assert_that(joined["survivors"], equal_to(keep), label="written")
        reasons = joined["rejected"] | beam.Map(lambda r: r.reason) | beam.combiners.Count.PerElement()
        assert_that(reasons, equal_to([("duplicate_pair/repeat", 499), ("rare_ngrams/rare_ngram", 1)]), label="why")
