"""A deliberately simple, in-memory implementation of the whole-corpus filters.

Written from the rules (the ``filters/frequency.py`` and
``filters/ngram_vocab.py`` docstrings state them) without importing the Beam
code: pandas group-bys for the two sharing rules, a ``Counter`` and a
sort for the vocabulary. It holds everything in one process, which is the
point: it is easy to check by reading, and the Beam job must agree with it
record for record.

Rules (a row is a record ``(key, sha256, phash, text)``; a key is reported
once, with its earliest reason). Every count is over the pool = survivors +
counted_only (rows an earlier stage rejected, which under the raw counting
base still count); verdicts are on the survivors. A limit of 0 turns a
sharing rule off.

1. image = phash (or sha256 with ``image_identity="sha256"``); a missing hash
   falls back to sha256, then to the record's own key. An image with more than
   ``max_texts_per_image`` distinct alt-texts (``normalize_text(t).casefold()``)
   in the pool loses all its rows.
2. An alt-text with more than ``max_images_per_text`` distinct images in the
   pool loses all its rows.
3. n-gram counts = occurrences of ``filters.text.ngrams`` (up to
   ``max_ngram_order``) over the pool's alt-texts. Threshold = the K-th
   largest count (all n-grams tied with it kept; 1 if fewer than K n-grams)
   when ``vocab_size = K > 0``, and at least ``min_ngram_count``. A row with
   any n-gram counted below the threshold (or never counted) is rejected. No
   rule if both are 0.
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
    survivors: Iterable[Tuple[str, str, str, str]], counted_only: Iterable[Tuple[str, str, str, str]], preset
) -> Tuple[Dict[str, str], Dict[str, dict]]:
    """Returns ``({key: reason}, {stat name: value})``."""
    survivors, counted_only = list(survivors), list(counted_only)
    columns = ["key", "sha256", "phash", "text"]
    df = pd.DataFrame(survivors, columns=columns)
    pool = pd.DataFrame(survivors + counted_only, columns=columns)
    for frame in (df, pool):
        frame["image"] = [_image(k, s, p, preset.image_identity)
                          for k, s, p in zip(frame["key"], frame["sha256"], frame["phash"])]
        frame["alt"] = [normalize_text(t).casefold() for t in frame["text"]]
    reasons: Dict[str, str] = {}
    stats: Dict[str, dict] = {}

    if preset.max_texts_per_image > 0:
        texts_per_image = pool.groupby("image")["alt"].nunique()
        stats["texts_per_image"] = _histogram(texts_per_image, preset.max_texts_per_image)
        crowded = set(texts_per_image[texts_per_image > preset.max_texts_per_image].index)
        for key in df.loc[df["image"].isin(crowded), "key"]:
            reasons.setdefault(key, TEXTS_PER_IMAGE)

    if preset.max_images_per_text > 0:
        images_per_text = pool.groupby("alt")["image"].nunique()
        stats["images_per_text"] = _histogram(images_per_text, preset.max_images_per_text)
        shared = set(images_per_text[images_per_text > preset.max_images_per_text].index)
        for key in df.loc[df["alt"].isin(shared), "key"]:
            reasons.setdefault(key, IMAGES_PER_TEXT)

    if preset.vocab_size > 0 or preset.min_ngram_count > 0:
        order = preset.max_ngram_order
        counts = collections.Counter()
        for text in pool["text"]:
            counts.update(ngrams(text, order))
        threshold = vocabulary_threshold(counts, preset.vocab_size, preset.min_ngram_count)
        for key, text in zip(df["key"], df["text"]):
            if any(counts.get(g, 0) < threshold for g in ngrams(text, order)):
                reasons.setdefault(key, RARE_NGRAM)
        stats["count_of_counts"] = {
            "counts": dict(collections.Counter(counts.values())),
            "cut_count": threshold,
            "vocab_size": sum(1 for c in counts.values() if c >= threshold),
            "num_ngrams": len(counts),
            "num_occurrences": sum(counts.values()),
        }
    return reasons, stats
