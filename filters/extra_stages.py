"""Extra per-record stages: a user's rule, placed in the stage order by name.

CC12M has steps this project does not build in (a part-of-speech rule, a
language rule, unwanted phrases, person-name substitution). A user adds such
a rule as an *extra stage*: a pure function of one record plus the reasons it
can give, placed after a built-in per-record stage. It then runs inside the
per-record pass like a built-in stage (first reason wins, in the stage order),
and appears in the funnel, the audit, the ledger and the Beam counters under
its own name::

    # my_rules.py
    from filters.extra_stages import RecordStage

    def no_links(record):
        return "has_link" if "http" in record.text else None

    NO_LINKS = RecordStage("no_links", after="text_repetition", check=no_links,
                           reasons=("has_link",), description="the alt-text holds no link")

    python -m pipeline.build ... --stage my_rules:NO_LINKS
    python -m pipeline.build ... --set extra_stages=my_rules:NO_LINKS     # the same, as a preset value

``check(record) -> detail or None`` gets a ``RecordView`` (the normalised
alt-text, url, image format and oriented size, the image bytes) and returns
one of its ``reasons`` (the rejection is ``"<name>/<detail>"``) or None to
keep the record. It must be deterministic and picklable (a module-level
function, or a callable object whose heavy state loads lazily): workers run it.

Where an extra stage can go (``after``): after ``image_aspect`` (header facts
known, before the text rules), after ``text_repetition`` (the text rules
passed, before the full decode) or after ``image_decode`` (every built-in
per-record rule passed). Several extras after one stage run in the order they
are given.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Callable, Iterable, List, Optional, Tuple

from filters import stages

#: The built-in per-record stages an extra stage may follow, in run order.
ANCHORS = ("image_aspect", "text_repetition", "image_decode")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class RecordView:
    """What an extra per-record stage sees of a candidate (read-only)."""

    key: str
    url: str
    text: str  # normalised alt-text (filters.text.normalize_text)
    format: str
    width: int  # after EXIF orientation
    height: int
    image: bytes


@dataclasses.dataclass(frozen=True)
class RecordStage:
    name: str
    after: str
    check: Callable[[RecordView], Optional[str]]
    reasons: Tuple[str, ...]
    description: str = ""
    source: str = ""  # "module:ATTRIBUTE" it was loaded from, for the funnel

    def __post_init__(self):
        if not _NAME.match(self.name) or self.name in stages.STAGE_INDEX:
            raise ValueError(f"extra stage name {self.name!r} must be a new lower_case word "
                             f"(not one of the built-in stages)")
        if self.after not in ANCHORS:
            raise ValueError(f"extra stage {self.name!r}: after must be one of {', '.join(ANCHORS)}, got {self.after!r}")
        if not self.reasons or not all(_NAME.match(r) for r in self.reasons):
            raise ValueError(f"extra stage {self.name!r}: reasons must be lower_case words, got {self.reasons!r}")
        if not callable(self.check):
            raise ValueError(f"extra stage {self.name!r}: check must be callable")

    def run(self, view: RecordView) -> Optional[str]:
        """The rejection reason ``"<name>/<detail>"`` or None."""
        detail = self.check(view)
        if detail is None:
            return None
        if detail not in self.reasons:
            raise ValueError(f"extra stage {self.name!r} returned {detail!r}, not one of its reasons {self.reasons}")
        return f"{self.name}/{detail}"


def load(spec: str) -> RecordStage:
    """``"module:ATTRIBUTE"`` -> the ``RecordStage`` it names (a clear one-line error otherwise)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"extra stage {spec!r}: expected MODULE:ATTRIBUTE, e.g. filters.language:ENGLISH")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"extra stage {spec!r}: cannot import {module_name}: {error}") from None
    stage = getattr(module, attribute, None)
    if not isinstance(stage, RecordStage):
        raise ValueError(f"extra stage {spec!r}: {module_name}.{attribute} is not a filters.extra_stages.RecordStage")
    return dataclasses.replace(stage, source=spec)


def load_all(specs: Iterable[str]) -> Tuple[RecordStage, ...]:
    loaded = tuple(load(s) for s in specs)
    names = [s.name for s in loaded]
    if len(set(names)) != len(names):
        raise ValueError(f"extra stages with the same name: {', '.join(names)}")
    return loaded


def stage_list(extras: Iterable[RecordStage] = ()) -> Tuple[Tuple[str, str], ...]:
    """``filters.stages.STAGES`` with the extra stages inserted after their anchors."""
    extras = list(extras)
    out: List[Tuple[str, str]] = []
    for name, description in stages.STAGES:
        out.append((name, description))
        out += [(e.name, e.description or f"extra stage {e.source or e.name}") for e in extras if e.after == name]
    return tuple(out)


def after(extras: Iterable[RecordStage], anchor: str) -> Tuple[RecordStage, ...]:
    return tuple(e for e in extras if e.after == anchor)
