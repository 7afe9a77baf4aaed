"""One downloaded image judged once: its light facts, keyed by URL, for every row that named it.

A URL list names a popular image on thousands of rows. The crawl fetches
each distinct URL once (``pipeline.download.crawl``), and where it fetched
the bytes, ``ImageJudge`` judges the image once: the image part of the
per-record rules (``filters.record.judge_image``: header, sha256, the
reduced decode and its pHash), the NSFW score, the embedding and its match
against the evaluation index. What it learnt is an ``ImageFactsRow``: no
image bytes, only where they are (the staging file, ordinal and offset).
``pipeline.download.fanout`` joins the facts back to every row of the URL
and applies the row part of the rules there.

The image is judged as far as its rows need (``filters.record.row_needs``,
combined per URL): no decode when no row can use the identity, no NSFW
score or embedding when no row can pass.

``UrlRow`` is a URL-list row without its image: what the row part needs of
it (key, alt-text, stated source size, carried columns).

No ``from __future__ import annotations`` here: Beam reads the field types
of the NamedTuples to build their schemas.
"""

import json
import math
from typing import List, NamedTuple, Optional, Tuple

import apache_beam as beam
import numpy as np

from common.schema import Candidate
from filters import record as record_rules
from filters.image import Header, thumbnail_b64
from filters.nsfw import UNDECODABLE_REASON
from pipeline.download import staging


class UrlRow(NamedTuple):
    """A URL-list row waiting for its image."""

    key: str
    url: str
    alt_text: str
    carried: str        # JSON [[column, text], ...] of the row's carried columns
    source_width: int   # the size the row states for its image (0: none)
    source_height: int


def url_row(candidate: Candidate) -> UrlRow:
    return UrlRow(candidate.key, candidate.url, candidate.alt_text, json.dumps([list(kv) for kv in candidate.carried]),
                  candidate.source_width, candidate.source_height)


def candidate_of(row: UrlRow, carried: tuple = (), origin: tuple = ()) -> Candidate:
    """The row as a record without image bytes (``carried``: what the download adds to its carried columns)."""
    added = {name for name, _ in carried}
    own = tuple(tuple(kv) for kv in json.loads(row.carried) if kv[0] not in added)
    return Candidate(key=row.key, url=row.url, alt_text=row.alt_text, image=None, source_width=row.source_width,
                     source_height=row.source_height, carried=own + tuple(carried), origin=origin)


class ImageFactsRow(NamedTuple):
    """What the crawl learnt of one distinct URL: its download, and the image judged once."""

    url: str
    reason: str          # ``download/<reason>`` of a failed download, "" when the bytes came
    http_status: int     # the last status seen (0: none)
    final_url: str
    source: str          # the staging file holding the bytes ("" for a failure)
    ordinal: int         # the body's place in it
    offset: int          # its byte offset (an extra stage reads it back)
    fetched: bool        # fetched by this build (False: an earlier build's staging file was reused)
    header_reason: str   # ``image_header/...``, or "" with the header facts below
    format: str
    width: int           # after EXIF orientation
    height: int
    orientation: int
    mode: str
    sha256: str
    phash: str
    decoded: bool        # the reduced decode ran (some row needs the identity)
    decode_reason: str   # ``image_decode/...`` when it failed
    nsfw_reason: str     # ``nsfw/...`` for an image some row may keep, "" otherwise
    nsfw_scored: bool    # the NSFW outcome, counted per row that reaches the stage (``nsfw.stage_note``)
    nsfw_status: str     # "" when the stage did not look at the image
    nsfw_score: float    # its score (-inf: not scored, as ``LightRow.nsfw_score``)
    eval_match: str      # ``near_duplicate_eval/<set>``, or ""
    pairs: str           # JSON list of the evaluation pairs (without key; thumbnail included), "" for none
    embedding: bytes     # the unit vector (float32) when the preset removes in-corpus near-duplicates


def failed_facts(url: str, reason: str, http_status: int, final_url: str, fetched: bool = True) -> ImageFactsRow:
    return ImageFactsRow(url, reason, int(http_status), final_url, "", -1, -1, fetched, "", "", 0, 0, 0, "", "", "",
                         False, "", "", False, "", -math.inf, "", "", b"")


def unjudged_facts(url: str, where: tuple) -> ImageFactsRow:
    """The facts of a download whose image is not judged (the download alone, as benchmarks measure it)."""
    http_status, final_url, source, ordinal, offset, fetched = where
    return failed_facts(url, "", http_status, final_url, fetched)._replace(source=source, ordinal=ordinal, offset=offset)


