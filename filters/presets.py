"""Filter presets as data: the one place that lists every threshold.

Each parameter has a canonical name, a type, an allowed range (or a list of
allowed values), a value per preset and, for a threshold rule, the side of it
that is kept: ``keep`` is the comparison ``measured KEEP value`` that keeps a
record (``">"`` is exclusive, ``">="`` inclusive). ``keeps()`` applies it;
the per-record rules, the corpus filters, ``--print_preset`` and the audit's
plots all read the direction from here, so it is written once.

Values are checked when a preset is resolved (``get_preset``): a wrong type,
a value outside its range or NaN is refused with a one-line ``PresetError``
naming the parameter and its allowed range, before any work starts.

Sources: ALIGN (Jia et al. 2021, section 3) and Conceptual 12M (Changpinyo et
al. 2021, section 2: the relaxed CC3M filters).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterable, Mapping, Optional

INF = math.inf


class PresetError(ValueError):
    """A preset name, override or value that cannot be used; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    type: type
    doc: str  # what the value means
    default: Any  # value when a preset does not set it
    choices: tuple = ()  # the allowed values, when there are few
    low: float = -INF  # allowed range of a number, inclusive at both ends
    high: float = INF
    measure: str = ""  # threshold rules: what is compared with the value ...
    keep: str = ""  # ... and the comparison that keeps a record: measure KEEP value
    off: Any = None  # the value that turns the rule off (None: it cannot be turned off)

    def allowed(self) -> str:
        """The allowed values as the error message and --print_preset say them."""
        if self.choices:
            return "one of " + ", ".join(map(repr, self.choices))
        if self.type is bool:
            return "true or false"
        if self.type is tuple:
            return "a comma-separated list of image formats, not empty"
        if self.type is list:
            return "a comma-separated list of MODULE:ATTRIBUTE, may be empty"
        kind = "an integer" if self.type is int else "a number"
        low = "-inf" if self.low == -INF else f"{self.low:g}"
        high = "inf" if self.high == INF else f"{self.high:g}"
        return f"{kind} in [{low}, {high}]" if self.high != INF else f"{kind} in [{low}, inf)"


_INCLUSIVE = {">": "exclusive", "<": "exclusive", ">=": "inclusive", "<=": "inclusive"}
_COMPARE = {
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
}

