"""Whole-corpus frequency filters as Beam composites (ALIGN section 3, CC12M section 2).

``ApplyCorpusFilters`` runs up to three stages (``filters.stages`` order);
a stage whose limit is 0 (off) does not run (cc12m has no sharing limits):

1. ``texts_per_image``: an image with more than ``max_texts_per_image``
   distinct alt-texts loses every pair ("images with more than 1000
   associated alt-texts are discarded").
2. ``images_per_text``: an alt-text shared by more than
   ``max_images_per_text`` distinct images loses every pair ("alt-texts that
   are shared by more than 10 images", e.g. "1920x1080", "alt_img").
3. ``rare_ngrams``: see ``filters.ngram_vocab``.

Which rows are counted. Every count (distinct alt-texts per image, distinct
images per alt-text, n-gram occurrences) is taken over one set of rows, the
*counting pool*; the verdicts apply to the rows being judged (the survivors
of every earlier stage). With ``counting_base="raw"`` (default, the papers'
reading: ALIGN counts its vocabulary "from the raw dataset", and an alt-text
shared by 11 images is shared whether or not one of them is small) the pool
is every row whose image header parses and whose alt-text normalises to
readable text, before the quality thresholds (format, size, aspect, length,
repetition, full decode, NSFW); with ``"survivors"`` it is the rows being
judged. The three counts are independent of each other: a row rejected by
``texts_per_image`` still counts toward ``images_per_text`` and the n-grams.

Identities. An *image* is the sha256 of its bytes (``image_identity=
"sha256"``, default: never pools two different images) or its 64-bit
perceptual hash (``"phash"``: the pHash of the picture reduced by DCT
scaling, ``filters.image.identify``; two rows are one image when their
hashes are equal, which pools most re-encoded or resized copies of one
picture, but also different flat-colour or text images; measured in
benchmarks/RESULTS.md); a row without that hash falls back to its sha256,
then to its own key (an image of its own). An *alt-text* is
``normalize_text(text).casefold()``: "Alt IMG" and "alt img" are one
alt-text, for both counts.

Records and keys. The unit is a record (a row). A key is normally one
record; if the same key arrives twice (the same url and alt-text read
twice) both rows are counted like any other rows, and the key is reported
once, with the reason of the earliest stage that rejected any of its rows.

Scale. Distinct counts are ``CombinePerKey`` with sets capped at
threshold + 1 (the rule only needs "more than the threshold", so a state is
never bigger than that, however hot the image or alt-text), or at the
audit's what-if cap + 1 when that is larger (``WHAT_IF_CAPS``: the what-if
answers a sharing limit up to it; a set of 4,001 alt-texts is the largest
state); the groups over
the limit are joined back to the judged rows by ``common.hot_keys.
JoinDecisions``: a group with more than ``max_group_rows`` judged rows (the
placeholder image, the boilerplate caption) gets its verdict by a side
input, the others by ``CoGroupByKey``, so no group's rows are ever one list.
The histograms are over the counts capped at threshold + 1, so their last
bin reads "more than the threshold". The counts of the groups with at least
two members (``"counts"`` of ``DropSharedGroups``) are what the audit's
what-if meets with the keys' classes (``pipeline.what_if.collect``).
"""

from __future__ import annotations

import functools
import itertools
import operator
from typing import List

import apache_beam as beam
from apache_beam.metrics import Metrics

from common.histogram import HistogramFn, close_last_bin
from common.bloom import KeysOf
from common.hot_keys import DEFAULT_MAX_ROWS, JoinDecisions
from common.once import once, total
from filters import extra_stages, stages
from filters.ngram_vocab import METRICS_NAMESPACE, RARE_NGRAM, DropRareNgrams
from filters.presets import keeps, rule_enabled
from filters.text import text_identity

