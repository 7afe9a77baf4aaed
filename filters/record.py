"""All per-record rules on one candidate, in stage order (pure, no Beam).

Order (see ``filters.stages``): image header -> format -> size -> aspect ->
text -> text length -> text repetition -> full image decode. The first rule
that fails decides the reason; later rules do not run, so a cheap rule always
pays for an expensive one.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from filters import image as image_rules
from filters import text as text_rules
from pipeline.schema import Candidate


def filter_record(candidate: Candidate, preset) -> Tuple[Candidate, Optional[str], Dict[str, float]]:
    """Returns ``(candidate', reason_or_None, measures)``.

    ``candidate'`` carries whatever was learnt before the rejection (format,
    size, normalised text) so the audit can show it; on success it holds the
    bytes to store. ``measures`` feed the audit distributions.
    """
    measures: Dict[str, float] = {}
    header, reason = image_rules.read_header(candidate.image, preset)
    if reason:
        return candidate, reason, measures
    candidate = candidate.replace(format=header.format, width=header.width, height=header.height)
    shorter, longer = sorted((header.width, header.height))
    measures["shorter_side"] = shorter
    measures["aspect_ratio"] = longer / shorter
    reason = image_rules.check_header(header, preset)
    if reason:
        return candidate, reason, measures

    text, reason = text_rules.check_text(candidate.alt_text, preset)
    candidate = candidate.replace(text=text)
    measures["words_per_text"] = text_rules.word_count(text)
    if reason:
        return candidate, reason, measures

    decoded, reason = image_rules.decode_image(candidate.image, header, preset)
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
