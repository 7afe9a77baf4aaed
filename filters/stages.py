"""The fixed order of filter stages, and how a rejection is named.

Every input record ends in exactly one place: written to a split, or rejected
by the *first* stage (in this order) that rejects it. The funnel in
``stats/funnel.json`` lists stages in this order.

What each corpus-wide count sees (``texts_per_image``, ``images_per_text``
and the n-gram counts of ``rare_ngrams``; preset ``counting_base``): all
three count over the same rows, and none over another's result.

- ``raw`` (default; ALIGN counts rare tokens "from the raw dataset"): every
  row that passed ``read``, ``image_header`` and ``text`` (a readable image
  header and a readable alt-text), including the rows that ``image_format``,
  ``image_size``, ``image_aspect``, ``text_length``, ``text_repetition``,
  ``image_decode`` or ``nsfw`` reject. An alt-text on 11 images, one of them
  too small, is on 11 images.
- ``survivors``: only the rows that passed every per-record stage and
  ``nsfw``.

In both, a verdict applies only to rows that are still in the running: a
row rejected earlier keeps its first reason. The near-duplicate stages
compare the rows that no earlier stage rejected.

A rejection reason is ``"<stage>/<detail>"``, e.g. ``"image_size/too_small"``.
The stage part must be one of ``STAGES``; details are short stable words
(values go in the audit sample, not in the reason).

Cheap before expensive: header-only image checks and text rules run before
full decodes, hashes and the NSFW scorer (a header check costs a small
fraction of a decode: ``benchmarks/RESULTS.md``, "Per-record filters").

``model_score`` (``--model_score``, off by default) comes right after
``nsfw``, before the corpus stages. It judges a pair by itself, as the
per-record rules do: the first pass scores the pairs that every per-record
rule and NSFW kept (no model time on a pair those reject), and only its cut
is corpus-wide (the top fraction is a quantile of the scores). First among
the corpus stages, the pairs it judges are exactly the pairs the funnel
shows entering it, so its ``out / in`` is the fraction it keeps
(DataComp's "top 30% of the pool after basic filtering"). The corpus-wide
counts do not see its verdicts (they count over the counting pool, as they
do not see each other's), so its place decides only under which reason a
pair that another corpus stage also rejects is counted; the audit reports
those pairs (what the score alone would have caught).
"""

#: The two outputs of every stage: a stage returns ``{SURVIVORS: what goes on, REJECTED: what it rejects}``.
SURVIVORS, REJECTED = "survivors", "rejected"

STAGES = (
    ("read", "the input row is usable: required columns present, caption text, image bytes"),
    ("download", "the image URL was fetched: allowed address, HTTP 200, an image type, within the time and size limits"),
    ("image_header", "the image header parses (no full decode) and is not a decompression bomb"),
    ("image_format", "the image format is allowed by the preset"),
    ("image_size", "shorter side (and, for cc12m, both sides) above the minimum"),
    ("image_aspect", "aspect ratio (longer/shorter) below the maximum"),
    ("text", "alt-text normalises to something: not empty, not too long in characters"),
    ("text_length", "unigram count within [min_words, max_words]"),
    ("text_repetition", "repeated words / words (1 - distinct/total) at most max_word_repetition"),
    ("image_decode", "the full image decodes (not truncated or corrupt)"),
    ("nsfw", "pornographic-content score below nsfw_threshold"),
    ("model_score", "image-text cosine of a trained two-tower model: at least model_score_threshold, and in the "
                    "top model_score_top_fraction of the scored pairs"),
    ("texts_per_image", "the image has at most max_texts_per_image distinct alt-texts"),
    ("images_per_text", "the alt-text is shared by at most max_images_per_text distinct images"),
    ("rare_ngrams", "every n-gram (words, and bigrams if max_ngram_order is 2) is in the vocabulary"),
    ("near_duplicate_eval", "the image is not a near-duplicate of an evaluation image"),
    ("near_duplicate_corpus", "the image is not a near-duplicate of another kept corpus image"),
    ("duplicate_pair", "the same (url, alt-text) pair was not already kept"),
)

#: Stages the funnel lists only when the build ran them (``--download``,
#: ``--model_score``): a build from image bytes has no download stage, and its
#: funnel says so by not listing one.
OPTIONAL_STAGES = ("download", "model_score")

STAGE_NAMES = tuple(name for name, _ in STAGES)
STAGE_INDEX = {name: i for i, name in enumerate(STAGE_NAMES)}


def reason(stage: str, detail: str) -> str:
    if stage not in STAGE_INDEX:
        raise ValueError(f"unknown stage {stage!r}")
    return f"{stage}/{detail}"


def stage_of(reason_text: str) -> str:
    return reason_text.split("/", 1)[0]