TOO_MANY_TEXTS = stages.reason("texts_per_image", "too_many_texts")
SHARED_TEXT = stages.reason("images_per_text", "shared_text")
# First stage wins, in this order.
REASONS = (TOO_MANY_TEXTS, SHARED_TEXT, RARE_NGRAM)
IMAGE_IDENTITIES = ("phash", "sha256")
#: Sharing limits the audit's what-if can answer up to (the counts are capped there, not at limit + 1):
#: four times ALIGN's 1,000 alt-texts per image; ten times its 10 images per alt-text.
WHAT_IF_CAPS = {"max_texts_per_image": 4000, "max_images_per_text": 100}


def what_if_cap(param: str, limit: int) -> int:
    """The largest count a sharing rule's groups are counted exactly up to (more is ``cap + 1``)."""
    return max(limit, WHAT_IF_CAPS.get(param, 0))


# ---------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------


def pool_row(row) -> tuple:
    """A judged record (the build's light row: any object with ``key``, ``sha256``, ``phash``, ``text``) as
    the ``(key, sha256, phash, normalised alt-text)`` row that the corpus-wide counts take."""
    return row.key, row.sha256, row.phash, row.text


def image_identity(row, identity: str) -> str:
    """``row = (key, sha256, phash, text)`` -> the image it counts as."""
    key, sha256, phash = row[0], row[1], row[2]
    chosen = phash if identity == "phash" else sha256
    # phash is 16 hex digits, sha256 64 and keys carry a prefix: no collisions.
    return chosen or sha256 or "key:" + key


def log2_edges(limit: int) -> List[int]:
    """Histogram edges for counts capped at ``limit + 1``: powers of two, then the cap.

    Bins are [edges[i], edges[i+1]); the last bin, [limit+1, limit+2), holds
    exactly the groups over the limit.
    """
    edges, e = [], 1
    while e < limit + 1:
        edges.append(e)
        e *= 2
    return edges + [limit + 1, limit + 2]


def _image_then_text(identity, row):
    return image_identity(row, identity), (text_identity(row[3]), row)


def _text_then_image(identity, row):
    return text_identity(row[3]), (image_identity(row, identity), row)


def _extra_group_then_member(stage, identity, row):
    """An extra corpus stage's ``(group, (member, row))``; group None = in no group."""
    view = extra_stages.CorpusView(row[0], row[3], image_identity(row, identity))
    return stage.group_of(view), (stage.member_of(view), row)


def _in_a_group(keyed) -> bool:
    return keyed[0] is not None


# ---------------------------------------------------------------------------
# Combiners
# ---------------------------------------------------------------------------


class CappedDistinctCountFn(beam.CombineFn):
    """Number of distinct values, saturating at ``cap``: min(distinct, cap).

    Any subset of ``cap`` distinct values is as good as any other once the
    cap is reached, so truncating a merged set never changes the result.
    """

    def __init__(self, cap: int):
        self.cap = cap

    def create_accumulator(self):
        return set()

    def add_input(self, acc, value):
        if len(acc) < self.cap:
            acc.add(value)
        return acc

    def merge_accumulators(self, accs):
        merged = set()
        for acc in accs:
            if len(merged) >= self.cap:
                break
            merged |= acc
        if len(merged) > self.cap:
            merged = set(itertools.islice(merged, self.cap))
        return merged

    def extract_output(self, acc):
        return len(acc)


# ---------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------


class _GroupsOverLimit(beam.DoFn):
    """``(group, capped count)`` -> ``(group, reason)`` for the groups the rule rejects; records the counts."""

    def __init__(self, keep, metric: str, reason: str, shown_cap: int):
        self.keep = keep
        self.reason = reason
        self.shown_cap = shown_cap
        self.distribution = Metrics.distribution(METRICS_NAMESPACE, metric)

    def process(self, group_count):
        group, count = group_count
        self.distribution.update(min(count, self.shown_cap))
        if not self.keep(count):
            yield group, self.reason


def _rejected_key(key_decision):
    key, reason = key_decision
    if reason is not None:
        yield key, reason