def image_facts(row: ImageFactsRow, max_record_bytes: Optional[int] = None) -> record_rules.ImageFacts:
    """The facts as the row part takes them, able to read the bytes again from the staging file."""
    source, offset = row.source, row.offset

    def read() -> bytes:
        args = (max_record_bytes,) if max_record_bytes else ()
        body = staging.read_body(source, offset, *args)
        if body is None:
            raise ValueError(f"staging file {source} no longer holds the body at offset {offset}")
        return body

    header = None if row.header_reason else Header(row.format, row.width, row.height, row.orientation, row.mode)
    return record_rules.ImageFacts(header, row.header_reason or None, row.sha256, row.phash, row.decode_reason or None,
                                   row.decoded, read)


def embedding_of(row: ImageFactsRow) -> np.ndarray:
    return np.frombuffer(row.embedding, np.float32)


class ImageJudge:
    """Judges downloaded images once each, a batch at a time (without Beam).

    Built on the first pass's ``RecordJudge`` (its preset, NSFW scorer,
    embedder and evaluation index, loaded by ``setup``). ``judge(items)``
    takes ``(url, body, needs, where)`` items, ``where`` being
    ``(http_status, final_url, source, ordinal, offset, fetched)``, and
    returns one ``ImageFactsRow`` per item.
    """

    def __init__(self, record_judge):
        self.record_judge = record_judge

    def setup(self) -> None:
        self.record_judge.setup()

    def judge(self, items) -> List[ImageFactsRow]:
        judge = self.record_judge
        preset = judge.preset
        facts, scored = [], []
        for url, body, needs, where in items:
            found = record_rules.judge_image(body, preset, decode=bool(needs & record_rules.NEEDS_IDENTITY))
            facts.append(_row(url, where, found))
            if record_rules.scores_needed(found, needs, preset):
                scored.append((len(facts) - 1, body))
        kept = self._score_nsfw(facts, scored)
        if judge.embedder is not None and kept:
            self._embed_and_match(facts, kept)
        return facts

    def _score_nsfw(self, facts, scored) -> List[Tuple[int, bytes]]:
        nsfw = self.record_judge.nsfw
        reasons, scores = nsfw.judge_with_scores([body for _, body in scored])
        outcomes = nsfw.take_outcomes()  # one batch: one way of scoring (or none, every image undecodable)
        if len(outcomes) > 1:
            raise ValueError(f"one NSFW batch was scored in several ways: {outcomes}")
        scored_by, status = next(iter(outcomes), (False, ""))
        kept = []
        for (i, body), reason, score in zip(scored, reasons, scores):
            undecodable = reason == UNDECODABLE_REASON
            facts[i] = facts[i]._replace(nsfw_reason=reason or "", nsfw_scored=bool(scored_by and not undecodable),
                                         nsfw_status="" if undecodable else status,
                                         nsfw_score=-math.inf if score is None else score)
            if not reason:
                kept.append((i, body))
        return kept

    def _embed_and_match(self, facts, kept) -> None:
        from dedup.transforms import match_batch, stack_batch

        judge = self.record_judge
        vectors = np.asarray(judge.embedder.embed([body for _, body in kept]), np.float32)
        urls, unit = stack_batch([(facts[i].url, v) for (i, _), v in zip(kept, vectors)])
        if judge.preset.dedup_in_corpus:
            for (i, _), vector in zip(kept, unit):
                facts[i] = facts[i]._replace(embedding=np.asarray(vector, np.float32).tobytes())
        if judge.index is None:
            return
        found = match_batch(judge.index, urls, unit)
        pairs = {}
        for pair in found.pairs:
            pairs.setdefault(pair["key"], []).append(pair)
        for q, reason in found.rejected:
            i, body = kept[q]
            thumbnail = thumbnail_b64(body)
            shown = [dict({k: v for k, v in pair.items() if k != "key"}, cosine=round(float(pair["cosine"]), 6),
                          thumbnail=thumbnail) for pair in pairs.get(facts[i].url, [])]
            facts[i] = facts[i]._replace(eval_match=reason, pairs=json.dumps(shown, sort_keys=True))


def _row(url: str, where: tuple, found: record_rules.ImageFacts) -> ImageFactsRow:
    http_status, final_url, source, ordinal, offset, fetched = where
    header = found.header
    return ImageFactsRow(
        url, "", int(http_status), final_url, source, int(ordinal), int(offset), bool(fetched),
        found.header_reason or "", header.format if header else "", header.width if header else 0,
        header.height if header else 0, header.orientation if header else 0, header.mode if header else "",
        found.sha256, found.phash, found.decoded, found.decode_reason or "", "", False, "", -math.inf, "", "", b"")


beam.coders.registry.register_coder(UrlRow, beam.coders.RowCoder)
beam.coders.registry.register_coder(ImageFactsRow, beam.coders.RowCoder)
