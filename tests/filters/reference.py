"""A deliberately simple, in-memory implementation of the whole-corpus filters.

Written from the rules (issue 3; ``filters/frequency.py`` and
``filters/ngram_vocab.py`` docstrings state the same rules) without importing
the Beam code: pandas group-bys for the two sharing rules, a ``Counter`` and a
sort for the vocabulary. It holds everything in one process, which is the
point: it is easy to check by reading, and the Beam job must agree with it
record for record.

Rules, in order, each over the survivors of the previous one (a row is a
record ``(key, sha256, phash, text)``; a key is reported once, with its
earliest reason):

1. image = phash (or sha256 with ``image_identity="sha256"``); a missing hash
   falls back to sha256, then to the record's own key. An image with more than
   ``max_texts_per_image`` distinct alt-texts (``normalize_text(t).casefold()``)
   loses all its rows.
2. An alt-text with more than ``max_images_per_text`` distinct images loses
   all its rows.
3. n-gram counts = occurrences of ``filters.text.ngrams`` over all raw
   alt-texts. Threshold = the K-th largest count (all n-grams tied with it
   kept; 1 if fewer than K n-grams) when ``vocab_size = K > 0``, and at least
   ``min_ngram_count``. A row with any n-gram counted below the threshold
   (or never counted) is rejected. No rule if both are 0.
"""

from __future__ import annotations

import collections
from typing import Dict, Iterable, List, Tuple

import numpy as np
import pandas as pd

from filters.text import ngrams, normalize_text

TEXTS_PER_IMAGE = "texts_per_image/too_many_texts"
IMAGES_PER_TEXT = "images_per_text/shared_text"
RARE_NGRAM = "rare_ngrams/rare_ngram"


def _image(key: str, sha256: str, phash: str, identity: str) -> str:
    primary = phash if identity == "phash" else sha256
    if primary:
        return primary
    if sha256:
        return sha256
    return "key:" + key


def _edges(limit: int) -> List[int]:
    powers = [2**i for i in range(64) if 2**i <= limit]
    return powers + [limit + 1, limit + 2]


def _histogram(distinct_counts: pd.Series, limit: int) -> dict:
    edges = _edges(limit)
    capped = np.minimum(distinct_counts.to_numpy(), limit + 1)
    counts, _ = np.histogram(capped, bins=edges)
    return {"edges": edges, "counts": [int(c) for c in counts]}


def vocabulary_threshold(counts: Dict[str, int], vocab_size: int, min_ngram_count: int) -> int:
    threshold = 0
    if vocab_size > 0:
        ordered = sorted(counts.values(), reverse=True)
        threshold = ordered[vocab_size - 1] if len(ordered) >= vocab_size else 1
    if min_ngram_count > 0:
        threshold = max(threshold, min_ngram_count)
    return threshold


def corpus_filters(
    survivors: Iterable[Tuple[str, str, str, str]], all_texts: Iterable[str], preset
) -> Tuple[Dict[str, str], Dict[str, dict]]:
    """Returns ``({key: reason}, {stat name: value})``."""
    df = pd.DataFrame(list(survivors), columns=["key", "sha256", "phash", "text"])
    df["image"] = [_image(k, s, p, preset.image_identity) for k, s, p in zip(df["key"], df["sha256"], df["phash"])]
    df["alt"] = [normalize_text(t).casefold() for t in df["text"]]
    reasons: Dict[str, str] = {}
    stats: Dict[str, dict] = {}

    texts_per_image = df.groupby("image")["alt"].nunique()
    stats["texts_per_image"] = _histogram(texts_per_image, preset.max_texts_per_image)
    crowded = set(texts_per_image[texts_per_image > preset.max_texts_per_image].index)
    dropped = df["image"].isin(crowded)
    for key in df.loc[dropped, "key"]:
        reasons.setdefault(key, TEXTS_PER_IMAGE)
    df = df[~dropped]

    images_per_text = df.groupby("alt")["image"].nunique()
    stats["images_per_text"] = _histogram(images_per_text, preset.max_images_per_text)
    shared = set(images_per_text[images_per_text > preset.max_images_per_text].index)
    dropped = df["alt"].isin(shared)
    for key in df.loc[dropped, "key"]:
        reasons.setdefault(key, IMAGES_PER_TEXT)
    df = df[~dropped]

    if preset.vocab_size > 0 or preset.min_ngram_count > 0:
        counts = collections.Counter()
        for text in all_texts:
            counts.update(ngrams(text))
        threshold = vocabulary_threshold(counts, preset.vocab_size, preset.min_ngram_count)
        for key, text in zip(df["key"], df["text"]):
            if any(counts.get(g, 0) < threshold for g in ngrams(text)):
                reasons.setdefault(key, RARE_NGRAM)
        stats["count_of_counts"] = {
            "counts": dict(collections.Counter(counts.values())),
            "cut_count": threshold,
            "vocab_size": sum(1 for c in counts.values() if c >= threshold),
            "num_ngrams": len(counts),
            "num_occurrences": sum(counts.values()),
        }
    return reasons, stats
