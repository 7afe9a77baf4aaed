"""The rare n-gram filter: an n-gram vocabulary over all raw alt-texts, joined.

ALIGN section 3 drops alt-texts that contain "any rare token (outside of 100
million most frequent unigrams and bigrams from the raw dataset)"; CC12M
section 2 counts a word type as rare below 20 occurrences. Both are one rule
here:

- **What is counted.** The n-grams of ``filters.text.ngrams`` up to
  ``max_ngram_order`` (2: unigrams and bigrams, ALIGN; 1: words, CC12M's
  "word type"; the same tokenisation as the word-count rule) of every
  alt-text of the counting pool (``counted_texts``: one element per row,
  so a caption read twice counts twice; which rows, see
  ``filters.frequency``: by default the raw pool, before the quality
  thresholds). Every *occurrence* counts: "a cat and a dog" adds 2 to
  "a". This is token frequency, the sense of "most frequent unigrams" and of
  CC3M's "occurrences".
- **The vocabulary.** An n-gram is in the vocabulary iff its count is at least
  the *cut count*: with ``vocab_size = K > 0`` the cut is the K-th largest
  count, and *every* n-gram whose count equals it is kept (ties at the cut are
  never broken arbitrarily, so the vocabulary may exceed K; if there are fewer
  than K distinct n-grams, all are kept); with ``min_ngram_count = C > 0`` the
  cut is C; if both are set both must hold (cut = max of the two); if neither,
  the stage is disabled and rejects nothing.
- **The check.** A surviving alt-text is rejected if any of its n-grams is
  outside the vocabulary. An alt-text without n-grams has none outside it.

Scale: the n-gram table is a ``CombinePerKey(sum)``. Batch runners lift it
(partial sums per bundle before the shuffle), so even "the" reaches its
reducer as one partial sum per bundle; ``hot_key_fanout > 1`` adds
``with_hot_key_fanout`` on the unigrams (the Zipf head) for runners or modes
that do not lift (streaming). It is off by default because it is not free:
every unigram partial sum then takes an extra DoFn and combine (its cost is
measured in benchmarks/RESULTS.md).

The cut comes from a count-of-counts histogram (count value -> number of
n-grams with that count; its size is bounded by the number of distinct count
values, about sqrt(2 * occurrences)) walked from the top, passed as a
singleton side input. Each record's measure is the lowest count among its
n-grams: a record is rejected when it is below the cut. It is found by a
``CoGroupByKey`` of (n-gram, record key) against the counts below the
*reach* (``vocabulary_reach``: a cut ``WHAT_IF_REACH`` times higher than the
preset's, or the cut of a vocabulary that many times smaller), never a side
input of the counts, and a ``CombinePerKey(min)`` per record: the build
rejects below the cut, and the audit's what-if answers any cut up to the
reach from the same lowest counts. The only other side input is optional
and bounded by construction: the ``frequent_ngrams`` most frequent n-grams
at or above the reach, whose pairs cannot count and skip the join; they are
exactly the hottest join keys ("a", "of", "the"), which would otherwise
each land on one worker. With a reach of 1 (a vocabulary larger than the
corpus's n-grams, even divided by the reach) there is no join at all.
"""

from __future__ import annotations

import collections
import operator
from typing import Dict, Iterable, Optional

import apache_beam as beam

from filters import stages
from filters.text import ngrams

RARE_NGRAM = stages.reason("rare_ngrams", "rare_ngram")
METRICS_NAMESPACE = "filters"
# Above this many distinct count values, the count-of-counts stat is bucketed
# by powers of two (the exact table is still what the cut is computed from).
MAX_EXACT_COUNT_OF_COUNTS = 64
#: How far the audit's what-if reaches: cuts up to this many times min_ngram_count, and
#: vocabularies down to vocab_size divided by it.
WHAT_IF_REACH = 16


def vocabulary_enabled(preset) -> bool:
    return preset.vocab_size > 0 or preset.min_ngram_count > 0


def vocabulary_cut(count_of_counts: Dict[int, int], vocab_size: int, min_ngram_count: int) -> int:
    """Smallest count an n-gram needs to be in the vocabulary (0: no vocabulary rule).

    ``count_of_counts`` maps a count value to the number of n-grams with that
    count. Walking it from the largest count down, the cut for ``vocab_size``
    is the count at which the running number of n-grams first reaches K, so
    all n-grams tied at the K-th largest count are kept.
    """
    cut = 0
    if vocab_size > 0:
        cut = 1  # fewer than K distinct n-grams: every seen n-gram is kept
        seen = 0
        for count in sorted(count_of_counts, reverse=True):
            seen += count_of_counts[count]
            if seen >= vocab_size:
                cut = count
                break
    if min_ngram_count > 0:
        cut = max(cut, min_ngram_count)
    return cut


