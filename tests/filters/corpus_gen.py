"""Generated alt-text corpora with planted structure, for the frequency filters' tests.

A corpus is what ``ApplyCorpusFilters`` sees: ``survivors`` (records that
passed the per-record stages, as ``(key, sha256, phash, text)``) and
``counted_only`` (records of the raw counting pool that a per-record stage
rejected: they count, they are not judged); ``all_texts`` is the alt-text of
every row of the pool. The bulk is a small grammar ("red car with black wheels on
the road"): Zipf-weighted words, so its n-grams range from very frequent to
rare, as in real alt-text. Around it, groups of records are planted just on
either side of every threshold; ``Corpus.planted`` names them (name -> keys):

texts per image (limit T = ``texts_limit``)
  ``tpi_over``        one image, T+1 distinct alt-texts
  ``tpi_at``          one image, T distinct alt-texts
  ``tpi_case``        one image, T distinct alt-texts + a case/space variant of one
  ``tpi_phash``       T texts on one file, 1 more on a re-encoded copy (same
                      phash, other sha256): over the limit only by phash
  ``tpi_big_over``/``tpi_big_at``  ``big_image_texts`` + 1 / exactly that many
  ``tpi_wins``        on an over-captioned image, text also has a hapax token
images per text (limit M = ``images_limit``)
  ``ipt_over``        one boilerplate text on M+1 images
  ``ipt_at``          on M images
  ``ipt_phash``       M+1 files, two of them copies of one picture: over only by sha256
  ``ipt_case``        M+1 images, the text in case/space variants
  ``ipt_after_tpi``   M+1 images, one of which is over-captioned (its row is
                      rejected first; the text is still on M+1 images)
  ``ipt_after_tpi_image``  that one row
  ``ipt_small``       M judged images + 1 rejected earlier (too small): over
                      the limit under the raw counting base only
  ``ipt_dup_key``     M images plus an exact duplicate record (same key)
  ``ipt_wins``        M+1 images, text also has a hapax token
rare n-grams (count C = ``rare_count``)
  ``rare_below``/``rare_at``/``rare_above``  a token (and its bigram) occurring
                      C-1 / C / C+1 times in the pool, 3 of them in records
                      that are not survivors
  ``occurrences``     "thricezq thricezq thricezq" on 7 images + 3 more texts:
                      30 unigram and 20 bigram occurrences, but only in 10 texts
  ``hapax``           a token seen once
  ``tie``             6 tokens seen exactly ``tie_count`` times; with
                      ``vocab_size = vocab_size_at_tie`` the K-th largest count
                      is ``tie_count`` and all of them must be kept
  ``below_tie``       tokens seen ``tie_count - 1`` times

Every planted text outside the grammar ends in a *tail* ("photo of a dog")
that is seen at least 2C times, so the planted token is what decides.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Dict, List, Tuple

from common.schema import make_key
from filters.text import ngrams

Row = Tuple[str, str, str, str]

ADJECTIVES = (
    "red blue green black white old new small large happy wooden modern vintage "
    "bright dark empty busy quiet tall little beautiful golden snowy sunny rainy "
    "colorful ancient tiny fresh wild cozy").split()
NOUNS = (
    "car dog cat house tree road beach city street table chair woman man child "
    "flower garden kitchen mountain river lake boat bridge building window door "
    "cake bread coffee book phone bicycle bus train plane bird horse cow sheep "
    "sky sunset forest park church castle wall floor bed sofa lamp shirt dress "
    "shoes hat bag watch ring wheel field market").split()
CONNECTORS = "with on in and of near".split()
TAILS = (
    "photo of a dog",
    "photo of a red car",
    "photo of the beach",
    "photo of a cat on a sofa",
    "photo with a blue sky",
)
BOILERPLATE = (
    "alt img", "click here to enlarge", "image may contain", "untitled photo",
    "wallpaper 1920x1080", "product image", "thumbnail", "no description available",
)


@dataclasses.dataclass
class Corpus:
    survivors: List[Row]
    counted_only: List[Row]
    planted: Dict[str, List[str]]
    tie_count: int
    vocab_size_at_tie: int
    texts_limit: int
    images_limit: int
    rare_count: int

    @property
    def all_texts(self) -> List[str]:
        return [row[3] for row in self.survivors + self.counted_only]


class _Builder:
    def __init__(self, seed: int, texts_limit: int):
        self.rng = random.Random(seed)
        self.texts_limit = texts_limit
        self.survivors: List[Row] = []
        self.counted_only: List[Row] = []
        self.planted: Dict[str, List[str]] = collections.defaultdict(list)
        self.used = set()  # casefolded texts handed out by unique_text
        self.serial = 0
        self.tokens = 0
        self.adj_weights = [1 / (i + 1) ** 1.1 for i in range(len(ADJECTIVES))]
        self.noun_weights = [1 / (i + 1) ** 1.1 for i in range(len(NOUNS))]

    def hexdigits(self, n: int) -> str:
        return f"{self.rng.getrandbits(4 * n):0{n}x}"

    def new_image(self) -> Tuple[str, str]:
        return self.hexdigits(64), self.hexdigits(16)

    def copy_of(self, image: Tuple[str, str]) -> Tuple[str, str]:
        """A re-encoded copy: other bytes (sha256), same picture (phash)."""
        return self.hexdigits(64), image[1]

    def token(self, stem: str) -> str:
        self.tokens += 1
        return f"{stem}{self.tokens}zq"

    def add(self, text: str, image=None, plant: str = "") -> str:
        self.serial += 1
        sha256, phash = image or self.new_image()
        key = make_key(f"https://img.example/{self.serial}.jpg", text)
        self.survivors.append((key, sha256, phash, text))
        if plant:
            self.planted[plant].append(key)
        return key

    def add_rejected_earlier(self, text: str, image=None):
        """A record some per-record stage rejected: it still counts (raw counting base)."""
        self.serial += 1
        sha256, phash = image or self.new_image()
        key = make_key(f"https://img.example/{self.serial}.jpg", text)
        self.counted_only.append((key, sha256, phash, text))

    @property
    def size(self) -> int:
        return len(self.survivors) + len(self.counted_only)

    def grammar_text(self) -> str:
        rng = self.rng

        def phrase():
            noun = rng.choices(NOUNS, self.noun_weights)[0]
            if rng.random() < 0.6:
                return [rng.choices(ADJECTIVES, self.adj_weights)[0], noun]
            return [noun]

        words = phrase()
        for _ in range(rng.randint(0, 3)):
            words += [rng.choice(CONNECTORS)] + phrase()
        if len(words) < 3:
            words = ["photo", "of", "a"] + words
        text = " ".join(words)
        if rng.random() < 0.1:
            text = text.capitalize()
        return text

    def unique_text(self) -> str:
        while True:
            text = self.grammar_text()
            if text.casefold() not in self.used:
                self.used.add(text.casefold())
                return text

    def tail(self) -> str:
        return self.rng.choice(TAILS)


def _plant_texts_per_image(b: _Builder, limit: int, big: int):
    for name, n in (("tpi_over", limit + 1), ("tpi_at", limit)):
        image = b.new_image()
        for _ in range(n):
            b.add(b.unique_text(), image, name)
    image = b.new_image()
    texts = [b.unique_text() for _ in range(limit)]
    for text in texts:
        b.add(text, image, "tpi_case")
    b.add("  " + texts[0].upper().replace(" ", "  ") + " ", image, "tpi_case")
    image = b.new_image()
    for _ in range(limit):
        b.add(b.unique_text(), image, "tpi_phash")
    b.add(b.unique_text(), b.copy_of(image), "tpi_phash")
    image = b.new_image()
    b.add(f"{b.token('hapax')} {b.tail()}", image, "tpi_wins")
    for _ in range(limit):
        b.add(b.unique_text(), image, "tpi_over")
    if big:
        for name, n in (("tpi_big_over", big + 1), ("tpi_big_at", big)):
            image = b.new_image()
            for _ in range(n):
                b.add(b.unique_text(), image, name)


def _plant_images_per_text(b: _Builder, limit: int):
    boiler = iter(BOILERPLATE)
    text = next(boiler)
    for _ in range(limit + 1):
        b.add(text, None, "ipt_over")
    text = next(boiler)
    for _ in range(limit):
        b.add(text, None, "ipt_at")
    text = next(boiler)
    images = [b.new_image() for _ in range(limit)]
    images.append(b.copy_of(images[-1]))
    for image in images:
        b.add(text, image, "ipt_phash")
    text = next(boiler)
    for i in range(limit + 1):
        variant = [text, text.upper(), text.title(), text.replace(" ", "  ")][i % 4]
        b.add(variant, None, "ipt_case")
    text = next(boiler)
    for _ in range(limit):
        b.add(text, None, "ipt_after_tpi")
    crowded = b.new_image()
    b.add(text, crowded, "ipt_after_tpi_image")
    for _ in range(b.texts_limit):
        b.add(b.unique_text(), crowded, "tpi_over")
    text = next(boiler)
    for _ in range(limit):
        b.add(text, None, "ipt_dup_key")
    b.survivors.append(b.survivors[-1])
    text = f"{next(boiler)} {b.token('hapax')}"
    for _ in range(limit + 1):
        b.add(text, None, "ipt_wins")
    text = next(boiler)
    for _ in range(limit):
        b.add(text, None, "ipt_small")
    b.add_rejected_earlier(text)


def _plant_token(b: _Builder, stem: str, count: int, plant: str, elsewhere: int = 0):
    """A token (and its bigram with "photo") in ``count`` texts, ``elsewhere`` of them non-survivors."""
    token = b.token(stem)
    for i in range(count):
        text = f"{token} {TAILS[i % len(TAILS)]}"  # round robin: no text on > 5 images
        if i < elsewhere:
            b.add_rejected_earlier(text)
        else:
            b.add(text, None, plant)


def _plant_rare_ngrams(b: _Builder, rare: int, tie: int):
    for name, count in (("rare_below", rare - 1), ("rare_at", rare), ("rare_above", rare + 1)):
        _plant_token(b, "rare", count, name, elsewhere=3)
    text = "thricezq thricezq thricezq"
    for _ in range(7):
        b.add(text, None, "occurrences")
    for _ in range(3):
        b.add_rejected_earlier(text)
    for _ in range(3):
        b.add(f"{b.token('hapax')} {b.tail()}", None, "hapax")
    for _ in range(6):
        _plant_token(b, "tie", tie, "tie")
    for _ in range(3):
        _plant_token(b, "belowtie", tie - 1, "below_tie")
    # The tails must be frequent under any preset, so the planted token decides.
    for tail in TAILS:
        for _ in range(2 * rare):
            b.add_rejected_earlier(tail)


def _fill(b: _Builder, num_candidates: int):
    regular: List[Row] = []
    while b.size < num_candidates:
        roll = b.rng.random()
        if roll < 0.15:
            b.add_rejected_earlier(b.grammar_text())
        elif roll < 0.16 and regular:
            row = b.rng.choice(regular)  # the same record read twice
            b.survivors.append(row)
        elif roll < 0.19 and regular:
            source = b.rng.choice(regular)
            b.add(b.grammar_text(), b.copy_of((source[1], source[2])))
        else:
            b.add(b.grammar_text())
            regular.append(b.survivors[-1])


def generate(
    num_candidates: int = 20_000,
    seed: int = 0,
    texts_limit: int = 20,
    images_limit: int = 10,
    rare_count: int = 20,
    tie_count: int = 7,
    big_image_texts: int = 0,
) -> Corpus:
    """A corpus of at least ``num_candidates`` input records (survivors + counted_only)."""
    b = _Builder(seed, texts_limit)
    _plant_texts_per_image(b, texts_limit, big_image_texts)
    _plant_images_per_text(b, images_limit)
    _plant_rare_ngrams(b, rare_count, tie_count)
    _fill(b, num_candidates)
    order = list(range(len(b.survivors)))
    b.rng.shuffle(order)  # planted groups must not arrive together
    survivors = [b.survivors[i] for i in order]
    b.rng.shuffle(b.counted_only)

    counts = collections.Counter()
    for row in b.survivors + b.counted_only:
        counts.update(ngrams(row[3]))
    above = sum(1 for c in counts.values() if c > tie_count)
    tied = sum(1 for c in counts.values() if c == tie_count)
    assert tied >= 12, "the tie group must hold at least the planted tokens and bigrams"
    return Corpus(
        survivors=survivors,
        counted_only=b.counted_only,
        planted=dict(b.planted),
        tie_count=tie_count,
        # The smallest K whose K-th largest count is tie_count: keeping exactly
        # K n-grams would drop all but one of the tied ones.
        vocab_size_at_tie=above + 1,
        texts_limit=texts_limit,
        images_limit=images_limit,
        rare_count=rare_count,
    )
