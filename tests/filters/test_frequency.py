"""Whole-corpus frequency filters: pure pieces without Beam, composites with TestPipeline."""

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from common.histogram import HistogramFn, close_last_bin
from filters import extra_stages, frequency, ngram_vocab
from filters.frequency import (
    RARE_NGRAM, SHARED_TEXT, TOO_MANY_TEXTS, ApplyCorpusFilters, CappedDistinctCountFn,
    image_identity, log2_edges, text_identity)
from filters.ngram_vocab import vocabulary_cut
from filters.presets import get_preset

def row(key, text, image=None, sha256=None):
    """A CorpusRow; by default every record is its own image."""
    return (key, sha256 or f"sha-{image or key}", f"ph-{image or key}", text)


def preset(name="align", **values):
    values.setdefault("max_texts_per_image", 2)
    values.setdefault("max_images_per_text", 2)
    if name == "align":
        values.setdefault("vocab_size", 0)
    return get_preset(name, **values)


def counted(*texts, prefix="e"):
    """Rows of the counting pool that an earlier stage rejected, each its own image."""
    return [row(f"{prefix}{i}", text) for i, text in enumerate(texts)]


def run(survivors, counted_only, preset_, **kw):
    """Run the composite; returns (pipeline, outputs) for assert_that before ``p.run()``."""
    p = TestPipeline(runner="FnApiRunner")
    out = {
        "survivors": p | "Survivors" >> beam.Create(survivors),
        "counted_only": p | "CountedOnly" >> beam.Create(counted_only),
    } | ApplyCorpusFilters(preset_, **kw)
    return p, out


def assert_rejected(survivors, counted_only, preset_, expected, **kw):
    p, out = run(survivors, counted_only, preset_, **kw)
    assert_that(out["rejected"], equal_to(expected))
    result = p.run()
    result.wait_until_finish()
    return result


# ---------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------


def test_text_identity_normalises_and_casefolds():
    assert text_identity("  Alt\u200bIMG  ") == text_identity("alt img") == "alt img"
    assert text_identity("STRASSE") == text_identity("straße")
    assert text_identity("alt img") != text_identity("alt-img")


def test_image_identity_by_phash_sha256_and_fallbacks():
    r = ("k", "s" * 64, "p" * 16, "t")
    assert image_identity(r, "phash") == "p" * 16
    assert image_identity(r, "sha256") == "s" * 64
    assert image_identity(("k", "s" * 64, "", "t"), "phash") == "s" * 64
    assert image_identity(("k", "", "", "t"), "phash") == "key:k"
    assert image_identity(("k", "", "", "t"), "sha256") == "key:k"


@pytest.mark.parametrize("limit, edges", [
    (10, [1, 2, 4, 8, 11, 12]),
    (1000, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1001, 1002]),
    (7, [1, 2, 4, 8, 9]),   # limit + 1 is a power of two: no repeated edge
    (0, [1, 2]),
])
def test_log2_edges_end_with_an_over_the_limit_bin(limit, edges):
    assert log2_edges(limit) == edges
    # The combiner the filter uses: a count over the limit lands in the last bin, 1 in the first.
    fn = HistogramFn(edges[:-1])
    acc = fn.create_accumulator()
    for value in (1, limit + 1):
        acc = fn.add_input(acc, value)
    histogram = close_last_bin(fn.extract_output(acc), edges[-1])
    assert histogram["edges"] == edges and len(histogram["counts"]) == len(edges) - 1
    assert histogram["counts"][0] >= 1 and histogram["counts"][-1] >= 1 and sum(histogram["counts"]) == 2


def test_capped_distinct_count_saturates_at_cap_across_merges():
    fn = CappedDistinctCountFn(3)
    a = fn.add_input(fn.add_input(fn.create_accumulator(), "x"), "y")
    b = fn.add_input(fn.add_input(fn.create_accumulator(), "y"), "z")
    assert fn.extract_output(fn.merge_accumulators([a, b])) == 3
    c = fn.add_input(fn.create_accumulator(), "x")
    assert fn.extract_output(fn.merge_accumulators([a, c])) == 2  # duplicates do not count
    many = fn.create_accumulator()
    for v in "abcdefg":
        many = fn.add_input(many, v)
    assert fn.extract_output(many) == 3 and len(many) == 3
    assert fn.extract_output(fn.merge_accumulators([many, a, b])) == 3


