"""The threshold rules the audit's what-if answers: what each measures, and where a record goes without it.

A rule is a stage of ``filters.stages`` with the preset parameters that set
its threshold and the measure it compares (``RULES``). For every rule the
build keeps a histogram of the measure over the records, split by *class*:
where the record ends if this rule alone passes it, under every other
threshold as built (``pipeline.what_if.collect``):

- a record that the rule passes ends where it ended: its class is its fate
  (the stage that rejected it, ``written``, or ``duplicate_pair``);
- a record that the rule rejects goes to the earliest *other* stage that
  rejects it, or is written. For the corpus stages every other verdict of
  the key is known (the build decides them all, side by side); for a
  per-record rule the later per-record rules are cheap and are applied
  (aspect, words, repetition), but nothing decodes the picture, scores it
  or counts its groups after a per-record rejection: from there the class
  is "unknown from stage S on" (``?S``), and the what-if gives an estimate
  with a bound for those records (``pipeline.what_if``). The NSFW rule's
  measure is the score the first pass put on the light row: a record it
  rejected was judged no further (``?`` the stage after it).

With one threshold changed, a record moves from its fate to the rule, or
from the rule to its class, depending on which side of the old and new
threshold its measure lies: the funnel is exact wherever the classes are
known. ``conditions`` turns preset values into the comparisons a rule
keeps a record by; ``bin_keeps`` applies them to a whole histogram bin.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from filters.nsfw import UNDECODABLE_REASON as NSFW_UNDECODABLE
from filters.presets import compare, keep_op, rule_enabled
from filters.score_cut import kept_count
from filters.text import repetition, words
from pipeline.what_if.bins import BIG, Grid, decimal_grid, integer_grid

#: The file under ``stats/`` (``pipeline.what_if.collect`` writes it, ``pipeline.what_if`` reads it).
WHAT_IF_FILE = "what_if.json"
FORMAT_VERSION = 1
WRITTEN = "written"
DUPLICATE = "duplicate_pair"
UNKNOWN = "?"  # prefix of "unknown from stage S on": "?image_decode"

SIDES = integer_grid("pixels", exact_up_to=2048, top=1 << 24, per_octave=8)
WORDS = integer_grid("words", exact_up_to=1024, top=1 << 20, per_octave=8)
ASPECT = decimal_grid("ratio", 100, 1000, 100, tail=[float(k) for k in range(11, 101)] + [200.0, 500.0, 1e3, 1e4, 1e5])
FRACTION = decimal_grid("fraction", 0, 100, 100)
#: Scores in [0, 1] to 0.001 (an image the NSFW scorer could not decode is in the open bin above 1).
SCORES = decimal_grid("score", 0, 1000, 1000)
#: Distinct members of a group: exact up to 4,001 (every what-if cap of ``filters.frequency``, plus one).
GROUP_COUNTS = integer_grid("count", exact_up_to=4001, top=1 << 40, per_octave=16)
#: n-gram counts: exact up to 4,096, then 16 edges per doubling (a bin 4.4% wide).
NGRAM_COUNTS = integer_grid("count", exact_up_to=4096, top=1 << 50, per_octave=16)
#: Image-text cosines: edges every 0.001 over [-1, 1] (a threshold with three decimals is exact).
COSINES = decimal_grid("cosine", -1000, 1000, 1000)


@dataclasses.dataclass(frozen=True)
class Rule:
    stage: str
    params: Tuple[str, ...]
    measure: str
    grid: Grid
    corpus: bool  # decided on light rows after the first pass (a key stage)


RULES: Tuple[Rule, ...] = (
    Rule("image_size", ("min_shorter_side", "min_both_sides"), "shorter side (pixels)", SIDES, False),
    Rule("image_aspect", ("max_aspect_ratio", "max_aspect_ratio_inclusive"), "longer / shorter side", ASPECT, False),
    Rule("text_length", ("min_words", "max_words"), "words of the alt-text", WORDS, False),
    Rule("text_repetition", ("max_word_repetition",), "repeated words / words", FRACTION, False),
    Rule("nsfw", ("nsfw_threshold",), "the image's pornographic-content score (nsfw_model's)", SCORES, False),
    Rule("texts_per_image", ("max_texts_per_image",), "distinct alt-texts of the image", GROUP_COUNTS, True),
    Rule("images_per_text", ("max_images_per_text",), "distinct images of the alt-text", GROUP_COUNTS, True),
    Rule("rare_ngrams", ("vocab_size", "min_ngram_count"), "lowest count among the alt-text's n-grams",
         NGRAM_COUNTS, True),
    Rule("model_score", ("model_score_threshold", "model_score_top_fraction"),
         "the pair's cosine under the --model_score model", COSINES, True),
)
#: The ``rare_ngrams`` bin of a record none of whose n-grams is below the reach (none was measured).
ABOVE_REACH = BIG
RULES_BY_STAGE = {rule.stage: rule for rule in RULES}
RULE_OF_PARAM = {param: rule for rule in RULES for param in rule.params}
SHARING_RULES = ("texts_per_image", "images_per_text")
#: Per-record stages whose thresholds are measured on the light row and applied again for the classes.
CHEAP_STAGES = ("image_size", "image_aspect", "text_length", "text_repetition")
#: Per-record stages whose measure is a score on the light row: not applied again (a record such a stage
#: rejected was judged no further).
SCORED_STAGES = ("nsfw",)
MEASURED_STAGES = CHEAP_STAGES + SCORED_STAGES
#: First-pass stages before every rule of the what-if: a record they reject stays rejected.
FIXED_FIRST_PASS = ("read", "download", "image_header", "image_format")

Condition = Tuple[str, float]


def conditions(stage: str, values: Mapping) -> List[Condition]:
    """The comparisons ``measure OP threshold`` that all keep a record under rule ``stage`` (none: off).

    ``rare_ngrams`` is not here: its cut comes from the build's n-gram
    counts (``pipeline.what_if``); nor is ``model_score_top_fraction``,
    whose cut comes from the scores' histogram (``score_conditions``).
    """
    rule = RULES_BY_STAGE[stage]
    out = []
    for param in rule.params:
        if param in ("max_aspect_ratio_inclusive", "model_score_top_fraction") or not rule_enabled(param, values):
            continue
        out.append((keep_op(param, values), values[param]))
    return out


def fraction_cut(histograms: Mapping[str, Mapping[int, int]], fraction: float) -> Optional[float]:
    """The cosine the top ``fraction`` of the scored pairs starts at, read off their histogram (every class).

    The stage keeps the ``round(fraction * N)`` highest scores (ties broken
    by key, ``filters.score_cut``): counted down from the top bin, the cut
    is a bin's lower end when the count falls on it, else a point inside
    the bin where it falls, as far down as the share of the bin kept (the
    what-if then estimates that bin, its records the bound). None: every
    pair is kept.
    """
    total: Dict[int, int] = {}
    for hist in histograms.values():
        for b, n in hist.items():
            total[b] = total.get(b, 0) + n
    kept = kept_count(sum(total.values()), fraction)
    if kept >= sum(total.values()):
        return None
    above = 0
    for b in sorted(total, reverse=True):
        n = total[b]
        if above + n >= kept:
            low, high = COSINES.ends(b)
            if above + n == kept:
                return low
            if kept == above:  # nothing of this bin is kept: the cut is just above it
                return math.nextafter(high, math.inf)
            return high - (high - low) * (kept - above) / n
        above += n
    return -math.inf


def score_conditions(values: Mapping, histograms: Mapping[str, Mapping[int, int]]) -> List[Condition]:
    """The model-score rule's comparisons: the threshold's, and the top fraction's as a cosine cut."""
    out = conditions("model_score", values)
    if rule_enabled("model_score_top_fraction", values):
        cut = fraction_cut(histograms, values["model_score_top_fraction"])
        if cut is not None:
            out.append((">=", cut))
    return out


