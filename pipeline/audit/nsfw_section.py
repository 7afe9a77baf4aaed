"""The audit report's NSFW section: the scorer and its cut, the scores' distribution, and the gallery.

Shown when the build ran the NSFW stage, from the funnel (its ``nsfw`` row
and note, the preset's ``nsfw_model`` and ``nsfw_threshold``),
``stats/distributions.json``'s ``nsfw_score`` histogram (counted on the
workers, one value per scored record) and ``stats/nsfw_gallery.jsonl``
(``pipeline.write.nsfw_gallery``): the highest-scoring images the build
keeps and the ones the stage rejected. Every thumbnail of the section is
blurred until clicked (``image_html``: the report's ``revealed``).
"""

from __future__ import annotations

import html
import math
from typing import List, Optional

from pipeline.audit.plots import plot_distribution
from pipeline.funnel.counts import NSFW_MEASURE
from pipeline.funnel.table import as_int, percent

STAGE = "nsfw"
SIDES = (("kept", "Highest-scoring images the build keeps",
          "what the corpus lets through: the images the scorer found most pornographic among those written"),
         ("rejected", "Highest-scoring rejected images",
          "what the stage is surest of (the sampled rejects below show typical ones)"))


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _score(row: dict) -> Optional[float]:
    value = row.get("nsfw_score")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _card(row: dict, image_html) -> str:
    alt = str(row.get("alt_text") or "")
    text = alt if len(alt) <= 160 else alt[:159] + "…"
    size = f"{as_int(row.get('width'))}×{as_int(row.get('height'))}" if row.get("width") else ""
    return (f'<div class="card">{image_html(row.get("thumbnail"), alt)}'
            f'<div class="meta"><b>score {_score(row):.4f}</b> {_e(size)}</div>'
            f'<div class="alt" title="{_e(alt)}">{_e(text) or "<span class=muted>(no alt-text)</span>"}</div>'
            f'<div class="meta">key {_e(row.get("key", ""))}</div></div>')


def _stage_row(funnel: Optional[dict]) -> Optional[dict]:
    return next((row for row in (funnel or {}).get("stages") or [] if row.get("stage") == STAGE), None)


def section_nsfw(loaded: dict, image_html) -> str:
    """The section's HTML, or "" when the stage did not run (no funnel row that ran, or no scores and no gallery).

    ``image_html(b64 thumbnail, alt-text)``: the report's blurred ``<img>`` (it lets only real images through).
    """
    funnel = loaded.get("funnel")
    row = _stage_row(funnel)
    distribution = (loaded.get("distributions") or {}).get(NSFW_MEASURE)
    gallery = [g for g in loaded.get("nsfw_gallery") or [] if _score(g) is not None]
    if row is None or not row.get("ran", True) or (not isinstance(distribution, dict) and not gallery):
        return ""
    preset = (funnel or {}).get("preset") or {}
    counts = distribution.get("counts") if isinstance(distribution, dict) else None
    scored = sum(as_int(c) for c in counts or [])
    rejected = {reason: as_int(n) for reason, n in (row.get("rejected") or {}).items()}
    reasons = ", ".join(f"<code>{_e(r)}</code> {n:,} ({percent(n, scored)} of the scored)"
                        for r, n in sorted(rejected.items())) or "none"
    parts = [
        '<h2 id="nsfw">NSFW</h2>',
        f"<p>Scorer <code>{_e(preset.get('nsfw_model'))}</code> (<code>nsfw_model</code>); a record is rejected "
        f"if its score &ge; {_e(preset.get('nsfw_threshold'))} (<code>nsfw_threshold</code>). "
        f"{scored:,} records scored (every record the per-record rules kept); rejected: {reasons}.</p>",
    ]
    if row.get("note"):
        parts.append(f'<p class="muted">The workers\' note: {_e(row["note"])}</p>')
    if counts:
        try:
            parts.append(f'<figure><img src="{plot_distribution(NSFW_MEASURE, distribution, preset)}" '
                         f'alt="NSFW score histogram"><figcaption>{_e(distribution.get("description", ""))}'
                         "</figcaption></figure>")
        except (ValueError, TypeError) as error:
            parts.append(f'<p class="muted">cannot plot the scores ({_e(error)})</p>')
    parts.append('<p class="muted">Thumbnails here are blurred: click one to see it, click again to blur it. '
                 "An image on several records is shown once.</p>")
    for side, title, why in SIDES:
        shown: List[dict] = sorted((g for g in gallery if g.get("side") == side),
                                   key=lambda g: (-_score(g), str(g.get("key"))))
        body = ('<div class="grid">' + "".join(_card(g, image_html) for g in shown) + "</div>" if shown
                else '<p class="muted">none</p>')
        parts.append(f"<h3>{_e(title)}</h3><p class=\"muted\">{_e(why)}; {len(shown)} shown, highest score first.</p>"
                     + body)
    return "".join(parts)
