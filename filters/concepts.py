"""TOnICS tagging: which ontology classes an alt-text names.

A pair belongs to class ``o`` (its instance set ``X(o)`` in the paper) when
its alt-text contains one of ``o``'s nouns. Words are the text filters' words
(``filters.text.words``: case-folded runs of letters, digits and
underscores), and a noun is matched as a sequence of those words, so "Dogs!"
names ``dog`` and "hotdogs" does not. Where nouns overlap the longest match
wins, left to right: "a hot dog stand" is ``hot_dog``, not ``dog``.

Image-side evidence. The paper's instance sets require the object in the
*image* too (VinVL detections) and in the caption. Where a user has a
detector's labels for each image, they pass them as a carried input column
(``--carry_columns labels --concept_labels_column labels``: class names
separated by commas or spaces); a class is then tagged only when the text
names it *and* the detector saw it. Without labels, the text alone decides.

Tagging never rejects a record: it adds the ``concepts`` feature (class
names in ontology order, separated by spaces; empty when none).
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, Optional, Tuple

from common.ontology import Ontology
from filters.text import words

_LABEL_SPLIT = re.compile(r"[\s,;]+")


class Tagger:
    """Matches an ontology's nouns in alt-texts (picklable: plain dicts and tuples)."""

    def __init__(self, ontology: Ontology):
        self.class_names = ontology.class_names
        self._order = {name: i for i, name in enumerate(self.class_names)}
        # noun as a tuple of words -> class; nouns that tokenise to nothing cannot match.
        self._phrases: Dict[Tuple[str, ...], str] = {}
        for noun, name in ontology.nouns().items():
            toks = tuple(words(noun))
            if toks:
                self._phrases.setdefault(toks, name)
        self._longest = max((len(p) for p in self._phrases), default=0)

    def tag(self, text: str, image_labels: Optional[Iterable[str]] = None) -> Tuple[str, ...]:
        """The classes ``text`` names (and ``image_labels`` confirm, if given), in ontology order."""
        toks = words(text)
        found = set()
        i = 0
        while i < len(toks):
            for size in range(min(self._longest, len(toks) - i), 0, -1):
                name = self._phrases.get(tuple(toks[i : i + size]))
                if name is not None:
                    found.add(name)
                    i += size
                    break
            else:
                i += 1
        if image_labels is not None:
            found &= set(image_labels)
        return tuple(sorted(found, key=self._order.__getitem__))


def parse_labels(value: str) -> Tuple[str, ...]:
    """A detector-labels cell (``"dog, frisbee"``) -> class names."""
    return tuple(label for label in _LABEL_SPLIT.split(value.strip().casefold()) if label)


def encode(classes: Iterable[str]) -> str:
    """The ``concepts`` feature's text: class names separated by single spaces."""
    return " ".join(classes)
