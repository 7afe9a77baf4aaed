"""Extra stages: a user's rule, placed in the stage order by name.

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

An *extra corpus stage* is a sharing rule over the whole corpus, like
ALIGN's "alt-text shared by more than 10 images": ``group(view)`` names the
group a record belongs to (or None: in no group), and a group with more than
``max_count`` distinct ``counts`` ("images" or "texts") loses every pair::

    def caption_template(row):          # row: CorpusView (key, text, image)
        return re.sub(r"[0-9]+", "#", row.text.casefold())

    NUMBERED = CorpusStage("caption_template", after="images_per_text", group=caption_template,
                           counts="images", max_count=10, reason="shared_template")

It counts over the preset's counting pool (``counting_base``, as the
built-in corpus stages do), goes after ``images_per_text`` or
``rare_ngrams``, and rejects as ``"<name>/<reason>"``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

from filters import stages

#: The built-in per-record stages an extra per-record stage may follow, in run order.
ANCHORS = ("image_aspect", "text_repetition", "image_decode")
#: The built-in corpus stages an extra corpus stage may follow.
CORPUS_ANCHORS = ("images_per_text", "rare_ngrams")
#: What a corpus stage counts per group: distinct images or distinct alt-texts.
COUNTS = ("images", "texts")
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
        _check_name(self.name)
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


@dataclasses.dataclass(frozen=True)
class CorpusView:
    """What an extra corpus stage's ``group`` sees of a candidate (no image bytes)."""

    key: str
    text: str  # normalised alt-text (filters.text.normalize_text)
    image: str  # the image's identity under the preset's image_identity


def _check_name(name: str) -> None:
    if not _NAME.match(name) or name in stages.STAGE_INDEX:
        raise ValueError(f"extra stage name {name!r} must be a new lower_case word "
                         f"(not one of the built-in stages)")


@dataclasses.dataclass(frozen=True)
class CorpusStage:
    name: str
    after: str
    group: Callable[[CorpusView], Optional[str]]
    counts: str
    max_count: int
    reason: str
    description: str = ""
    source: str = ""

    def __post_init__(self):
        _check_name(self.name)
        if self.after not in CORPUS_ANCHORS:
            raise ValueError(f"extra corpus stage {self.name!r}: after must be one of {', '.join(CORPUS_ANCHORS)}, "
                             f"got {self.after!r}")
        if self.counts not in COUNTS:
            raise ValueError(f"extra corpus stage {self.name!r}: counts must be one of {', '.join(COUNTS)}, "
                             f"got {self.counts!r}")
        if not isinstance(self.max_count, int) or isinstance(self.max_count, bool) or self.max_count < 1:
            raise ValueError(f"extra corpus stage {self.name!r}: max_count must be an integer >= 1, got {self.max_count!r}")
        if not isinstance(self.reason, str) or not _NAME.match(self.reason):
            raise ValueError(f"extra corpus stage {self.name!r}: reason must be a lower_case word, got {self.reason!r}")
        if not callable(self.group):
            raise ValueError(f"extra corpus stage {self.name!r}: group must be callable")

    @property
    def reasons(self) -> Tuple[str, ...]:
        return (self.reason,)

    @property
    def rejection(self) -> str:
        return f"{self.name}/{self.reason}"

    def group_of(self, view: CorpusView) -> Optional[str]:
        group = self.group(view)
        if group is not None and not isinstance(group, str):
            raise ValueError(f"extra corpus stage {self.name!r}: group returned {type(group).__name__}, not str or None")
        return group

    def member_of(self, view: CorpusView) -> str:
        """What is counted distinct in the group (the alt-text counts case-folded, as the built-ins do)."""
        return view.image if self.counts == "images" else view.text.casefold()


ExtraStage = Union[RecordStage, CorpusStage]


def load(spec: str) -> ExtraStage:
    """``"module:ATTRIBUTE"`` -> the stage it names (a clear one-line error otherwise)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"extra stage {spec!r}: expected MODULE:ATTRIBUTE, e.g. filters.language:ENGLISH")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"extra stage {spec!r}: cannot import {module_name}: {error}") from None
    stage = getattr(module, attribute, None)
    if not isinstance(stage, (RecordStage, CorpusStage)):
        raise ValueError(f"extra stage {spec!r}: {module_name}.{attribute} is not a "
                         f"filters.extra_stages.RecordStage or CorpusStage")
    return dataclasses.replace(stage, source=spec)


def load_all(specs: Iterable[str]) -> Tuple[ExtraStage, ...]:
    loaded = tuple(load(s) for s in specs)
    names = [s.name for s in loaded]
    if len(set(names)) != len(names):
        raise ValueError(f"extra stages with the same name: {', '.join(names)}")
    return loaded


def stage_list(extras: Iterable[ExtraStage] = ()) -> Tuple[Tuple[str, str], ...]:
    """``filters.stages.STAGES`` with the extra stages inserted after their anchors."""
    extras = list(extras)
    out: List[Tuple[str, str]] = []
    for name, description in stages.STAGES:
        out.append((name, description))
        out += [(e.name, e.description or f"extra stage {e.source or e.name}") for e in extras if e.after == name]
    return tuple(out)


def stage_rank(extras: Iterable[ExtraStage] = ()) -> Dict[str, int]:
    """Stage name -> position in the run order, extra stages included (first reason wins by it)."""
    return {name: i for i, (name, _) in enumerate(stage_list(extras))}


def record_stages(extras: Iterable[ExtraStage]) -> Tuple[RecordStage, ...]:
    return tuple(e for e in extras if isinstance(e, RecordStage))


def corpus_stages(extras: Iterable[ExtraStage]) -> Tuple[CorpusStage, ...]:
    """The extra corpus stages in run order (by anchor, then as given)."""
    extras = [e for e in extras if isinstance(e, CorpusStage)]
    return tuple(e for anchor in CORPUS_ANCHORS for e in extras if e.after == anchor)


def after(extras: Iterable[ExtraStage], anchor: str) -> Tuple[ExtraStage, ...]:
    return tuple(e for e in extras if e.after == anchor)
