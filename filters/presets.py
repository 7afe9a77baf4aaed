"""Filter presets as data: the one place that lists every threshold.

Each parameter has a canonical name, a type, the sense of its comparison
(which side of the threshold is kept, inclusive or exclusive), and a value per
preset. Code reads thresholds from a ``Preset`` and never from literals.

Sources: ALIGN (Jia et al. 2021, section 3) and Conceptual 12M (Changpinyo et
al. 2021, section 2: the relaxed CC3M filters).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, Optional


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    type: type
    sense: str  # how the value is applied; printed by --print-preset
    default: Any  # value when a preset does not set it
    choices: tuple = ()  # the allowed values, when there are few; empty: any value of the type


# Parameter order is the order --print-preset prints them in: roughly the
# order in which the stages run.
PARAMS = [
    Param("formats", tuple, "keep images whose decoded format is in this list", ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF", "MPO")),
    Param("max_pixels", int, "reject as decompression bomb if width*height > value (header only)", 89_478_485),
    Param("min_shorter_side", int, "keep if min(width, height) > value (exclusive)", 200),
    Param("min_both_sides", int, "keep if min(width, height) > value (exclusive); 0 disables", 0),
    Param("max_aspect_ratio", float, "keep if max(w,h)/min(w,h) < value (exclusive)", 3.0),
    Param("max_aspect_ratio_inclusive", bool, "if true keep ratio <= max_aspect_ratio instead of <", False),
    Param("min_words", int, "keep if unigram count >= value (inclusive)", 3),
    Param("max_words", int, "keep if unigram count <= value (inclusive)", 20),
    Param("max_chars", int, "reject alt-texts longer than this many characters after normalisation", 1000),
    Param("max_word_repetition", float, "keep if (count of most frequent word)/(words) <= value; 1.0 disables", 1.0),
    Param("nsfw_threshold", float, "reject if pornographic-content score >= value; 1.0 disables scoring", 0.8),
    Param("max_texts_per_image", int, "drop every pair of an image with more than value distinct alt-texts (exclusive)", 1000),
    Param("image_identity", str, "what counts as one image for per-image counts: 'phash' or 'sha256'", "phash", ("phash", "sha256")),
    Param("max_images_per_text", int, "drop every pair whose alt-text is shared by more than value distinct images", 10),
    Param("vocab_size", int, "n-gram vocabulary = the value most frequent unigrams+bigrams; 0 disables", 100_000_000),
    Param("min_ngram_count", int, "n-gram vocabulary = n-grams seen >= value times; 0 disables", 0),
    Param("near_duplicate_threshold", float, "cosine > value with an evaluation image is a near-duplicate; 0 = embedder's own calibrated value", 0.0),
    Param("num_clusters", int, "k-means clusters for the near-duplicate buckets", 4096),
    Param("nearest_clusters", int, "clusters per image (ALIGN: top 10)", 10),
    Param("bucket_size", int, "clusters per bucket (ALIGN: 3 of the 10, C(10,3)=120 buckets)", 3),
    Param(
        "near_duplicate_search", str,
        "'exact': k-means lists with a triangle-inequality bound, finds every pair above the threshold; "
        "'buckets': ALIGN's rule (share one of the C(nearest_clusters, bucket_size) buckets), may miss a few pairs; "
        "'list_join' / 'bucket_join': 'exact' / 'buckets' as a keyed join, for an index too large to broadcast",
        "exact", ("exact", "list_join", "buckets", "bucket_join"),
    ),
    Param("kmeans_sample_size", int, "corpus embeddings k-means trains on (a deterministic sample by key hash)", 250_000),
    Param(
        "centroid_merge_cosine", float,
        "merge k-means centroids closer than this cosine; 0 = automatic (only for bucket search: "
        "cos(2/3 arccos threshold)), -1 = never (the paper's plain k-means)",
        0.0,
    ),
    Param("dedup_in_corpus", bool, "also remove near-duplicates inside the corpus", False),
    Param("validation_fraction", float, "fraction of written pairs in the held-out validation split (by key hash)", 0.05),
    Param("output_max_side", int, "re-encode images whose longer side exceeds value (0 keeps sizes)", 512),
    Param("output_jpeg_quality", int, "JPEG quality when an image is re-encoded", 92),
    Param("max_records_per_shard", int, "upper bound used to choose the number of shards", 2000),
]

PARAMS_BY_NAME = {p.name: p for p in PARAMS}

PRESETS: Dict[str, Dict[str, Any]] = {
    # ALIGN, section 3: pornographic images removed; shorter side > 200 px;
    # aspect ratio < 3; > 1000 alt-texts per image dropped; alt-texts shared by
    # > 10 images dropped; rare tokens outside the 100M most frequent unigrams
    # and bigrams dropped; fewer than 3 or more than 20 unigrams dropped.
    "align": {},
    # CC12M, section 2 (relaxing CC3M): JPEG only; both dimensions > 400 px;
    # ratio of larger to smaller dimension no more than 2.5; 3 to 256 words;
    # no word repeated in more than 20% of the words; rare-word threshold 20
    # occurrences (instead of CC3M's hypernymised vocabulary). Steps that need a
    # part-of-speech tagger (e.g. "a noun and a preposition") or a person-name
    # recogniser are plug-in points, not implemented here.
    "cc12m": {
        "formats": ("JPEG",),
        "min_shorter_side": 400,
        "min_both_sides": 400,
        "max_aspect_ratio": 2.5,
        "max_aspect_ratio_inclusive": True,
        "min_words": 3,
        "max_words": 256,
        "max_chars": 4000,
        "max_word_repetition": 0.2,
        "max_texts_per_image": 1000,
        "max_images_per_text": 10,
        "vocab_size": 0,
        "min_ngram_count": 20,
    },
}


@dataclasses.dataclass(frozen=True)
class Preset:
    """Resolved parameter values; attribute access by canonical name."""

    name: str
    values: tuple  # ((param, value), ...) in PARAMS order; hashable, picklable

    def __getattr__(self, item):
        for k, v in object.__getattribute__(self, "values"):
            if k == item:
                return v
        raise AttributeError(item)

    def as_dict(self) -> Dict[str, Any]:
        return dict(self.values)


def parse_value(param: Param, text: str) -> Any:
    if param.type is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{param.name}: expected a boolean, got {text!r}")
    if param.type is tuple:
        return tuple(s.strip().upper() for s in text.split(",") if s.strip())
    if param.type is int:
        return int(float(text)) if "e" in text.lower() else int(text)
    return param.type(text)


def get_preset(name: str, overrides: Optional[Iterable[str]] = None, **values) -> Preset:
    """Resolve a preset with ``NAME=VALUE`` overrides (strings) and keyword values."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    resolved = {p.name: p.default for p in PARAMS}
    resolved.update(PRESETS[name])
    for item in overrides or ():
        if "=" not in item:
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip()
        if key not in PARAMS_BY_NAME:
            raise ValueError(f"unknown parameter {key!r}; see --print-preset")
        resolved[key] = parse_value(PARAMS_BY_NAME[key], text)
    for key, value in values.items():
        if key not in PARAMS_BY_NAME:
            raise ValueError(f"unknown parameter {key!r}")
        resolved[key] = value
    for param in PARAMS:
        if param.choices and resolved[param.name] not in param.choices:
            raise ValueError(
                f"{param.name} must be one of {', '.join(map(repr, param.choices))}, got {resolved[param.name]!r}"
            )
    return Preset(name, tuple((p.name, resolved[p.name]) for p in PARAMS))


def format_preset(preset: Preset) -> str:
    rows = [(p.name, repr(getattr(preset, p.name)), p.sense) for p in PARAMS]
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    lines = [f"preset: {preset.name}"]
    lines += [f"  {n:<{width}}  {v:<{vwidth}}  {s}" for n, v, s in rows]
    return "\n".join(lines)
