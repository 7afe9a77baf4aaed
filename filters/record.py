"""All per-record rules on one candidate, in stage order (pure, no Beam).

When the input states the source size (``Candidate.source_width/height``,
e.g. img2dataset's ``original_width``/``original_height``), the size and
aspect rules judge it instead of the stored image's header, and it is what
the shards' ``original_*`` features carry. The decompression-bomb check
(in ``read_header``) still judges the stored image, which is what gets decoded.

Order (see ``filters.stages``): image header -> format -> size -> aspect ->
text -> text length -> text repetition -> full image decode, with any extra
stages (``filters.extra_stages``) after the stage they name. The first rule
that fails decides the reason; later rules do not run, so a cheap rule always
pays for an expensive one.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, Optional, Tuple

from common.schema import Candidate
from filters import extra_stages
from filters import image as image_rules
from filters import stages
from filters import text as text_rules


def _run_extras(extras, anchor: str, candidate: Candidate, text: str) -> Optional[str]:
    placed = extra_stages.after(extras, anchor)
    if not placed:
        return None
    view = extra_stages.RecordView(candidate.key, candidate.url, text, candidate.format,
                                   candidate.width, candidate.height, candidate.image)
    for stage in placed:
        reason = stage.run(view)
        if reason:
            return reason
    return None


def filter_record(candidate: Candidate, preset, extras=()) -> Tuple[Candidate, Optional[str], Dict[str, float]]:
    """Returns ``(candidate', reason_or_None, measures)``.

    ``candidate'`` carries whatever was learnt before the rejection (format,
    size, normalised text) so the audit can show it; on success it holds the
    bytes to store. ``measures`` feed the audit distributions. ``extras``
    are extra per-record stages (``filters.extra_stages.RecordStage``).
    """
    measures: Dict[str, float] = {}
    header, reason = image_rules.read_header(candidate.image, preset)
    if reason:
        return candidate, reason, measures
    if candidate.source_width and candidate.source_height:
        # The downloader resized the stored image and kept the source size
        # (img2dataset's original_width/height): ALIGN's size and aspect rules
        # are about the image on the web, so they judge that size.
        judged = dataclasses.replace(header, width=candidate.source_width, height=candidate.source_height)
    else:
        judged = header
    candidate = candidate.replace(format=judged.format, width=judged.width, height=judged.height)
    shorter, longer = sorted((judged.width, judged.height))
    measures["shorter_side"] = shorter
    measures["aspect_ratio"] = longer / shorter
    reason = image_rules.check_header(judged, preset) or _run_extras(
        extras, "image_aspect", candidate, text_rules.normalize_text(candidate.alt_text))
    if reason:
        return candidate, reason, measures

    text, reason = text_rules.check_text(candidate.alt_text, preset)
    candidate = candidate.replace(text=text)
    measures["words_per_text"] = text_rules.word_count(text)
    reason = reason or _run_extras(extras, "text_repetition", candidate, text)
    if reason:
        return candidate, reason, measures

    decoded, reason = image_rules.decode_image(candidate.image, header, preset)
    reason = reason or _run_extras(extras, "image_decode", candidate, text)
    if reason:
        return candidate, reason, measures
    return (
        candidate.replace(
            image=decoded.image,
            sha256=decoded.sha256,
            phash=decoded.phash,
            stored_width=decoded.width,
            stored_height=decoded.height,
        ),
        None,
        measures,
    )


#: Rejections that take a row out of the raw counting pool: ``read``,
#: ``image_header`` (no readable image) and ``text`` (no readable alt-text).
#: Every other per-record rejection (format, size, aspect, length,
#: repetition, full decode, NSFW, extra stages) is a quality threshold: the
#: row still counts.
NOT_CANDIDATES = ("read", "image_header", "text")


def counted_row(candidate: Candidate, reason: str, preset) -> Optional[tuple]:
    """The ``(key, sha256, phash, text)`` row a rejected record adds to the counting pool, or None.

    Only with ``counting_base="raw"`` (``filters.frequency``): the corpus-wide
    counts then see every row with a readable image header and alt-text,
    before the quality thresholds. The identity is the one a survivor would
    get (sha256 of the bytes; the pHash only when it is the identity, at the
    cost of a decode; "" when the pixels do not decode).
    """
    if preset.counting_base != "raw" or stages.stage_of(reason) in NOT_CANDIDATES:
        return None
    text, text_reason = text_rules.check_text(candidate.alt_text, preset)
    if text_reason and stages.stage_of(text_reason) == "text":
        return None
    phash = (image_rules.phash_of(candidate.image) or "") if preset.image_identity == "phash" else ""
    return (candidate.key, hashlib.sha256(candidate.image).hexdigest(), phash, text)