# Parameter order is the order --print_preset prints them in: roughly the
# order in which the stages run.
PARAMS = [
    Param("formats", tuple, "keep images whose format is in this list (MPO, a multi-picture JPEG, counts as JPEG)",
          ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF", "MPO")),
    Param("max_pixels", int, "reject as decompression bomb (header only)", 89_478_485, low=1,
          measure="width*height", keep="<="),
    Param("min_shorter_side", int, "minimum shorter side in pixels", 200, low=0,
          measure="min(width, height)", keep=">"),
    Param("min_both_sides", int, "minimum of both sides in pixels", 0, low=0,
          measure="min(width, height)", keep=">", off=0),
    Param("max_aspect_ratio", float, "maximum aspect ratio (longer/shorter)", 3.0, low=1.0,
          measure="max(w,h)/min(w,h)", keep="<"),
    Param("max_aspect_ratio_inclusive", bool, "if true the aspect rule keeps ratio <= max_aspect_ratio instead of <",
          False),
    Param("min_words", int, "minimum number of words", 3, low=0, measure="words", keep=">="),
    Param("max_words", int, "maximum number of words", 20, low=1, measure="words", keep="<="),
    Param("max_chars", int, "maximum characters after normalisation", 1000, low=1,
          measure="characters", keep="<="),
    Param("max_word_repetition", float, "maximum fraction of repeated words", 1.0, low=0.0, high=1.0,
          measure="1 - distinct words/words", keep="<=", off=1.0),
    Param("nsfw_model", str,
          "the pornographic-image scorer: 'open_nsfw' (Yahoo's classifier, a base requirement: BSD-2-Clause "
          "weights) or 'nudenet' (a body-part detector, the optional AGPL-3.0 '[nsfw]' extra)",
          "open_nsfw", ("open_nsfw", "nudenet")),
    # 0.5 is COYO-700M's cut with the same open_nsfw weights (its images all score below 0.5). Yahoo's
    # README calls < 0.2 likely safe and > 0.8 highly probably NSFW, and asks for a threshold fitted to one's
    # own data; on photographs without pornography open_nsfw stays below 0.5 (benchmarks/RESULTS.md, NSFW
    # stage). A nudenet score is a box confidence, not a probability: 0.8 is this project's cut for it.
    Param("nsfw_threshold", float, "pornographic-content score (nsfw_model's) a record must stay below", 0.5,
          low=0.0, high=1.0, measure="pornographic score", keep="<", off=1.0),
    Param("nsfw_unscored", str,
          "what a worker that cannot load nsfw_model (e.g. nudenet without the '[nsfw]' extra) does: 'pass' the "
          "records unscored (counted in nsfw/scorer_unavailable and said in the funnel) or 'fail' the job",
          "pass", ("pass", "fail")),
    # int8 costs ~0.6 of open_nsfw's fp32 CPU on CPUs with VNNI/AMX and moved the sample's and photographs'
    # scores by <= 0.05 (benchmarks.nsfw_precision; docs/filters.md, Precision); 'auto' uses it only there
    # and only if it scores the load-time probe as fp32 does.
    Param("nsfw_precision", str,
          "how open_nsfw runs: 'auto' (int8 where the CPU has VNNI/AMX and the int8 graph passes the load-time "
          "probe, else fp32; the funnel's nsfw note says which and why), 'fp32' (the exact folded graph) or "
          "'int8' (whatever the CPU, still probed)",
          "auto", ("auto", "fp32", "int8")),
    Param("model_score_threshold", float,
          "image-text cosine a pair must reach under the --model_score model (a trained two-tower checkpoint)",
          -1.0, low=-1.0, high=1.0, measure="the pair's cosine", keep=">=", off=-1.0),
    Param("model_score_top_fraction", float,
          "keep the pairs whose --model_score cosine is in this top fraction of the scored pairs "
          "(DataComp: 0.3); a corpus-wide quantile, ties broken by key",
          1.0, low=0.0, high=1.0, measure="the pair's place from the top, as a fraction of the scored pairs",
          keep="<=", off=1.0),
    Param("counting_base", str,
          "rows every corpus-wide count (texts per image, images per text, n-grams) is taken over: "
          "'raw' = every row with a readable image header and text, before the quality thresholds "
          "(the papers' reading); 'survivors' = rows that passed every per-record stage",
          "raw", ("raw", "survivors")),
    Param("image_identity", str,
          "what counts as one image for the per-image counts: 'sha256' of the bytes (never pools different "
          "images) or 'phash' (equal 64-bit perceptual hashes of the reduced picture: also pools most re-encodes, "
          "and different flat or text images)",
          "sha256", ("sha256", "phash")),
    Param("max_texts_per_image", int, "maximum distinct alt-texts of one image", 1000, low=0,
          measure="distinct alt-texts of the image", keep="<=", off=0),
    Param("max_images_per_text", int, "maximum distinct images sharing one alt-text", 10, low=0,
          measure="distinct images of the alt-text", keep="<=", off=0),
    Param("max_ngram_order", int, "n-grams of the rare-n-gram vocabulary: 1 = words (CC12M's word types), "
          "2 = unigrams and bigrams (ALIGN)", 2, low=1, high=2),
    Param("vocab_size", int, "vocabulary = this many most frequent n-grams (ties at the cut kept)", 100_000_000,
          low=0, off=0),
    Param("min_ngram_count", int, "vocabulary = n-grams seen at least this often", 0, low=0,
          measure="occurrences of every n-gram", keep=">=", off=0),
    Param("near_duplicate_threshold", float,
          "cosine above which an image is a near-duplicate of an evaluation image; 0 = embedder's calibrated value",
          0.0, low=0.0, high=1.0),
    Param("num_clusters", int, "k-means clusters for the near-duplicate buckets", 4096, low=1),
    Param("nearest_clusters", int, "clusters per image (ALIGN: top 10)", 10, low=1),
    Param("bucket_size", int, "clusters per bucket (ALIGN: 3 of the 10, C(10,3)=120 buckets); <= nearest_clusters",
          3, low=1),
    Param(
        "near_duplicate_search", str,
        "'exact': k-means lists with a triangle-inequality bound, finds every pair above the threshold; "
        "'buckets': ALIGN's rule (share one of the C(nearest_clusters, bucket_size) buckets), may miss a few pairs",
        "exact", ("exact", "buckets"),
    ),
    Param("kmeans_sample_size", int, "corpus embeddings k-means trains on (a deterministic sample by key hash)",
          250_000, low=1),
    Param(
        "centroid_merge_cosine", float,
        "merge k-means centroids closer than this cosine; 0 = automatic (only for bucket search: "
        "cos(2/3 arccos threshold)), -1 = never (the paper's plain k-means)",
        0.0, low=-1.0, high=1.0,
    ),
    Param("dedup_in_corpus", bool, "also remove near-duplicates inside the corpus", False),
    Param("extra_stages", list,
          "extra stages, each MODULE:ATTRIBUTE naming a filters.extra_stages.RecordStage or CorpusStage "
          "(also --stage); e.g. filters.language:ENGLISH", ()),
    Param("validation_fraction", float, "fraction of written pairs in the held-out validation split (by key hash)",
          0.05, low=0.0, high=1.0),
    Param("output_max_side", int, "re-encode images whose longer side exceeds value (0 keeps sizes)", 512, low=0),
    Param("output_jpeg_quality", int, "JPEG quality when an image is re-encoded", 92, low=1, high=100),
    Param("max_records_per_shard", int, "upper bound used to choose the number of shards", 2000, low=1),
]

PARAMS_BY_NAME = {p.name: p for p in PARAMS}

PRESETS: Dict[str, Dict[str, Any]] = {
    # ALIGN, section 3: pornographic images removed; shorter side > 200 px;
    # aspect ratio < 3; > 1000 alt-texts per image dropped; alt-texts shared by
    # > 10 images dropped; rare tokens outside the 100M most frequent unigrams
    # and bigrams "from the raw dataset" dropped; fewer than 3 or more than 20
    # unigrams dropped.
    "align": {},
    # CC12M, section 2 (relaxing CC3M): JPEG only; both dimensions > 400 px;
    # ratio of larger to smaller dimension no more than 2.5; 3 to 256 words;
    # "maximum fraction of word repetition allowed to 0.2" (repeated words /
    # words); a word *type* is rare below 20 occurrences (instead of CC3M's
    # hypernymised vocabulary). No sharing limits: those are ALIGN's. The
    # part-of-speech, language, unwanted-phrase and person-name steps are
    # stages a user plugs in (docs/extending.md).
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
        "max_texts_per_image": 0,
        "max_images_per_text": 0,
        "max_ngram_order": 1,
        "vocab_size": 0,
        "min_ngram_count": 20,
    },
}