@pytest.mark.parametrize("vocab_size, min_count, cut", [
    (1, 0, 9),      # the single most frequent
    (2, 0, 5),      # 2nd largest count is 5, shared by three n-grams: all three kept
    (4, 0, 5),
    (5, 0, 2),
    (7, 0, 1),      # exactly as many n-grams as K
    (100, 0, 1),    # fewer n-grams than K: all kept
    (0, 5, 5),
    (0, 6, 6),
    (2, 6, 6),      # both rules: the stricter holds
    (5, 3, 3),
    (0, 0, 0),      # disabled
])
def test_vocabulary_cut_walks_count_of_counts_from_the_top(vocab_size, min_count, cut):
    count_of_counts = {9: 1, 5: 3, 2: 2, 1: 1}
    assert vocabulary_cut(count_of_counts, vocab_size, min_count) == cut


def test_vocabulary_cut_of_an_empty_corpus():
    assert vocabulary_cut({}, 10, 0) == 1
    assert vocabulary_cut({}, 0, 20) == 20


def test_count_of_counts_summary_is_exact_when_small_and_log2_when_large():
    p = preset(vocab_size=3)
    small = ngram_vocab.count_of_counts_summary({1: 4, 3: 2, 10: 1}, 3, p)
    assert small["counts"] == {"1": 4, "3": 2, "10": 1} and small["bucketing"] == "exact"
    assert (small["cut_count"], small["vocab_size"], small["num_ngrams"], small["num_occurrences"]) == (3, 3, 7, 20)
    large = ngram_vocab.count_of_counts_summary({c: 1 for c in range(1, 101)}, 50, p)
    assert large["bucketing"] == "log2"
    assert large["counts"] == {"1": 1, "2": 2, "4": 4, "8": 8, "16": 16, "32": 32, "64": 37}
    assert large["vocab_size"] == 51 and large["num_ngrams"] == 100


def test_ngram_record_pairs_are_distinct_and_skip_known_frequent():
    pairs = set(ngram_vocab.ngram_record_pairs(("k", "s", "p", "a cat and a cat"), {"a"}))
    assert pairs == {(g, "k") for g in ["cat", "and", "a cat", "cat and", "and a"]}
    words = set(ngram_vocab.ngram_record_pairs(("k", "s", "p", "a cat and a cat"), {"a"}, max_order=1))
    assert words == {(g, "k") for g in ["cat", "and"]}
    assert len(list(ngram_vocab.ngram_record_pairs(("k", "s", "p", "a a a")))) == 2


def test_unknown_image_identity_is_refused():
    with pytest.raises(ValueError):
        ApplyCorpusFilters(preset(image_identity="md5"))


# ---------------------------------------------------------------------------
# texts_per_image and images_per_text (one small corpus per identity: the
# cases use disjoint images and alt-texts, so they cannot interfere)
# ---------------------------------------------------------------------------