def vocabulary_reach(count_of_counts: Dict[int, int], vocab_size: int, min_ngram_count: int) -> int:
    """The highest cut the what-if answers: records whose lowest n-gram count is below it are measured."""
    cut = vocabulary_cut(count_of_counts, vocab_size, min_ngram_count)
    smaller = vocabulary_cut(count_of_counts, -(-vocab_size // WHAT_IF_REACH), 0) if vocab_size > 0 else 0
    return max(cut, smaller, min_ngram_count * WHAT_IF_REACH)


def count_of_counts_summary(count_of_counts: Dict[int, int], cut: int, preset) -> dict:
    """The ``count_of_counts`` stat: JSON-ready (string keys), log2-bucketed if large.

    ``counts`` maps a count (as a string) to the number of n-grams with that
    count; when bucketed (``bucketing == "log2"``), a key is the lower edge
    2**k of the bucket of counts [2**k, 2**(k+1)). ``cut_count`` is the
    smallest count in the vocabulary and ``vocab_size`` the number of n-grams
    in it (ties at the cut can make it exceed ``vocab_size_limit``, the
    preset's K). ``num_ngrams`` distinct n-grams, ``num_occurrences`` in all.
    """
    if len(count_of_counts) <= MAX_EXACT_COUNT_OF_COUNTS:
        bucketing = "exact"
        table = {str(c): n for c, n in sorted(count_of_counts.items())}
    else:
        bucketing = "log2"
        buckets = collections.Counter()
        for c, n in count_of_counts.items():
            buckets[1 << (c.bit_length() - 1)] += n
        table = {str(c): n for c, n in sorted(buckets.items())}
    return {
        "counts": table,
        "bucketing": bucketing,
        "cut_count": cut,
        "vocab_size": sum(n for c, n in count_of_counts.items() if c >= cut) if cut > 0 else 0,
        "vocab_size_limit": preset.vocab_size,
        "min_ngram_count": preset.min_ngram_count,
        "num_ngrams": sum(count_of_counts.values()),
        "num_occurrences": sum(c * n for c, n in count_of_counts.items()),
    }


def ngram_occurrences(text: str, max_order: int = 2):
    """``(n-gram, occurrences in text)``: pre-summed so a repeated n-gram is one element."""
    return collections.Counter(ngrams(text, max_order)).items()


def tagged_ngram_occurrences(text: str, max_order: int = 2):
    """``ngram_occurrences`` with unigrams on the tagged output "unigrams"."""
    for gram, count in ngram_occurrences(text, max_order):
        if " " in gram:
            yield gram, count
        else:
            yield beam.pvalue.TaggedOutput("unigrams", (gram, count))


def ngram_record_pairs(row, known_in_vocabulary: Iterable[str] = (), max_order: int = 2, cut: int = 2):
    """``(n-gram, key)`` once per distinct n-gram of the record, minus known-frequent ones.

    None when the cut (the reach) is 1: every n-gram of a judged record was
    counted at least once (the judged records are in the counting pool), so
    with ALIGN's 100M-n-gram vocabulary on a corpus of fewer distinct n-grams
    nothing is rare.
    """
    if cut <= 1:
        return
    key, text = row[0], row[3]
    for gram in set(ngrams(text, max_order)).difference(known_in_vocabulary):
        yield gram, key


class CountOfCountsFn(beam.CombineFn):
    """n-gram counts -> {count: number of n-grams with that count}."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, count):
        acc[count] = acc.get(count, 0) + 1
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        merged = next(accs)
        for acc in accs:
            for count, n in acc.items():
                merged[count] = merged.get(count, 0) + n
        return merged

    def extract_output(self, acc):
        return acc


def _counts_of_keys(joined):
    """An n-gram below the reach -> ``(key, its count)`` for each record that has it."""
    gram, sides = joined
    for count in sides["count"]:
        for key in sides["records"]:
            yield key, count


class DropRareNgrams(beam.PTransform):
    """``{"survivors": rows, "counted_texts": texts}`` -> ``{"rejected", "stats", "lowest_counts", "what_if"}``.

    ``rejected`` is ``(key, "rare_ngrams/rare_ngram")``, once per record;
    ``stats`` is one ``("count_of_counts", summary)``; ``lowest_counts``
    is ``(key, lowest count among its n-grams)`` for the records whose
    lowest count is below the reach, and ``what_if`` one ``("rare_ngrams",
    {"cut", "reach", "count_of_counts"})`` (the exact table), for the audit.
    """

    def __init__(self, preset, hot_key_fanout: int = 0, frequent_ngrams: int = 10_000, label: Optional[str] = None):
        super().__init__(label)
        self.preset = preset
        self.hot_key_fanout = hot_key_fanout
        self.frequent_ngrams = frequent_ngrams

    def expand(self, pcolls):
        survivors, counted_texts = pcolls["survivors"], pcolls["counted_texts"]
        preset = self.preset
        order = preset.max_ngram_order
        if not vocabulary_enabled(preset):
            pipeline = survivors.pipeline
            stats = pipeline | "NoVocabularyStats" >> beam.Create([("count_of_counts", {
                "disabled": True, "cut_count": 0, "vocab_size": 0,
                "vocab_size_limit": preset.vocab_size, "min_ngram_count": preset.min_ngram_count})])
            rejected = pipeline | "NoRejections" >> beam.Create([])
            lowest = pipeline | "NoCounts" >> beam.Create([])
            what_if = pipeline | "NoVocabulary" >> beam.Create([("rare_ngrams", {"disabled": True})])
            return {"rejected": rejected, "stats": stats, "lowest_counts": lowest, "what_if": what_if}

        if self.hot_key_fanout > 1:
            # Only unigrams take the fanout path: every element on it pays an
            # extra DoFn and combine, and the bigram table is the big, cold one.
            occurrences = counted_texts | "Occurrences" >> beam.FlatMap(
                tagged_ngram_occurrences, order).with_outputs("unigrams", main="bigrams")
            unigram_counts = occurrences.unigrams | "CountUnigrams" >> beam.CombinePerKey(
                sum).with_hot_key_fanout(self.hot_key_fanout)
            bigram_counts = occurrences.bigrams | "CountBigrams" >> beam.CombinePerKey(sum)
            ngram_counts = (unigram_counts, bigram_counts) | "NgramCounts" >> beam.Flatten()
        else:
            ngram_counts = (
                counted_texts
                | "Occurrences" >> beam.FlatMap(ngram_occurrences, order)
                | "CountNgrams" >> beam.CombinePerKey(sum))
        count_of_counts = (
            ngram_counts
            | "Counts" >> beam.Values()
            | "CountOfCounts" >> beam.CombineGlobally(CountOfCountsFn()))
        cut = count_of_counts | "CutCount" >> beam.Map(
            vocabulary_cut, preset.vocab_size, preset.min_ngram_count)
        reach = count_of_counts | "Reach" >> beam.Map(
            vocabulary_reach, preset.vocab_size, preset.min_ngram_count)
        cut_side, reach_side = beam.pvalue.AsSingleton(cut), beam.pvalue.AsSingleton(reach)
        below_reach = ngram_counts | "BelowReach" >> beam.Filter(
            lambda gram_count, reach: gram_count[1] < reach, reach=reach_side)

        if self.frequent_ngrams > 0:
            frequent = (
                ngram_counts
                | "AtOrAboveReach" >> beam.Filter(lambda gram_count, reach: gram_count[1] >= reach, reach=reach_side)
                | "MostFrequent" >> beam.combiners.Top.Of(self.frequent_ngrams, key=operator.itemgetter(1))
                | "FrequentNgrams" >> beam.Map(lambda top: frozenset(gram for gram, _ in top)))
            pairs = survivors | "NgramKeyPairs" >> beam.FlatMap(
                ngram_record_pairs, known_in_vocabulary=beam.pvalue.AsSingleton(frequent), max_order=order,
                cut=reach_side)
        else:
            pairs = survivors | "NgramKeyPairs" >> beam.FlatMap(ngram_record_pairs, max_order=order, cut=reach_side)

        lowest = (
            {"count": below_reach, "records": pairs}
            | "JoinCounts" >> beam.CoGroupByKey()
            | "CountsOfKeys" >> beam.FlatMap(_counts_of_keys)
            | "LowestPerKey" >> beam.CombinePerKey(min))
        rejected = lowest | "BelowCut" >> beam.FlatMap(
            lambda key_count, cut: [(key_count[0], RARE_NGRAM)] if key_count[1] < cut else [], cut=cut_side)
        stats = count_of_counts | "Summary" >> beam.Map(
            lambda coc, cut, preset: ("count_of_counts", count_of_counts_summary(coc, cut, preset)),
            cut=cut_side, preset=preset)
        what_if = count_of_counts | "WhatIf" >> beam.Map(
            lambda coc, cut, reach: ("rare_ngrams", {"cut": cut, "reach": reach, "count_of_counts": coc}),
            cut=cut_side, reach=reach_side)
        return {"rejected": rejected, "stats": stats, "lowest_counts": lowest, "what_if": what_if}
