"""The TOnICS ontology as data: object classes, each with its noun set, under one root.

TOnICS ("Curriculum Learning for Data-Efficient Vision-Language
Alignment") samples a node of a two-level ontology at every
training step: the root (``entity``: an ordinary random minibatch) or one of
its object nodes (a minibatch whose pairs all contain that object). An object
class ``o`` has a noun set ``w(o)`` (``dog: dog, dogs, puppy``); a pair
belongs to ``X(o)`` when its alt-text contains one of those nouns.

Shared ground: the build's tagging stage needs the nouns (``filters.concepts``),
the trainer needs the class names (``trainer.curriculum``).

A user's ontology is a JSON file::

    {"root": "entity",
     "classes": {"circle": ["circle", "circles"],
                 "traffic_light": ["traffic light", "traffic lights", "stoplight"]}}

Class names are lower-case words (``[a-z][a-z0-9_]*``: they are written into
the shards' ``concepts`` feature, separated by spaces). A noun is one or more
words, matched case-insensitively on word boundaries (``filters.concepts``);
a noun belongs to one class only. ``load("default")`` is the built-in English
ontology (``common.ontology_english``: COCO's 80 categories and more, with
plurals and common synonyms).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Dict, Tuple

_CLASS_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
DEFAULT = "default"


class OntologyError(ValueError):
    """An ontology that cannot be used; the message is one line naming the problem."""


@dataclasses.dataclass(frozen=True)
class Ontology:
    """``root`` and ``classes``: ((class name, (noun, ...)), ...) in file order."""

    root: str
    classes: Tuple[Tuple[str, Tuple[str, ...]], ...]
    source: str = ""

    @property
    def class_names(self) -> Tuple[str, ...]:
        return tuple(name for name, _ in self.classes)

    def nouns(self) -> Dict[str, str]:
        """noun -> its class (nouns as written, lower-cased, spaces collapsed)."""
        return {noun: name for name, nouns in self.classes for noun in nouns}

    def to_json(self) -> dict:
        return {"root": self.root, "classes": {name: list(nouns) for name, nouns in self.classes}}


def _normal_noun(noun: str) -> str:
    return " ".join(noun.casefold().split())


def from_dict(data, source: str = "") -> Ontology:
    """Validates ``{"root": ..., "classes": {name: [noun, ...]}}``; ``OntologyError`` otherwise."""
    where = f"ontology {source}: " if source else "ontology: "
    if not isinstance(data, dict):
        raise OntologyError(f"{where}expected a JSON object with 'root' and 'classes'")
    unknown = sorted(set(data) - {"root", "classes"})
    if unknown:
        raise OntologyError(f"{where}unknown field(s) {', '.join(map(repr, unknown))} (allowed: root, classes)")
    root = data.get("root", "entity")
    if not isinstance(root, str) or not _CLASS_NAME.match(root):
        raise OntologyError(f"{where}root must be a lower-case word, got {root!r}")
    classes = data.get("classes")
    if not isinstance(classes, dict) or not classes:
        raise OntologyError(f"{where}'classes' must be a non-empty object {{class: [noun, ...]}}")
    owner: Dict[str, str] = {}
    built = []
    for name, nouns in classes.items():
        if not _CLASS_NAME.match(name) or name == root:
            raise OntologyError(f"{where}class name {name!r} must be a lower-case word ([a-z][a-z0-9_]*) "
                                f"other than the root")
        if not isinstance(nouns, list) or not nouns:
            raise OntologyError(f"{where}class {name!r}: expected a non-empty list of nouns")
        normal = []
        for noun in nouns:
            if not isinstance(noun, str) or not _normal_noun(noun):
                raise OntologyError(f"{where}class {name!r}: noun {noun!r} must be a non-empty string")
            noun = _normal_noun(noun)
            if noun in owner and owner[noun] != name:
                raise OntologyError(f"{where}noun {noun!r} is in both {owner[noun]!r} and {name!r}")
            if noun not in owner:
                owner[noun] = name
                normal.append(noun)
        built.append((name, tuple(normal)))
    return Ontology(root=root, classes=tuple(built), source=source)


def load(spec: str) -> Ontology:
    """``"default"`` (the built-in English ontology) or the path of a JSON ontology file (local or gs://)."""
    if spec == DEFAULT:
        from common.ontology_english import ONTOLOGY

        return from_dict(ONTOLOGY, DEFAULT)
    from common.files import exists, read_bytes

    if not exists(spec):
        raise OntologyError(f"ontology {spec}: no such file (give 'default' or a JSON file)")
    try:
        data = json.loads(read_bytes(spec).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OntologyError(f"ontology {spec}: not valid JSON: {error}") from None
    return from_dict(data, spec)