@dataclasses.dataclass(frozen=True)
class Preset:
    """Resolved parameter values; attribute access by canonical name.

    ``overrides`` names the values set on top of the named preset (``--set``
    or keyword values), so that what ran is reported as "align with
    overrides ...", not as "align".
    """

    name: str
    values: tuple  # ((param, value), ...) in PARAMS order; hashable, picklable
    overrides: tuple = ()  # ((param, value), ...) that differ from the named preset

    def __getattr__(self, item):
        try:
            return self._by_name()[item]
        except KeyError:
            raise AttributeError(item) from None

    def _by_name(self) -> Dict[str, Any]:
        # Built once per object (the rules read thresholds for every record); not part of the value.
        by_name = self.__dict__.get("_values_by_name")
        if by_name is None:
            by_name = dict(object.__getattribute__(self, "values"))
            object.__setattr__(self, "_values_by_name", by_name)
        return by_name

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_values_by_name"}

    def as_dict(self) -> Dict[str, Any]:
        return dict(self._by_name())

    def describe(self) -> str:
        """``align`` or ``align with vocab_size=0, min_ngram_count=2``."""
        if not self.overrides:
            return self.name
        return f"{self.name} with " + ", ".join(f"{k}={format_value(v)}" for k, v in self.overrides)


def format_value(value) -> str:
    if isinstance(value, tuple):
        return ",".join(value) if value else "()"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


# ---------------------------------------------------------------------------
# Threshold direction (written once)
# ---------------------------------------------------------------------------


def keep_op(name: str, values: Mapping[str, Any]) -> str:
    """The comparison ``measured OP value`` that keeps a record under rule ``name``."""
    op = PARAMS_BY_NAME[name].keep
    if name == "max_aspect_ratio" and values.get("max_aspect_ratio_inclusive"):
        op = "<="
    if not op:
        raise ValueError(f"{name} is not a threshold rule")
    return op


def rule_enabled(name: str, values: Mapping[str, Any]) -> bool:
    param = PARAMS_BY_NAME[name]
    return param.off is None or values[name] != param.off


def keeps(preset, name: str, measured) -> bool:
    """Does rule ``name`` keep a record whose measured value is ``measured``? (An off rule keeps all.)"""
    values = preset._by_name() if isinstance(preset, Preset) else preset
    if not rule_enabled(name, values):
        return True
    return _COMPARE[keep_op(name, values)](measured, values[name])


def compare(op: str, measured, threshold) -> bool:
    return _COMPARE[op](measured, threshold)