SHARING_CASES = [
    # texts_per_image, limit 2
    row("o1", "red car", "over"), row("o2", "blue car", "over"), row("o3", "red car blue car", "over"),
    row("a1", "green car", "at"), row("a2", "green bus", "at"),
    # 3 records, 2 alt-texts after normalisation + casefold
    row("c1", "white van", "case"), row("c2", "WHITE  van", "case"), row("c3", "white\u200bvan lorry", "case"),
    # 3 texts on one picture: 2 on one file, 1 on a re-encoded copy
    row("x1", "old boat", "pic", sha256="file-1"), row("x2", "old ship", "pic", sha256="file-1"),
    row("x3", "old raft", "pic", sha256="file-2"),
    # images_per_text, limit 2: one text on 3 images (in 3 spellings)
    row("s1", "alt img"), row("s2", "Alt IMG"), row("s3", "alt  img"),
    # on 2 images: at the limit
    row("t1", "click here"), row("t2", "click here"),
    # on 3 files that are 2 pictures
    row("d1", "thumbnail", "twin", "f1"), row("d2", "thumbnail", "twin", "f2"), row("d3", "thumbnail"),
    # on 3 images, one of them crowded (3 texts > 2): each count sees every
    # row of the pool, so the text is still shared by 3 images
    row("k0", "no description", "crowded"), row("k1", "tall tree", "crowded"), row("k2", "short tree", "crowded"),
    row("k3", "no description"), row("k4", "no description"),
    # on 2 judged images + 1 rejected earlier (too small): 3 images in the raw pool
    row("m1", "wooden fence"), row("m2", "wooden fence"),
    # 2 texts on a judged image + 1 on a row of it rejected earlier
    row("p1", "blue door", "painted"), row("p2", "red door", "painted"),
    # the same record read twice counts once, and is reported once
    row("r1", "untitled", "same"), row("r1", "untitled", "same"), row("r2", "untitled"),
]
SHARING_COUNTED_ONLY = [row("m3", "wooden fence"), row("p3", "green door", "painted")]
SHARING_EXPECTED = {
    # identity: (rejected by texts_per_image, by images_per_text)
    "phash": ("o1 o2 o3 x1 x2 x3 k0 k1 k2".split(), "s1 s2 s3 k3 k4".split()),
    "sha256": ("o1 o2 o3 k0 k1 k2".split(), "s1 s2 s3 d1 d2 d3 k3 k4".split()),
}


@pytest.mark.parametrize("identity", ["phash", "sha256"])
def test_texts_per_image_and_images_per_text_over_the_survivors(identity):
    too_many, shared = SHARING_EXPECTED[identity]
    assert_rejected(SHARING_CASES, [], preset(image_identity=identity, counting_base="survivors"),
                    [(k, TOO_MANY_TEXTS) for k in too_many] + [(k, SHARED_TEXT) for k in shared])


@pytest.mark.parametrize("identity", ["phash", "sha256"])
def test_rows_rejected_earlier_count_under_the_raw_base(identity):
    """An alt-text on 3 images, one of them too small, is shared by 3 (limit 2): dropped."""
    too_many, shared = SHARING_EXPECTED[identity]
    assert_rejected(SHARING_CASES, SHARING_COUNTED_ONLY, preset(image_identity=identity),
                    [(k, TOO_MANY_TEXTS) for k in too_many + ["p1", "p2"]]
                    + [(k, SHARED_TEXT) for k in shared + ["m1", "m2"]])


def test_align_alt_text_on_11_images_one_too_small_is_dropped_under_the_raw_base():
    survivors = [row(f"i{i}", "vintage poster print") for i in range(10)]
    small = [row("small", "vintage poster print")]
    align = get_preset("align", vocab_size=0)
    assert (align.max_images_per_text, align.counting_base) == (10, "raw")
    assert_rejected(survivors, small, align, [(f"i{i}", SHARED_TEXT) for i in range(10)])
    assert_rejected(survivors, [], align, [])


def test_cc12m_runs_no_sharing_limit():
    survivors = [row(f"i{i}", "vintage poster print") for i in range(12)]
    survivors += [row(f"t{i}", f"poster {i} vintage print", "placeholder") for i in range(1001)]
    p = get_preset("cc12m", min_ngram_count=0)
    assert frequency.stages_run(p) == ["rare_ngrams"]
    p_, out = run(survivors, [], p)
    assert_that(out["rejected"], equal_to([]), label="rejected")
    assert_that(out["stats"] | beam.Keys(), equal_to(["count_of_counts"]), label="stats")
    p_.run().wait_until_finish()


def test_texts_per_image_at_the_real_align_limit():
    survivors = [row(f"o{i}", f"car {i}", "over") for i in range(1001)]
    survivors += [row(f"a{i}", f"car {i}", "at") for i in range(1000)]
    p = get_preset("align", vocab_size=0)
    assert p.max_texts_per_image == 1000
    assert_rejected(survivors, [], p, [(f"o{i}", TOO_MANY_TEXTS) for i in range(1001)])


# ---------------------------------------------------------------------------
# rare_ngrams
# ---------------------------------------------------------------------------


