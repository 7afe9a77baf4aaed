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

The rules come in two parts, so that one image named by many rows (a
popular URL of a downloaded list) is judged once:

- the image part, ``judge_image``: what the bytes alone say (``ImageFacts``:
  the header with its decompression-bomb check, sha256, the reduced
  decode's pHash or its failure);
- the row part, ``judge_row``: every rule in stage order over one row (its
  alt-text, its stated source size) and an image's facts.

``judge_record`` is the row part over an image opened where it is and
decoded only when a rule reaches the decode (never for a record whose text
fails). ``judge_row(c, judge_image(c.image, preset))`` gives the same
``Judgement`` for every record (``tests/filters/test_record_parts.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Dict, Optional, Tuple

from common.schema import Candidate
from filters import extra_stages
from filters import image as image_rules
from filters import stages
from filters import text as text_rules


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


# ---------------------------------------------------------------------------
# The image part
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ImageFacts:
    """What an image's bytes alone say, for the row part (``judge_row``).

    ``header`` is None when the header is unreadable (``header_reason``, an
    ``image_header/...`` rejection). ``decoded``: the reduced decode ran,
    giving ``phash`` or ``decode_reason`` (``image_decode/...``); an image
    judged without it (no row of it needs it) has no identity to give.
    ``read`` returns the bytes again, for extra per-record stages.
    """

    header: Optional[image_rules.Header]
    header_reason: Optional[str] = None
    sha256: str = ""
    phash: str = ""
    decode_reason: Optional[str] = None
    decoded: bool = False
    read: Optional[Callable[[], bytes]] = dataclasses.field(default=None, compare=False, repr=False)

    def digest(self) -> str:
        return self.sha256

    def identity(self) -> Tuple[str, Optional[str]]:
        """``(phash, None)`` or ``("", image_decode/...)``."""
        if not self.decoded:
            raise ValueError("these image facts were judged without the decode a row now needs")
        return self.phash, self.decode_reason

    def data(self) -> bytes:
        if self.read is None:
            raise ValueError("these image facts cannot read their bytes again (an extra stage needs them)")
        return self.read()


class _OpenedImage:
    """An image as the file path judges it: the header read now, the decode when first asked for.

    ``known``: ``(sha256, phash)`` a previous build found for these bytes
    (``pipeline.readers.previous_build``): the identity is taken from it,
    without the decode, when the bytes' sha256 is that one.
    """

    def __init__(self, data: bytes, preset, known: Optional[Tuple[str, str]] = None):
        self.bytes = data
        self.header, self.header_reason, self.opened = image_rules.open_header(data, preset)
        self._identity = None
        self._digest = None
        self.known = known
        self.decoded = False  # the decode ran here (a known identity spares it)

    def digest(self) -> str:
        if self._digest is None:
            self._digest = hashlib.sha256(self.bytes).hexdigest()
        return self._digest

    def identity(self) -> Tuple[str, Optional[str]]:
        if self._identity is None:
            if self.known is not None and self.known[1] and self.digest() == self.known[0]:
                self._identity = (self.known[1], None)
                return self._identity
            opened, self.opened = self.opened, None
            identity, reason = image_rules.identify(self.bytes, self.header, opened)
            self._identity = (identity.phash if identity else "", reason)
            self.decoded = True
        return self._identity

    def data(self) -> bytes:
        return self.bytes

    def close(self) -> None:
        if self.opened is not None:  # a no-op once identify decoded it
            self.opened.close()
            self.opened = None


def judge_image(data: bytes, preset, decode: bool = True, read: Optional[Callable[[], bytes]] = None) -> ImageFacts:
    """The image part of the rules on ``data``; ``decode=False`` skips the reduced decode (no identity).

    ``read``: how the row part gets the bytes again (default: these bytes).
    """
    image = _OpenedImage(data, preset)
    try:
        if image.header_reason:
            return ImageFacts(None, image.header_reason, read=read or (lambda: data))
        phash, reason = image.identity() if decode else ("", None)
        return ImageFacts(image.header, None, image.digest(), phash, reason, decode, read=read or (lambda: data))
    finally:
        image.close()


# ---------------------------------------------------------------------------
# The row part
# ---------------------------------------------------------------------------


def judge_record(candidate: Candidate, preset, extras=(), known: Optional[Tuple[str, str]] = None) -> Judgement:
    """Every per-record rule on ``candidate``; ``extras`` are extra per-record stages; ``known`` the
    ``(sha256, phash)`` a previous build found for its image (used only for the same bytes)."""
    return judge_record_decoding(candidate, preset, extras, known)[0]


def judge_record_decoding(candidate: Candidate, preset, extras=(),
                          known: Optional[Tuple[str, str]] = None) -> Tuple[Judgement, bool]:
    """``judge_record``, and whether it decoded the image (a rebuild counts what it derived again)."""
    image = _OpenedImage(candidate.image, preset, known)
    try:
        return judge_row(candidate, image, preset, extras), image.decoded
    finally:
        image.close()


def _run_extras(extras, anchor: str, candidate: Candidate, image, text: str, fmt: str, width: int,
                height: int) -> Optional[str]:
    placed = extra_stages.after(extras, anchor)
    if not placed:
        return None
    view = extra_stages.RecordView(candidate.key, candidate.url, text, fmt, width, height, image.data())
    for stage in placed:
        reason = stage.run(view)
        if reason:
            return reason
    return None


def judge_row(candidate: Candidate, image, preset, extras=()) -> Judgement:
    """Every per-record rule on ``candidate`` whose image is ``image`` (``ImageFacts``, or the file path's own).

    ``candidate.image`` is not read: on the download path it is None.
    """
    if image.header_reason:
        return Judgement(candidate, image.header_reason, {}, False)
    header = image.header
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
        extras, "image_aspect", candidate, image, text_rules.normalize_text(candidate.alt_text), fmt, width, height)
    if reason:
        return _rejected(candidate.replace(format=fmt, width=width, height=height), image, reason, measures, preset)

    text, reason = text_rules.check_text(candidate.alt_text, preset)
    measures["words_per_text"] = text_rules.word_count(text)
    reason = reason or _run_extras(extras, "text_repetition", candidate, image, text, fmt, width, height)
    if reason:
        learnt = candidate.replace(format=fmt, width=width, height=height, text=text)
        return _rejected(learnt, image, reason, measures, preset)

    phash, reason = image.identity()
    learnt = candidate.replace(format=fmt, width=width, height=height, text=text,
                               sha256="" if reason else image.digest(), phash=phash)
    reason = reason or _run_extras(extras, "image_decode", learnt, image, text, fmt, width, height)
    if reason:
        return _rejected(learnt, image, reason, measures, preset)
    stored_size = (header.width, header.height) if image_rules.stored_as_read(header, preset) else None
    return Judgement(learnt, None, measures, True, stored_size)


#: Rejections that take a row out of the raw counting pool: ``read``,
#: ``image_header`` (no readable image) and ``text`` (no readable alt-text).
#: Every other per-record rejection (format, size, aspect, length,
#: repetition, decode, NSFW, extra stages) is a quality threshold: the row
#: still counts.
NOT_CANDIDATES = ("read", "image_header", "text")


def _rejected(candidate: Candidate, image, reason: str, measures, preset) -> Judgement:
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
    sha256 = candidate.sha256 or image.digest()
    phash = candidate.phash
    if preset.image_identity == "phash" and not phash:
        phash, _ = image.identity()
    return Judgement(candidate.replace(text=text, sha256=sha256, phash=phash if preset.image_identity == "phash" else ""),
                     reason, measures, True)


def in_counting_pool(candidate: Candidate, reason: str, preset) -> bool:
    """Whether a row that ``reason`` rejected still counts in the corpus-wide counts."""
    if preset.counting_base != "raw" or stages.stage_of(reason) in NOT_CANDIDATES:
        return False
    _, text_reason = text_rules.check_text(candidate.alt_text, preset)
    return not (text_reason and stages.stage_of(text_reason) == "text")


#: What a row may need of its image beyond the header (``row_needs``): the
#: decode; the NSFW score and embedding; and, a row stating its own source
#: size, scores even when the image's own size fails the size rules.
NEEDS_IDENTITY, NEEDS_SCORES, STATES_SIZE = 1, 2, 4


def row_needs(candidate: Candidate, preset) -> int:
    """What judging this row may need of its image (``NEEDS_*`` bits), from the row alone.

    ``NEEDS_IDENTITY``: the decode (the row may pass, or count in the raw
    pool); ``NEEDS_SCORES``: the NSFW score and the embedding (the row may
    pass every per-record rule). The image part runs once per image for the
    union of its rows' needs (``judge_image(..., decode=...)``, ``scores_needed``).
    """
    _, reason = text_rules.check_text(candidate.alt_text, preset)
    if reason is None:
        stated = STATES_SIZE if candidate.source_width and candidate.source_height else 0
        return NEEDS_IDENTITY | NEEDS_SCORES | stated
    if preset.counting_base == "raw" and preset.image_identity == "phash" and stages.stage_of(reason) != "text":
        return NEEDS_IDENTITY
    return 0


def scores_needed(facts: ImageFacts, needs: int, preset) -> bool:
    """Whether a row of this image (its rows' ``needs``) may pass every per-record rule: score and embed it."""
    if not needs & NEEDS_SCORES or facts.header is None or not facts.decoded or facts.decode_reason:
        return False
    return bool(needs & STATES_SIZE) or image_rules.check_header(facts.header, preset) is None
