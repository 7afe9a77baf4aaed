"""The audit report's model-score section: the scores with the cut, what the score rejected, what it alone would catch.

Shown when the build ran the model-score stage (``--model_score``), from
``stats/distributions.json``'s ``model_score`` entry (``pipeline.stages.score_verdicts``),
the funnel and the sampled rejects (each sample of a scored pair carries its
``model_score``):

- the cosine of every scored pair, bars coloured by the stage's cut, the
  threshold and the top fraction's cut, and the scores of the pairs other
  stages rejected; the label-blind threshold read off that histogram
  (Otsu's, ``filters.score_cut.otsu_threshold``);
- per other stage: its rejected pairs that were scored and how many of them
  the score's cut rejects too (what the score alone would have caught), and
  the score's rejections no other stage made;
- the sampled rejects of the stage, lowest score first, with thumbnail,
  alt-text and score; then the other stages' sampled rejects with their scores.
"""

from __future__ import annotations

import html
import math
from typing import List, Optional

from filters import stages
from pipeline.audit.plots import plot_model_scores
from pipeline.funnel.table import as_int, percent

STAGE = "model_score"
SHOWN_OTHERS = 24


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _score(row: dict) -> Optional[float]:
    value = row.get("model_score")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _card(row: dict, image_html) -> str:
    alt = str(row.get("alt_text") or "")
    image = image_html(row.get("thumbnail"), alt)
    score = _score(row)
    text = alt if len(alt) <= 160 else alt[:159] + "…"
    return (f'<div class="card">{image}<div class="meta"><b>cosine {score:.4f}</b> · {_e(row.get("reason"))}</div>'
            f'<div class="alt" title="{_e(alt)}">{_e(text) or "<span class=muted>(no alt-text)</span>"}</div>'
            f'<div class="meta">key {_e(row.get("key", ""))}</div></div>')


def _stage_rejections(funnel: Optional[dict]) -> dict:
    for row in (funnel or {}).get("stages") or []:
        if row.get("stage") == STAGE:
            return {reason: as_int(count) for reason, count in (row.get("rejected") or {}).items()}
    return {}


def _overlap_table(entry: dict, own: dict) -> str:
    rows = []
    for stage, row in sorted((entry.get("other_stages") or {}).items()):
        if not isinstance(row, dict):
            continue
        rejected, also = as_int(row.get("rejected")), as_int(row.get("also_cut_by_score"))
        rows.append(f'<tr><td><code>{_e(stage)}</code></td><td class="num">{rejected:,}</td>'
                    f'<td class="num">{also:,}</td><td class="num">{percent(also, rejected)}</td></tr>')
    cut_by_score = sum(n for reason, n in own.items() if reason != stages.reason(STAGE, "undecodable"))
    elsewhere = as_int(entry.get("rejected_also_elsewhere"))
    alone = (f"<p>The score rejected {cut_by_score:,} pairs; {elsewhere:,} of them another corpus stage rejects too "
             f"(counted under <code>{STAGE}</code>, which runs first), so <b>{cut_by_score - elsewhere:,}</b> "
             "are caught by the score alone.</p>")
    if not rows:
        return alone + '<p class="muted">No scored pair was rejected by another stage.</p>'
    return alone + (
        "<table><tr><th>other stage</th><th>its rejected pairs (scored)</th><th>also cut by the score</th>"
        "<th>share</th></tr>" + "".join(rows) + "</table>"
        '<p class="muted">Scored pairs only: the model scores the pairs that pass every per-record rule and NSFW, '
        "so what those rules reject has no score.</p>")


def _label_blind(entry: dict) -> str:
    """The threshold read off the histogram without a label (``filters.score_cut.otsu_threshold``)."""
    from filters.score_cut import otsu_threshold

    try:
        threshold = otsu_threshold({"edges": entry["edges"], "counts": entry["counts"]})
    except (KeyError, TypeError, ValueError) as error:
        return f'<p class="muted">No label-blind threshold: {_e(error)}.</p>'
    return (f"<p>Label-blind threshold of this histogram (Otsu's: the bin edge that best separates a low and a "
            f"high group of scores): <b>{threshold:g}</b>; "
            f"<code>--set model_score_threshold={threshold:g}</code> cuts there.</p>")


def section_model_score(loaded: dict, image_html) -> str:
    """The section's HTML, or "" when the build did not score (no ``model_score`` distribution).

    ``image_html(b64 thumbnail, alt-text)``: the report's own ``<img>`` (it lets only real images through).
    """
    entry = (loaded.get("distributions") or {}).get(STAGE)
    if not isinstance(entry, dict):
        return ""
    funnel = loaded.get("funnel")
    own = _stage_rejections(funnel)
    scored = as_int(entry.get("scored"))
    preset = (funnel or {}).get("preset") or {}
    cuts = []
    if isinstance(entry.get("threshold"), (int, float)):
        cuts.append(f"cosine &ge; {entry['threshold']:g} (<code>model_score_threshold</code>)")
    fraction = preset.get("model_score_top_fraction")
    if isinstance(entry.get("fraction_cut"), (int, float)) and isinstance(fraction, (int, float)):
        cuts.append(f"the top {fraction:g} of the scored pairs (<code>model_score_top_fraction</code>; "
                    f"cosine &ge; {entry['fraction_cut']:.4f}, ties by key)")
    kept = scored - sum(n for reason, n in own.items() if reason != stages.reason(STAGE, "undecodable"))
    reasons = ", ".join(f"<code>{_e(r)}</code> {n:,}" for r, n in sorted(own.items())) or "none"
    parts = [
        '<h2 id="model-score">Model score</h2>',
        f"<p>Model: <code>{_e(entry.get('model'))}</code>. {scored:,} pairs scored, {kept:,} kept "
        f"({percent(kept, scored)}); rejected: {reasons}. Kept: "
        f"{' and '.join(cuts) if cuts else 'every pair (no cut set: the scores are recorded only)'}.</p>",
    ]
    parts.append(_label_blind(entry))
    try:
        parts.append(f'<figure><img src="{plot_model_scores(entry)}" alt="model score histogram"></figure>')
    except (ValueError, TypeError) as error:
        parts.append(f'<p class="muted">cannot plot the scores ({_e(error)})</p>')
    parts.append("<h3>What the score alone would have caught</h3>" + _overlap_table(entry, own))
    samples = [row for row in loaded.get("samples") or [] if _score(row) is not None]
    mine = sorted((r for r in samples if r.get("stage") == STAGE), key=lambda r: (_score(r), str(r.get("key"))))
    others = sorted((r for r in samples if r.get("stage") != STAGE), key=lambda r: (_score(r), str(r.get("key"))))
    parts.append(f"<h3>Rejected by the score</h3><p class=\"muted\">The sampled rejects, lowest score first "
                 f"({len(mine)} shown).</p>" + ('<div class="grid">' + "".join(_card(r, image_html) for r in mine) + "</div>"
                                                  if mine else ""))
    if others:
        shown: List[dict] = others[:SHOWN_OTHERS]
        parts.append(f"<h3>Other stages' rejects and their scores</h3><p class=\"muted\">Sampled rejects of the "
                     f"other stages that were scored, lowest score first ({len(shown)} of {len(others)}).</p>"
                     '<div class="grid">' + "".join(_card(r, image_html) for r in shown) + "</div>")
    return "".join(parts)