def test_min_ngram_count_counts_occurrences_over_the_pool():
    # With the survivors' own texts: common 4, word 3, "common word" 3,
    # zebra 3, "common zebra" 1, okapi 2; "moa" occurs 4 times and "moa moa"
    # 3 times, but all in one text; "kiwi" is in one survivor but 3 pool rows.
    others = counted("common word", "common word", "zebra", "okapi", "kiwi", "kiwi")
    survivors = [
        row("z", "zebra"), row("o", "okapi"), row("c", "common word"),
        row("m", "common zebra"),   # two frequent unigrams, but a bigram seen 0 times
        row("moa", "moa moa moa moa"), row("kiwi", "kiwi"),
        row("punct", "!!! ???"),    # no n-grams: none outside the vocabulary
    ]
    assert_rejected(survivors, others, preset("align", min_ngram_count=3, max_images_per_text=0),
                    [("o", RARE_NGRAM), ("m", RARE_NGRAM)])
    # cc12m counts word types only: the unseen pair "common zebra" is no rare word.
    assert_rejected(survivors, others, preset("cc12m", min_ngram_count=3, max_images_per_text=0), [("o", RARE_NGRAM)])


def test_cc12m_word_type_seen_19_times_is_rare_and_20_times_is_not():
    survivors = [row("w19", "kestrel photo of a dog"), row("w20", "osprey photo of a dog"),
                 row("pair", "dog photo")]  # an unseen pair of common words: not a word type
    # kestrel 19 occurrences, osprey 20, in the whole pool (judged rows included)
    others = counted(*(["kestrel"] * 18 + ["osprey"] * 19 + ["photo of a dog"] * 20))
    assert_rejected(survivors, others, get_preset("cc12m"), [("w19", RARE_NGRAM)])


@pytest.mark.parametrize("frequent_ngrams, hot_key_fanout", [(0, 0), (1, 8), (10_000, 2)])
def test_vocab_size_keeps_every_ngram_tied_at_the_cut(frequent_ngrams, hot_key_fanout):
    # counts: car 7, red 4, blue 4, "red car" 4, "blue car" 2, green 1, "green car" 1
    # pool: "red car" 4, "blue car" 2, "blue" 2, "green car" 1
    others = counted("red car", "red car", "red car", "blue car", "blue")
    survivors = [row("r", "red car"), row("b", "blue"), row("bc", "blue car"), row("g", "green car")]
    # K=2: the 2nd largest count is 4, held by red, blue and "red car": all kept.
    assert_rejected(survivors, others, preset(vocab_size=2, max_images_per_text=0), [("bc", RARE_NGRAM), ("g", RARE_NGRAM)],
                    frequent_ngrams=frequent_ngrams, hot_key_fanout=hot_key_fanout)


def test_vocab_size_and_min_count_both_hold():
    others = counted("red car", "red car", "red car", "blue car", "blue")
    survivors = [row("r", "red car"), row("b", "blue"), row("bc", "blue car"), row("g", "green car")]
    # top 5 alone would keep "blue car" (count 2); count >= 3 does not.
    assert_rejected(survivors, others, preset(vocab_size=5, min_ngram_count=3, max_images_per_text=0),
                    [("bc", RARE_NGRAM), ("g", RARE_NGRAM)])


def test_ngram_rule_disabled_when_neither_vocab_size_nor_min_count():
    p = preset(vocab_size=0, min_ngram_count=0)
    p_, out = run([row("x", "unseen words")], [], p)
    assert_that(out["rejected"], equal_to([]), label="rejected")
    assert_that(out["stats"] | beam.Keys(), equal_to(["count_of_counts", "texts_per_image", "images_per_text"]),
                label="stats")
    p_.run().wait_until_finish()


# ---------------------------------------------------------------------------
# Whole transform: first stage wins, stats, metrics, labels
# ---------------------------------------------------------------------------