def _grouped(row_judged, group_and_member):
    """``(row, judged)`` -> ``(group, (member, key if judged else None))``, nothing for a row in no group."""
    row, judged = row_judged
    group, (member, _) = group_and_member(row)
    if group is not None:
        yield group, (member, row[0] if judged else None)


def _judged_maybe_over_limit(entry, groups_over_limit):
    group, (_, key) = entry
    if key is not None and group in groups_over_limit:
        yield group, key


class DropSharedGroups(beam.PTransform):
    """Reject every judged row of a group with more than ``limit`` distinct members in the pool.

    ``group_and_member(row) -> (group, (member, row))`` names the group (an
    image, or an alt-text) and what is counted in it (alt-texts, or images);
    a row whose group is None is in no group. Input ``{"pool": (row,
    judged)}``: every row of the counting pool, and whether it is judged;
    ``param`` is the preset parameter (``max_texts_per_image``/
    ``max_images_per_text``) whose ``keep`` side decides, or an extra
    stage's name with its own ``keep(count) -> bool``. Returns
    ``{"rejected": (key, reason), "histogram": one dict, "counts": (group,
    count)}``; the histogram is over the groups of the pool, ``counts`` are
    the groups with two members or more, counted up to ``what_if_cap``.

    Only the judged rows of groups that may be over the limit meet the
    verdicts: the groups over it are collected into a set every worker holds
    (``common.bloom.KeysOf``: exact while small, a Bloom filter when large),
    and a row whose group is certainly not in it skips the join. The join
    itself (``common.hot_keys``) never holds more than ``max_group_rows`` rows
    of one group in one list; neither changes the result.
    """

    def __init__(self, group_and_member, param: str, limit: int, reason: str, label=None, keep=None,
                 max_group_rows: int = DEFAULT_MAX_ROWS):
        super().__init__(label)
        self.group_and_member = group_and_member
        self.keep = keep or functools.partial(keeps, {param: limit}, param)
        self.param = param
        self.metric = param.replace("max_", "")
        self.limit = limit
        self.reason = reason
        self.max_group_rows = max_group_rows

    def expand(self, inputs):
        by_group = inputs["pool"] | "ByGroup" >> beam.FlatMap(_grouped, self.group_and_member)
        cap = (what_if_cap(self.param, self.limit) if self.param in WHAT_IF_CAPS else self.limit) + 1
        counts = (
            by_group
            | "Members" >> beam.MapTuple(lambda group, member_key: (group, member_key[0]))
            | "CountDistinct" >> beam.CombinePerKey(CappedDistinctCountFn(cap)))
        over_limit = counts | "OverLimit" >> beam.ParDo(
            _GroupsOverLimit(self.keep, self.metric, self.reason, self.limit + 1))
        groups_over_limit = (
            over_limit
            | "GroupsOverLimit" >> beam.Keys()
            # No group over the limit reads as the empty set: Beam's default for an empty input is five more
            # transforms.
            | "AllGroupsOverLimit" >> beam.CombineGlobally(KeysOf()).without_defaults())
        judged = by_group | "JudgedMaybeOverLimit" >> beam.FlatMap(
            _judged_maybe_over_limit, beam.pvalue.AsSingleton(groups_over_limit, default_value=KeysOf().apply([])))
        rejected = (
            {"rows": judged, "decisions": over_limit}
            | "JoinCounts" >> JoinDecisions(self.max_group_rows, label=self.metric)
            | "RejectedKeys" >> beam.FlatMap(_rejected_key))
        edges = log2_edges(self.limit)
        shown_cap = self.limit + 1
        shown = counts | "Counts" >> beam.Map(lambda group_count: min(group_count[1], shown_cap))
        # Counts are capped at limit + 1, so the open last bin is [limit + 1, limit + 2).
        histogram = once(counts.pipeline, "CloseLastBin", close_last_bin,
                         total(shown, "Histogram", HistogramFn(edges[:-1])), edges[-1])
        shared = counts | "SharedGroups" >> beam.Filter(lambda group_count: group_count[1] >= 2)
        return {"rejected": rejected, "histogram": histogram, "counts": shared}


