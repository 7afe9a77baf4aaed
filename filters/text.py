"""Per-record alt-text rules: normalisation, tokenisation, length, repetition.

Tokenisation (used for word counts *and* for the n-gram vocabulary, so both
agree): the normalised text is case-folded and split into words, a word being
a run of letters/digits/underscore, optionally joined by apostrophes
("don't", "o'neil"). Punctuation and symbols separate words and are not
words themselves. Unigrams are the words; bigrams are adjacent word pairs
joined by one space.
"""

from __future__ import annotations

import re
import unicodedata
from typing import List

from filters import stages
from filters.presets import keeps

_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")
# Control, format (zero-width, BOM, bidi marks) and separator characters other
# than a plain space become whitespace; then runs of whitespace collapse.
_SPACE_LIKE = re.compile(r"[\s\u200b-\u200f\u2028-\u202f\u205f-\u206f\ufeff\x00-\x1f\x7f-\x9f]+")


def normalize_text(raw: str) -> str:
    """Unicode NFC, invisible/control characters to spaces, whitespace collapsed."""
    text = unicodedata.normalize("NFC", raw)
    text = _SPACE_LIKE.sub(" ", text)
    return text.strip()


def words(text: str) -> List[str]:
    return _WORD.findall(text.casefold())


def ngrams(text: str, max_order: int = 2) -> List[str]:
    """Unigrams then (``max_order`` 2) bigrams of ``text``, with repeats, in order."""
    toks = words(text)
    if max_order < 2:
        return toks
    return toks + [f"{a} {b}" for a, b in zip(toks, toks[1:])]


def check_text(raw: str, preset) -> tuple:
    """Apply the per-record text rules. Returns ``(normalised, reason_or_None)``.

    Rules in stage order: ``text`` (empty after normalisation, replacement
    characters from a broken decode, more than ``max_chars``), ``text_length``
    (unigrams in [min_words, max_words], inclusive), ``text_repetition``.
    """
    text = normalize_text(raw)
    if not text:
        return text, stages.reason("text", "empty")
    if "\ufffd" in text:
        return text, stages.reason("text", "invalid_encoding")
    if not keeps(preset, "max_chars", len(text)):
        return text, stages.reason("text", "too_long_chars")
    toks = words(text)
    if not keeps(preset, "min_words", len(toks)):
        return text, stages.reason("text_length", "too_few_words")
    if not keeps(preset, "max_words", len(toks)):
        return text, stages.reason("text_length", "too_many_words")
    if toks and not keeps(preset, "max_word_repetition", repetition(toks)):
        return text, stages.reason("text_repetition", "repetitive")
    return text, None


def repetition(toks: List[str]) -> float:
    """CC12M's "fraction of word repetition": repeated words / words = 1 - distinct/total.

    "a cat on a mat" is 1 - 4/5 = 0.2; "red sports car" is 0.
    """
    # (total - distinct) / total, not 1 - distinct/total: 1/5 is the double
    # 0.2 exactly, while 1 - 4/5 is not.
    return (len(toks) - len(set(toks))) / len(toks)


def word_count(text: str) -> int:
    return len(words(text))


def text_identity(text: str) -> str:
    """What the frequency filters count as one alt-text: normalised, case-folded."""
    return normalize_text(text).casefold()


def decode_caption(value) -> tuple:
    """Caption cell -> ``(str, reason_or_None)``; bytes must be valid UTF-8."""
    if value is None:
        return "", stages.reason("read", "missing_caption")
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError:
            return value.decode("utf-8", "replace"), stages.reason("read", "caption_not_utf8")
    if not isinstance(value, str):
        return str(value), stages.reason("read", "caption_not_text")
    return value, None
