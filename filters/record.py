"""All per-record rules on one candidate, in stage order (pure, no Beam).

When the input states the source size (``Candidate.source_width/height``,
e.g. img2dataset's ``original_width``/``original_height``), the size and
aspect rules judge it instead of the stored image's header, and it is what
the shards' ``original_*`` features carry. The decompression-bomb check
(in ``read_header``) still judges the stored image, which is what gets decoded.

Order (see ``filters.stages``): image header -> format -> size -> aspect ->
text -> text length -> text repetition -> image decode, with any extra
stages (``filters.extra_stages``) after the stage they name. The first rule
that fails decides the reason; later rules do not run, so a cheap rule always
pays for an expensive one. The decode is the reduced one that gives the
image's identity (``filters.image.identify``); the stored picture is made
only for the records a build writes (``filters.image.stored_picture``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, Optional

from common.schema import Candidate
from filters import extra_stages
from filters import image as image_rules
from filters import stages
from filters import text as text_rules


def _run_extras(extras, anchor: str, candidate: Candidate, text: str, fmt: str, width: int, height: int) -> Optional[str]:
    placed = extra_stages.after(extras, anchor)
    if not placed:
        return None
    view = extra_stages.RecordView(candidate.key, candidate.url, text, fmt, width, height, candidate.image)
    for stage in placed:
        reason = stage.run(view)
        if reason:
            return reason
    return None


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What the per-record rules decided about one candidate.

    ``candidate`` carries whatever was learnt before a rejection (format,
    size, normalised text, hashes) so the audit can show it; ``reason`` is
    the first failing rule (None: every per-record rule passed);
    ``measures`` feed the audit distributions; ``counted`` says whether the
    record is in the corpus-wide counting pool (``filters.frequency``);
    ``stored_size`` is the picture's size when the shard stores its bytes as
    they came (``filters.image.stored_as_read``), else None.
    """

    candidate: Candidate
    reason: Optional[str]
    measures: Dict[str, float]
    counted: bool
    stored_size: Optional[tuple] = None


def judge_record(candidate: Candidate, preset, extras=()) -> Judgement:
    """Every per-record rule on ``candidate``; ``extras`` are extra per-record stages."""
    header, reason, opened = image_rules.open_header(candidate.image, preset)
    if reason:
        return Judgement(candidate, reason, {}, False)
    try:
        return _judge_opened(candidate, header, opened, preset, extras)
    finally:
        opened.close()  # a no-op once identify decoded it


def _judge_opened(candidate: Candidate, header, opened, preset, extras) -> Judgement:
    if candidate.source_width and candidate.source_height:
        # The downloader resized the stored image and kept the source size
        # (img2dataset's original_width/height): ALIGN's size and aspect rules
        # are about the image on the web, so they judge that size.
        judged = dataclasses.replace(header, width=candidate.source_width, height=candidate.source_height)
    else:
        judged = header
    fmt, width, height = judged.format, judged.width, judged.height
    shorter, longer = sorted((width, height))
    measures: Dict[str, float] = {"shorter_side": shorter, "aspect_ratio": longer / shorter}
    reason = image_rules.check_header(judged, preset) or _run_extras(
        extras, "image_aspect", candidate, text_rules.normalize_text(candidate.alt_text), fmt, width, height)
    if reason:
        return _rejected(candidate.replace(format=fmt, width=width, height=height), header, reason, measures, preset)

    text, reason = text_rules.check_text(candidate.alt_text, preset)
    measures["words_per_text"] = text_rules.word_count(text)
    reason = reason or _run_extras(extras, "text_repetition", candidate, text, fmt, width, height)
    if reason:
        learnt = candidate.replace(format=fmt, width=width, height=height, text=text)
        return _rejected(learnt, header, reason, measures, preset)

    identity, reason = image_rules.identify(candidate.image, header, opened)
    learnt = candidate.replace(format=fmt, width=width, height=height, text=text,
                               sha256=identity.sha256 if identity else "", phash=identity.phash if identity else "")
    reason = reason or _run_extras(extras, "image_decode", learnt, text, fmt, width, height)
    if reason:
        return _rejected(learnt, header, reason, measures, preset)
    stored_size = (header.width, header.height) if image_rules.stored_as_read(header, preset) else None
    return Judgement(learnt, None, measures, True, stored_size)


#: Rejections that take a row out of the raw counting pool: ``read``,
#: ``image_header`` (no readable image) and ``text`` (no readable alt-text).
#: Every other per-record rejection (format, size, aspect, length,
#: repetition, decode, NSFW, extra stages) is a quality threshold: the row
#: still counts.
NOT_CANDIDATES = ("read", "image_header", "text")


def _rejected(candidate: Candidate, header, reason: str, measures, preset) -> Judgement:
    """A rejection, with the identity a survivor would get when the row stays in the counting pool.

    Only with ``counting_base="raw"`` (``filters.frequency``) does a rejected
    row count: every row with a readable image header and alt-text, before
    the quality thresholds. Its identity is the sha256 of its bytes and, only
    when the pHash is the identity, the pHash (a decode; "" when the pixels
    do not decode).
    """
    if not in_counting_pool(candidate, reason, preset):
        return Judgement(candidate, reason, measures, False)
    text, _ = text_rules.check_text(candidate.alt_text, preset)
    sha256 = candidate.sha256 or hashlib.sha256(candidate.image).hexdigest()
    phash = candidate.phash
    if preset.image_identity == "phash" and not phash:
        identity, _ = image_rules.identify(candidate.image, header)
        phash = identity.phash if identity else ""
    return Judgement(candidate.replace(text=text, sha256=sha256, phash=phash if preset.image_identity == "phash" else ""),
                     reason, measures, True)


def in_counting_pool(candidate: Candidate, reason: str, preset) -> bool:
    """Whether a row that ``reason`` rejected still counts in the corpus-wide counts."""
    if preset.counting_base != "raw" or stages.stage_of(reason) in NOT_CANDIDATES:
        return False
    _, text_reason = text_rules.check_text(candidate.alt_text, preset)
    return not (text_reason and stages.stage_of(text_reason) == "text")