class _CountReason(beam.DoFn):
    def __init__(self, reasons):
        self.reasons = tuple(reasons)
        self.counters = {r: Metrics.counter(METRICS_NAMESPACE, r) for r in self.reasons}

    def process(self, key_stage):
        key, stage = key_stage
        reason = self.reasons[stage]
        self.counters[reason].inc()
        yield key, reason


class FirstReasonPerKey(beam.PTransform):
    """``(key, reason)`` with repeats -> one ``(key, reason)`` per key, earliest in ``reasons``."""

    def __init__(self, reasons=REASONS):
        super().__init__()
        self.reasons = tuple(reasons)

    def expand(self, rejected):
        order = {reason: i for i, reason in enumerate(self.reasons)}
        return (
            rejected
            | "StageIndex" >> beam.MapTuple(lambda key, reason: (key, order[reason]))
            | "Earliest" >> beam.CombinePerKey(min)
            | "CountReasons" >> beam.ParDo(_CountReason(self.reasons)))


def reasons_in_order(extras=()) -> tuple:
    """Every corpus rejection reason, extra corpus stages included, in stage order."""
    placed = {anchor: [e.rejection for e in extra_stages.corpus_stages(extras) if e.after == anchor]
              for anchor in extra_stages.CORPUS_ANCHORS}
    return (TOO_MANY_TEXTS, SHARED_TEXT, *placed["images_per_text"], RARE_NGRAM, *placed["rare_ngrams"])


def stages_run(preset, extras=()) -> list:
    """The corpus stages this preset runs, in order (a stage at its off value does not)."""
    values = preset.as_dict()
    names = [name for name, param in (("texts_per_image", "max_texts_per_image"),
                                      ("images_per_text", "max_images_per_text"))
             if rule_enabled(param, values)]
    placed = {anchor: [e.name for e in extra_stages.corpus_stages(extras) if e.after == anchor]
              for anchor in extra_stages.CORPUS_ANCHORS}
    return names + placed["images_per_text"] + ["rare_ngrams"] + placed["rare_ngrams"]


