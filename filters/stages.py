"""The fixed order of filter stages, and how a rejection is named.

Every input record ends in exactly one place: written to a split, or rejected
by the *first* stage (in this order) that rejects it. A later stage never sees
a record an earlier one rejected, so per-corpus counts (texts per image,
images per text, n-gram counts) are taken over the survivors of all earlier
stages. The funnel in ``stats/funnel.json`` lists stages in this order.

A rejection reason is ``"<stage>/<detail>"``, e.g. ``"image_size/too_small"``.
The stage part must be one of ``STAGES``; details are short stable words
(values go in the audit sample, not in the reason).

Cheap before expensive: header-only image checks (~50k images/s/core) and
text rules run before full decodes, hashes and the NSFW scorer.
"""

STAGES = (
    ("read", "the input row is usable: required columns present, caption text, image bytes"),
    ("image_header", "the image header parses (no full decode) and is not a decompression bomb"),
    ("image_format", "the image format is allowed by the preset"),
    ("image_size", "shorter side (and, for cc12m, both sides) above the minimum"),
    ("image_aspect", "aspect ratio (longer/shorter) below the maximum"),
    ("text", "alt-text normalises to something: not empty, not too long in characters"),
    ("text_length", "unigram count within [min_words, max_words]"),
    ("text_repetition", "no word makes up more than max_word_repetition of the words"),
    ("image_decode", "the full image decodes (not truncated or corrupt)"),
    ("nsfw", "pornographic-content score below nsfw_threshold"),
    ("texts_per_image", "the image has at most max_texts_per_image distinct alt-texts"),
    ("images_per_text", "the alt-text is shared by at most max_images_per_text distinct images"),
    ("rare_ngrams", "every unigram and bigram of the alt-text is in the n-gram vocabulary"),
    ("near_duplicate_eval", "the image is not a near-duplicate of an evaluation image"),
    ("near_duplicate_corpus", "the image is not a near-duplicate of another kept corpus image"),
    ("duplicate_pair", "the same (url, alt-text) pair was not already kept"),
)

STAGE_NAMES = tuple(name for name, _ in STAGES)
STAGE_INDEX = {name: i for i, name in enumerate(STAGE_NAMES)}


def reason(stage: str, detail: str) -> str:
    if stage not in STAGE_INDEX:
        raise ValueError(f"unknown stage {stage!r}")
    return f"{stage}/{detail}"


def stage_of(reason_text: str) -> str:
    return reason_text.split("/", 1)[0]