def test_first_stage_wins_and_each_key_is_reported_once():
    survivors = [
        # over-captioned image whose texts are also shared and rare
        row("a1", "alt img qqq", "crowded"), row("a2", "xyzzy", "crowded"), row("a3", "plugh", "crowded"),
        row("b1", "alt img qqq"), row("b2", "alt img qqq"), row("b3", "alt img qqq"),  # shared, and rare
        row("c1", "zork one"),  # only rare
    ]
    # "alt img qqq" 4 times: rare below 5
    p = preset("cc12m", min_ngram_count=5)
    assert_rejected(survivors, [], p, [
        ("a1", TOO_MANY_TEXTS), ("a2", TOO_MANY_TEXTS), ("a3", TOO_MANY_TEXTS),
        ("b1", SHARED_TEXT), ("b2", SHARED_TEXT), ("b3", SHARED_TEXT),
        ("c1", RARE_NGRAM)])


def test_stats_and_metrics():
    survivors = [
        row("o1", "red car", "over"), row("o2", "blue car", "over"), row("o3", "green car", "over"),
        row("s1", "alt img"), row("s2", "alt img"), row("s3", "alt img"),
        row("k1", "red car"),
    ]
    p = preset(vocab_size=3)
    pipeline, out = run(survivors, counted("alt img"), p)
    # pool images: over (3 texts: capped 3 = "over 2"), 5 others with 1 text each
    # pool texts: "alt img" on 4 images (capped 3), "red car" on 2, "blue car" and "green car" on 1
    # n-gram counts: car 4, alt 4, img 4, "alt img" 4; red 2, "red car" 2; blue, green and bigrams 1
    assert_that(out["stats"], equal_to([
        ("texts_per_image", {"edges": [1, 2, 3, 4], "counts": [5, 0, 1]}),
        ("images_per_text", {"edges": [1, 2, 3, 4], "counts": [2, 1, 1]}),
        ("count_of_counts", {
            "counts": {"1": 4, "2": 2, "4": 4}, "bucketing": "exact", "cut_count": 4, "vocab_size": 4,
            "vocab_size_limit": 3, "min_ngram_count": 0, "num_ngrams": 10, "num_occurrences": 24}),
    ]))
    result = pipeline.run()
    result.wait_until_finish()
    metrics = result.metrics().query(MetricsFilter().with_namespace("filters"))
    counters = {c.key.metric.name: c.committed for c in metrics["counters"]}
    assert counters == {TOO_MANY_TEXTS: 3, SHARED_TEXT: 3, RARE_NGRAM: 1}
    dists = {d.key.metric.name: d.committed for d in metrics["distributions"]}
    assert (dists["texts_per_image"].count, dists["texts_per_image"].max) == (6, 3)
    assert (dists["images_per_text"].count, dists["images_per_text"].sum) == (4, 7)


def test_empty_corpus():
    p_, out = run([], [], preset(vocab_size=10))
    assert_that(out["rejected"], equal_to([]), label="rejected")
    assert_that(out["stats"], equal_to([
        ("texts_per_image", {"edges": [1, 2, 3, 4], "counts": [0, 0, 0]}),
        ("images_per_text", {"edges": [1, 2, 3, 4], "counts": [0, 0, 0]}),
        ("count_of_counts", {"counts": {}, "bucketing": "exact", "cut_count": 1, "vocab_size": 0,
                             "vocab_size_limit": 10, "min_ngram_count": 0, "num_ngrams": 0, "num_occurrences": 0}),
    ]), label="stats")
    p_.run().wait_until_finish()


def test_label_prefix_lets_two_instances_share_a_pipeline():
    p = TestPipeline(runner="FnApiRunner")
    inputs = {"survivors": p | "S" >> beam.Create([row("a", "alt img"), row("b", "alt img")]),
              "counted_only": p | "T" >> beam.Create([])}
    strict = inputs | "Strict" >> ApplyCorpusFilters(preset(max_images_per_text=1), label_prefix="strict_")
    loose = inputs | "Loose" >> ApplyCorpusFilters(preset(), label_prefix="loose_")
    assert_that(strict["rejected"], equal_to([("a", SHARED_TEXT), ("b", SHARED_TEXT)]), label="strict")
    assert_that(loose["rejected"], equal_to([]), label="loose")
    p.run().wait_until_finish()


# ---------------------------------------------------------------------------
# Extra corpus stages (filters.extra_stages.CorpusStage)
# ---------------------------------------------------------------------------


def first_word(view):
    """Groups alt-texts by their first word; texts of one word are in no group."""
    words = view.text.split()
    return words[0].casefold() if len(words) > 1 else None