def sense(param: Param, values: Mapping[str, Any]) -> str:
    """How the value is applied, as --print_preset prints it."""
    text = param.doc
    if param.keep:
        op = keep_op(param.name, values)
        text += f": keep if {param.measure} {op} value ({_INCLUSIVE[op]})"
    if param.off is not None:
        text += f"; {format_value(param.off)} disables"
    return text


# ---------------------------------------------------------------------------
# Resolving and checking
# ---------------------------------------------------------------------------


def parse_value(param: Param, text: str) -> Any:
    """An override's text -> a value of the parameter's type (range checked later)."""
    text = text.strip()
    try:
        if param.type is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if param.type is tuple:
            return tuple(s.strip().upper() for s in text.split(",") if s.strip())
        if param.type is list:
            return tuple(s.strip() for s in text.split(",") if s.strip())
        if param.type is int:
            number = float(text)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if param.type is float:
            return float(text)
        return text
    except (ValueError, OverflowError):
        raise PresetError(f"{param.name}: must be {param.allowed()}, got {text!r}") from None


def check_value(param: Param, value: Any) -> Any:
    """``value`` as the parameter's type, or ``PresetError`` naming the parameter and its range."""
    def refuse():
        raise PresetError(f"{param.name}: must be {param.allowed()}, got {value!r}")

    if param.type is bool:
        if not isinstance(value, bool):
            refuse()
        return value
    if param.type is tuple:
        if isinstance(value, str):
            value = tuple(s.strip().upper() for s in value.split(",") if s.strip())
        if not isinstance(value, (tuple, list)) or not value or not all(isinstance(v, str) and v for v in value):
            refuse()
        return tuple(value)
    if param.type is list:
        if isinstance(value, str):
            value = tuple(s.strip() for s in value.split(",") if s.strip())
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) and ":" in v for v in value):
            refuse()
        return tuple(value)
    if param.type is str:
        if not isinstance(value, str) or (param.choices and value not in param.choices):
            refuse()
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        refuse()
    if param.type is int:
        if isinstance(value, float) and not value.is_integer():
            refuse()
        value = int(value)
    else:
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            refuse()
    if not param.low <= value <= param.high:
        refuse()
    return value


def get_preset(name: str, overrides: Optional[Iterable[str]] = None, **values) -> Preset:
    """Resolve a preset with ``NAME=VALUE`` overrides (strings) and keyword values.

    Every value is checked (type, range); a mistake raises ``PresetError``
    with one line naming the parameter and its allowed values.
    """
    if name not in PRESETS:
        raise PresetError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    base = {p.name: p.default for p in PARAMS}
    base.update(PRESETS[name])
    resolved = dict(base)
    for item in overrides or ():
        if "=" not in item:
            raise PresetError(f"--set expects NAME=VALUE, got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip()
        if key not in PARAMS_BY_NAME:
            raise PresetError(f"unknown parameter {key!r}; see --print_preset")
        resolved[key] = parse_value(PARAMS_BY_NAME[key], text)
    for key, value in values.items():
        if key not in PARAMS_BY_NAME:
            raise PresetError(f"unknown parameter {key!r}; see --print_preset")
        resolved[key] = value
    for param in PARAMS:
        resolved[param.name] = check_value(param, resolved[param.name])
    if resolved["bucket_size"] > resolved["nearest_clusters"]:
        raise PresetError(
            f"bucket_size: must be at most nearest_clusters ({resolved['nearest_clusters']}), "
            f"got {resolved['bucket_size']}")
    if resolved["min_words"] > resolved["max_words"]:
        raise PresetError(
            f"min_words: must be at most max_words ({resolved['max_words']}), got {resolved['min_words']}")
    changed = tuple((p.name, resolved[p.name]) for p in PARAMS if resolved[p.name] != check_value(p, base[p.name]))
    return Preset(name, tuple((p.name, resolved[p.name]) for p in PARAMS), changed)


def format_preset(preset: Preset) -> str:
    """Every parameter: value, how it is applied, allowed values; overrides marked with ``*``."""
    values = preset.as_dict()
    changed = dict(preset.overrides)
    rows = [(("* " if p.name in changed else "  ") + p.name, format_value(values[p.name]),
             f"{sense(p, values)} [{p.allowed()}]") for p in PARAMS]
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    lines = [f"preset: {preset.describe()}"]
    lines += [f"{n:<{width}}  {v:<{vwidth}}  {s}" for n, v, s in rows]
    if changed:
        lines.append(f"* set on top of the '{preset.name}' preset")
    return "\n".join(lines)