class ApplyCorpusFilters(beam.PTransform):
    """The whole-corpus frequency filters of a preset.

    Input ``{"survivors": rows, "counted_only": rows}``, a row being ``(key,
    sha256, phash, text)`` without image bytes: ``survivors`` are judged and
    counted; ``counted_only`` are the other rows of the counting pool (rows
    of the raw pool that a per-record stage rejected; empty under
    ``counting_base="survivors"``), counted but not judged. Output
    ``{"rejected": (key, reason), "stats": (name, json_value)}`` with each key
    at most once (first stage wins) and the stats ``count_of_counts`` and,
    for the stages that run, ``texts_per_image`` and ``images_per_text``;
    and what the audit's what-if needs (``pipeline.what_if.collect``):
    ``group_counts`` (``((stage, group), count)`` of the shared groups),
    ``lowest_ngram_counts`` (``(key, lowest count among its n-grams)``) and
    ``vocabulary`` (one ``("rare_ngrams", facts)``). With
    ``every_verdict``, ``rejected`` has every stage's verdicts, a key once
    per stage that rejects it or more (the caller keeps the first stage's:
    ``verdicts.KeyFate``), which the what-if needs to know where a key goes
    when one rule passes it.

    ``extras`` are extra corpus stages (``filters.extra_stages.CorpusStage``),
    counted over the same pool; their histograms are stats named after them.

    ``hot_key_fanout`` (unigram counts; off, see ``filters.ngram_vocab``) and
    ``frequent_ngrams`` (size of the known-frequent side input; 0 sends every
    pair through the join) tune ``DropRareNgrams``; ``max_group_rows`` the
    verdict joins of the sharing rules (``DropSharedGroups``). They never
    change the result.
    """

    def __init__(self, preset, label_prefix: str = "", *, hot_key_fanout: int = 0, frequent_ngrams: int = 10_000,
                 extras=(), max_group_rows: int = DEFAULT_MAX_ROWS, every_verdict: bool = False):
        super().__init__()
        self.every_verdict = every_verdict
        if preset.image_identity not in IMAGE_IDENTITIES:
            raise ValueError(f"image_identity must be one of {IMAGE_IDENTITIES}, got {preset.image_identity!r}")
        self.preset = preset
        self.extras = extra_stages.corpus_stages(extras)
        #: The stages whose verdicts this returns (the build's funnel lists them as run).
        self.decides = tuple(stages_run(preset, self.extras))
        self.label_prefix = label_prefix
        self.hot_key_fanout = hot_key_fanout
        self.frequent_ngrams = frequent_ngrams
        self.max_group_rows = max_group_rows

    def expand(self, pcolls):
        preset, p = self.preset, self.label_prefix
        survivors = pcolls["survivors"]
        pool = (  # (row, judged): every row of the counting pool once
            survivors | f"{p}Judged" >> beam.Map(lambda row: (row, True)),
            pcolls["counted_only"] | f"{p}CountedOnly" >> beam.Map(lambda row: (row, False)),
        ) | f"{p}CountingPool" >> beam.Flatten()
        run = stages_run(preset)
        rejected, stats, group_counts = [], [], []
        for stage, param, reason, order, label in (
            ("texts_per_image", "max_texts_per_image", TOO_MANY_TEXTS, _image_then_text, "TextsPerImage"),
            ("images_per_text", "max_images_per_text", SHARED_TEXT, _text_then_image, "ImagesPerText"),
        ):
            if stage not in run:
                continue
            shared = {"pool": pool} | f"{p}{label}" >> DropSharedGroups(
                functools.partial(order, preset.image_identity), param, getattr(preset, param), reason,
                max_group_rows=self.max_group_rows)
            rejected.append(shared["rejected"])
            stats.append(shared["histogram"] | f"{p}Name{label}" >> beam.Map(lambda h, name: (name, h), stage))
            group_counts.append(shared["counts"] | f"{p}Counts{label}" >> beam.MapTuple(
                lambda group, count, name=stage: ((name, group), count)))
        for extra in self.extras:
            shared = {"pool": pool} | f"{p}Extra_{extra.name}" >> DropSharedGroups(
                functools.partial(_extra_group_then_member, extra, preset.image_identity), extra.name,
                extra.max_count, extra.rejection, keep=functools.partial(operator.ge, extra.max_count),
                max_group_rows=self.max_group_rows)
            rejected.append(shared["rejected"])
            stats.append(shared["histogram"] | f"{p}NameExtra_{extra.name}" >> beam.Map(
                lambda h, name: (name, h), extra.name))
        rare = {"survivors": survivors, "counted_texts": pool | f"{p}PoolTexts" >> beam.Map(lambda entry: entry[0][3])} | (
            f"{p}RareNgrams" >> DropRareNgrams(
                preset, hot_key_fanout=self.hot_key_fanout, frequent_ngrams=self.frequent_ngrams))
        rejected.append(rare["rejected"])
        stats.insert(0, rare["stats"])
        rejected = tuple(rejected) | f"{p}AllRejected" >> beam.Flatten()
        if not self.every_verdict:
            rejected = rejected | f"{p}FirstReason" >> FirstReasonPerKey(reasons_in_order(self.extras))
        return {
            "rejected": rejected,
            "stats": tuple(stats) | f"{p}AllStats" >> beam.Flatten(),
            "group_counts": tuple(group_counts) | f"{p}AllGroupCounts" >> beam.Flatten(pipeline=survivors.pipeline),
            "lowest_ngram_counts": rare["lowest_counts"],
            "vocabulary": rare["what_if"],
        }