FIRST_WORD = extra_stages.CorpusStage("first_word", after="images_per_text", group=first_word,
                                      counts="texts", max_count=2, reason="crowded")
LATE = extra_stages.CorpusStage("late", after="rare_ngrams", group=first_word,
                                counts="images", max_count=1, reason="shared")


def test_extra_corpus_stage_counts_the_raw_pool_and_takes_its_place_in_the_order():
    survivors = [row("a1", "red car"), row("a2", "red door"), row("b1", "blue car"), row("c1", "solo")]
    # a third text starting with "red" on a row rejected earlier: counted under the raw base
    small = [row("s1", "red fence")]
    rejected = [("a1", "first_word/crowded"), ("a2", "first_word/crowded")]
    assert_rejected(survivors, small, preset(), rejected, extras=(FIRST_WORD,))
    assert_rejected(survivors, [], preset(), [], extras=(FIRST_WORD,))  # the survivors base sends no small rows
    # "red" is on 3 images (> 1) for LATE too: the earlier extra wins for a1/a2
    assert_rejected(survivors, small, preset(), rejected, extras=(LATE, FIRST_WORD))
    assert frequency.stages_run(preset(), (LATE, FIRST_WORD)) == [
        "texts_per_image", "images_per_text", "first_word", "rare_ngrams", "late"]


def test_extra_corpus_stage_reasons_are_counted_like_built_in_ones():
    survivors = [row("a1", "red car"), row("a2", "red door"), row("a3", "red hat")]
    result = assert_rejected(survivors, [], preset(), [(k, "first_word/crowded") for k in ("a1", "a2", "a3")],
                             extras=(FIRST_WORD,))
    counters = result.metrics().query(MetricsFilter().with_name("first_word/crowded"))["counters"]
    assert sum(c.committed for c in counters) == 3


def test_bad_corpus_stage_definitions_are_refused_in_one_line():
    with pytest.raises(ValueError, match="after must be one of images_per_text, rare_ngrams"):
        extra_stages.CorpusStage("x", after="text", group=first_word, counts="images", max_count=1, reason="r")
    with pytest.raises(ValueError, match="counts must be one of images, texts"):
        extra_stages.CorpusStage("x", after="rare_ngrams", group=first_word, counts="words", max_count=1, reason="r")
    with pytest.raises(ValueError, match="max_count must be an integer >= 1"):
        extra_stages.CorpusStage("x", after="rare_ngrams", group=first_word, counts="texts", max_count=0, reason="r")
    with pytest.raises(ValueError, match="built-in"):
        extra_stages.CorpusStage("nsfw", after="rare_ngrams", group=first_word, counts="texts", max_count=1, reason="r")
    odd = extra_stages.CorpusStage("odd", after="rare_ngrams", group=lambda view: 7, counts="texts", max_count=1, reason="r")
    with pytest.raises(ValueError, match="group returned int"):
        odd.group_of(extra_stages.CorpusView("k", "a text", "img"))


@pytest.mark.parametrize("max_group_rows", [2, 1000])
def test_hot_groups_get_their_verdict_without_being_one_list(max_group_rows):
    """A caption on 40 images and an image under 30 captions: the same verdicts, groups of at most max_group_rows rows."""
    survivors = [row(f"t{i:02d}", "click here to enlarge", image=f"img{i}") for i in range(40)]
    survivors += [row(f"p{i:02d}", f"placeholder number {i} here", image="placeholder") for i in range(30)]
    survivors += [row("ok1", "a red bicycle"), row("ok2", "a red bicycle")]
    expected = [(f"t{i:02d}", SHARED_TEXT) for i in range(40)] + [(f"p{i:02d}", TOO_MANY_TEXTS) for i in range(30)]
    result = assert_rejected(survivors, [], preset(max_texts_per_image=5, max_images_per_text=5),
                             expected, max_group_rows=max_group_rows)
    grouped = {d.key.metric.name: d.committed for d in result.metrics().query(
        MetricsFilter().with_namespace("hot_keys"))["distributions"]}
    assert max((d.max for d in grouped.values()), default=0) <= max_group_rows