def keeps(conds: Sequence[Condition], value) -> bool:
    return all(compare(op, value, threshold) for op, threshold in conds)


def bin_keeps(grid: Grid, b: int, conds: Sequence[Condition]) -> Optional[bool]:
    """True: the rule keeps every value of bin ``b``; False: none; None: a threshold splits the bin."""
    low, high = grid.ends(b)
    split = False
    for op, threshold in conds:
        first, last = compare(op, low, threshold), compare(op, high, threshold)
        if not first and not last:
            return False
        split = split or first != last
    return None if split else True


def record_measures(row) -> Dict[str, float]:
    """The per-record rules' measures of a light row whose header parsed and whose text is normalised (the NSFW
    score where the stage scored the image; an image it could not decode: ``inf``, cut at any threshold)."""
    measures: Dict[str, float] = {}
    if math.isfinite(row.nsfw_score):
        measures["nsfw"] = row.nsfw_score
    elif row.reason == NSFW_UNDECODABLE:
        measures["nsfw"] = math.inf
    if row.width > 0 and row.height > 0:
        shorter, longer = sorted((row.width, row.height))
        measures["image_size"] = shorter
        measures["image_aspect"] = longer / shorter
    toks = words(row.text)
    measures["text_length"] = len(toks)
    measures["text_repetition"] = repetition(toks) if toks else 0.0
    return measures


def next_failing(stage: str, measures: Mapping[str, float], built: Mapping[str, List[Condition]],
                 order: Sequence[str], text_passes: bool = True) -> str:
    """Where a record that per-record rule ``stage`` rejected goes if the rule passes it.

    The cheap per-record rules after it are applied with the build's
    thresholds (``built``: stage -> conditions), and the ``text`` stage
    (``text_passes``); at the first stage after that is not one of them
    (the full decode, an extra stage) the record's way is unknown:
    ``?<that stage>``.
    """
    for later in order[order.index(stage) + 1:]:
        if later == "text":
            if not text_passes:
                return later
            continue
        if later not in CHEAP_STAGES:
            return UNKNOWN + later
        if not keeps(built[later], measures[later]):
            return later
    return WRITTEN


def classes_of_key(mask_stages: Sequence[str], stage: str) -> Tuple[str, str]:
    """A key's class for rule ``stage``: for its first row, and for each repeat of the pair.

    ``mask_stages``: every stage with a verdict on the key, in run order.
    """
    for other in mask_stages:
        if other != stage:
            return other, other
    return WRITTEN, DUPLICATE


def position(cls: str, order: Sequence[str]) -> int:
    """Where a class sits in the run order: a stage's place, ``written`` last, ``?S`` at S."""
    if cls == WRITTEN:
        return len(order)
    return order.index(cls[len(UNKNOWN):] if cls.startswith(UNKNOWN) else cls)
