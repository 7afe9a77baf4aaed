"""The audit's HTML report: one self-contained file, every image and plot inlined as a ``data:`` URI.

A Content Security Policy forbids anything else (no scripts, no network), so
the report can be mailed, archived or opened offline. It shows what a person
auditing a corpus looks at: the funnel, the distributions with the preset's
cuts, the threshold explorer (``pipeline.audit.what_if_section``), sampled
rejects of every reason with their alt-text, the near-duplicate pairs, the
model-score section (``pipeline.audit.model_score_section``), the NSFW
scores and the gallery of the highest (``pipeline.audit.nsfw_section``). The plots are
``pipeline.audit.plots`` (matplotlib only to render).
"""

from __future__ import annotations

import base64
import binascii
import html
import math
import os
from typing import Dict, List, Optional

from filters import stages
from pipeline.audit import what_if_section
from pipeline.audit.model_score_section import section_model_score
from pipeline.audit.nsfw_section import section_nsfw
from pipeline.audit.plots import DISTRIBUTION_CUTS, plot_cosines, plot_count_of_counts, plot_distribution, plot_funnel
from pipeline.audit.read_stats import NEAR_DUPLICATES_FILE
from pipeline.funnel.counts import NSFW_MEASURE
from pipeline.funnel.table import FUNNEL_FILE, as_int, check_funnel, percent, stage_rejected

MAX_NEAR_DUPLICATE_PAIRS = 200
MIN_PAIRS_FOR_HISTOGRAM = 10

# ---------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------

# No scripts, no network: images only from data: URIs, styles only inline.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; margin: 0 2rem 3rem; color: #222; }
h1 { margin: 1.2rem 0 .3rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; } h3 { margin: 1.4rem 0 .4rem; font-size: 15px; }
nav a { margin-right: 1rem; } .muted { color: #777; } code { background: #f4f4f4; padding: 0 .2em; }
.banner { padding: .7rem 1rem; border-radius: 4px; margin: .8rem 0; font-weight: 600; }
.banner.ok { background: #e7f4e4; border: 1px solid #7bb36e; }
.banner.fail { background: #fde2e1; border: 2px solid #d62728; color: #8b0000; } .banner.fail ul { margin: .3rem 0 0; }
table { border-collapse: collapse; margin: .5rem 0; } th, td { padding: .25rem .6rem; border-bottom: 1px solid #eee; vertical-align: top; }
th { text-align: left; background: #fafafa; } td.num { text-align: right; font-variant-numeric: tabular-nums; } tr.notrun td { color: #999; }
.plots { display: flex; flex-wrap: wrap; gap: 1rem; } .plots figure { margin: 0; } figcaption { font-size: 12px; color: #555; max-width: 36rem; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: .6rem; }
.card { border: 1px solid #ddd; border-radius: 4px; padding: .35rem; font-size: 12px; overflow: hidden; background: #fff; }
.card img, .pair img { display: block; max-width: 128px; max-height: 128px; margin: 0 auto .3rem; }
.noimg { width: 128px; height: 64px; margin: 0 auto .3rem; display: flex; align-items: center; justify-content: center;
  background: #f0f0f0; color: #888; font-size: 11px; }
.alt { font-style: italic; word-break: break-word; } .meta { color: #666; word-break: break-all; }
.pair td { text-align: center; }
.reveal { display: block; cursor: pointer; overflow: hidden; } .reveal input { position: absolute; opacity: 0; }
.reveal img { filter: blur(14px); } .reveal input:checked + img { filter: none; }
.reveal input:focus-visible + img { outline: 2px solid #4c78a8; }
"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


_IMAGE_MAGIC = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def thumbnail_uri(b64: Optional[str]) -> Optional[str]:
    """A ``data:`` URI for a base64 thumbnail, or None if it is not a real image.

    The stats files come from web data: a thumbnail string is decoded and
    its magic bytes checked, so nothing but an image can reach the page.
    """
    if not isinstance(b64, str) or not b64:
        return None
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    mime = next((m for magic, m in _IMAGE_MAGIC if raw.startswith(magic)), None)
    if mime is None and raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        mime = "image/webp"
    if mime is None:
        return None
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"


def _img(b64: Optional[str], alt: str) -> str:
    uri = thumbnail_uri(b64)
    if uri is None:
        return '<div class="noimg">no thumbnail</div>'
    return f'<img src="{uri}" alt="{_e(alt[:200])}">'


def revealed(b64: Optional[str], alt: str) -> str:
    """``_img`` blurred until clicked (and clear again on a second click): the label of a hidden checkbox that
    the style unblurs it by (``.reveal``), as the page may run no script."""
    image = _img(b64, alt)
    if not image.startswith("<img"):
        return image
    return f'<label class="reveal" title="click to show or blur"><input type="checkbox" aria-label="show the image">{image}</label>'


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _section_funnel(funnel: Optional[dict]) -> str:
    if funnel is None:
        return '<h2 id="funnel">Funnel</h2><p class="banner fail">No funnel to show: funnel.json is missing or unreadable (above).</p>'
    total = as_int(funnel.get("input"))
    rows = []
    for i, row in enumerate(funnel.get("stages") or [], 1):
        ran = row.get("ran", True)
        reasons = sorted((row.get("rejected") or {}).items(), key=lambda kv: (-as_int(kv[1]), kv[0]))
        reason_html = "<br>".join(
            f'<a href="#r-{_e(r)}">{_e(r)}</a> {as_int(c):,} ({percent(as_int(c), total)})' for r, c in reasons if as_int(c)
        )
        note = f'<div class="muted">{_e(row["note"])}</div>' if row.get("note") else ""
        rows.append(
            f'<tr class="{"" if ran else "notrun"}"><td class="num">{i}</td>'
            f'<td><b>{_e(row.get("stage"))}</b><div class="muted">{_e(row.get("description", ""))}</div>{note}</td>'
            f'<td class="num">{as_int(row.get("in")):,}</td>'
            f'<td class="num">{(f"{stage_rejected(row):,}" if ran else "not run")}</td>'
            f'<td class="num">{as_int(row.get("out")):,}</td>'
            f'<td class="num">{percent(as_int(row.get("out")), total)}</td><td>{reason_html}</td></tr>'
        )
    written = funnel.get("written") or {}
    written_html = ", ".join(f"{_e(k)} {as_int(v):,}" for k, v in written.items()) or "nothing"
    return (
        '<h2 id="funnel">Funnel</h2>'
        f"<p>{total:,} input records; written: {written_html}; rejected: {as_int(funnel.get('rejected_total')):,}. "
        "Every record is counted once, at the first stage that rejects it.</p>"
        "<table><tr><th>#</th><th>stage</th><th>in</th><th>rejected</th><th>out</th><th>% of input</th>"
        "<th>reasons</th></tr>" + "".join(rows) + "</table>"
        f'<figure><img src="{plot_funnel(funnel)}" alt="funnel bar chart"></figure>'
    )


def _section_preset(funnel: Optional[dict]) -> str:
    preset = (funnel or {}).get("preset") or {}
    if not preset:
        return ""
    rows = "".join(f"<tr><td><code>{_e(k)}</code></td><td>{_e(v)}</td></tr>" for k, v in preset.items())
    return (
        f'<h2 id="preset">Preset <code>{_e((funnel or {}).get("preset_name", ""))}</code></h2>'
        f"<details><summary>{len(preset)} parameters</summary><table>{rows}</table></details>"
    )


def _section_distributions(distributions: Optional[dict], preset: dict) -> str:
    head = '<h2 id="distributions">Distributions</h2>'
    if not distributions:
        return head + '<p class="muted">distributions.json is missing or empty.</p>'
    figures = []
    # In the order the stages run; unknown distributions after the known ones.
    known = list(DISTRIBUTION_CUTS)
    names = sorted(distributions, key=lambda n: (known.index(n) if n in known else len(known), n))
    for name in names:
        dist = distributions[name]
        if name in ("count_of_counts", NSFW_MEASURE) or not isinstance(dist, dict):
            continue  # the NSFW scores are drawn in their own section, beside the gallery
        try:
            uri = plot_distribution(name, dist, preset)
        except (ValueError, TypeError) as err:
            figures.append(f'<figure><figcaption><b>{_e(name)}</b>: cannot plot ({_e(err)})</figcaption></figure>')
            continue
        total = sum(as_int(c) for c in dist.get("counts") or [])
        caption = f"<b>{_e(name)}</b>: {_e(dist.get('description', ''))} ({total:,} values)"
        figures.append(f'<figure><img src="{uri}" alt="{_e(name)} histogram"><figcaption>{caption}</figcaption></figure>')
    coc = distributions.get("count_of_counts")
    if isinstance(coc, dict):
        caption = (
            f"<b>count_of_counts</b>: {as_int(coc.get('num_ngrams')):,} distinct unigrams+bigrams; "
            f"vocabulary keeps {as_int(coc.get('vocab_size')):,} (cut at count {_e(coc.get('cut_count'))}). "
            "An alt-text with any n-gram outside the vocabulary is dropped (rare_ngrams)."
        )
        figures.append(
            f'<figure><img src="{plot_count_of_counts(coc)}" alt="n-gram count of counts"><figcaption>{caption}</figcaption></figure>'
        )
    legend = (
        '<p class="muted">Bars are bins (equal width whatever the bin size); colour says whether the '
        "preset keeps the whole bin, cuts it, or cuts part of it. Dashed lines: the preset's thresholds.</p>"
    )
    return head + legend + '<div class="plots">' + "".join(figures) + "</div>"


def _section_samples(samples: List[dict], funnel: Optional[dict]) -> str:
    head = '<h2 id="rejects">Sampled rejects</h2>'
    if not samples:
        return head + '<p class="muted">rejected_samples.jsonl is missing or empty.</p>'
    counts = {}
    for row in (funnel or {}).get("stages") or []:
        counts.update({r: as_int(c) for r, c in (row.get("rejected") or {}).items()})
    by_reason: Dict[str, List[dict]] = {}
    for row in samples:
        by_reason.setdefault(str(row.get("reason", "?")), []).append(row)
    # The funnel's own order: it holds the extra stages too.
    position = {row.get("stage"): i for i, row in enumerate((funnel or {}).get("stages") or [])}
    order = sorted(by_reason, key=lambda r: (position.get(stages.stage_of(r), len(position)), r))
    parts = [head, '<p class="muted">A deterministic sample of each reason (by key hash). '
             "Thumbnails of <code>nsfw/*</code> rejects are blurred until clicked.</p>"]
    for reason in order:
        rows = by_reason[reason]
        total = counts.get(reason)
        count_text = f"{total:,} rejected, {len(rows)} shown" if total is not None else f"{len(rows)} shown"
        image = revealed if stages.stage_of(reason) == "nsfw" else _img
        cards = []
        for row in rows:
            alt = str(row.get("alt_text") or "")
            size = f"{as_int(row.get('width'))}×{as_int(row.get('height'))}" if row.get("width") else ""
            meta = " ".join(x for x in (size, str(row.get("format") or "")) if x)
            cards.append(
                f'<div class="card">{image(row.get("thumbnail"), alt)}'
                f'<div class="alt" title="{_e(alt)}">{_e(_truncate(alt, 160)) or "<span class=muted>(no alt-text)</span>"}</div>'
                f'<div class="meta">{_e(meta)}</div>'
                f'<div class="meta" title="{_e(row.get("url", ""))}">{_e(_truncate(str(row.get("url") or ""), 80))}</div>'
                f'<div class="meta">key {_e(row.get("key", ""))}</div></div>'
            )
        parts.append(f'<h3 id="r-{_e(reason)}"><code>{_e(reason)}</code> <span class="muted">{count_text}</span></h3>')
        parts.append('<div class="grid">' + "".join(cards) + "</div>")
    return "".join(parts)


def _section_near_duplicates(pairs: List[dict], missing: bool, preset: dict) -> str:
    head = '<h2 id="near-duplicates">Near-duplicate pairs</h2>'
    if missing:
        return head + '<p class="muted">near_duplicates.jsonl is missing: near-duplicate removal did not run.</p>'
    if not pairs:
        return head + "<p>No near-duplicate pairs were found.</p>"

    def cosine(p):
        value = p.get("cosine")
        return float(value) if isinstance(value, (int, float)) else -math.inf

    ordered = sorted(pairs, key=lambda p: (-cosine(p), str(p.get("key")), str(p.get("index_key"))))
    shown = ordered[:MAX_NEAR_DUPLICATE_PAIRS]
    threshold = preset.get("near_duplicate_threshold")
    threshold = float(threshold) if isinstance(threshold, (int, float)) and threshold > 0 else None
    rows = []
    for p in shown:
        rows.append(
            '<tr class="pair">'
            f'<td>{_img(p.get("thumbnail"), "corpus image")}<div class="meta">{_e(p.get("key"))}</div></td>'
            f'<td>{_img(p.get("index_thumbnail"), "index image")}<div class="meta">{_e(p.get("index_set"))}: '
            f'{_e(p.get("index_key"))}</div></td>'
            f'<td class="num"><b>{cosine(p):.4f}</b></td><td>{_e(p.get("variant", ""))}</td></tr>'
        )
    more = f" (showing the {len(shown)} most similar)" if len(shown) < len(pairs) else ""
    return (
        head + f"<p>{len(pairs):,} pairs{more}. Left: the corpus image that was dropped; right: the image it "
        "duplicates (an evaluation set, or a kept corpus image).</p>"
        + (f'<figure><img src="{plot_cosines(pairs, threshold)}" alt="cosine histogram"></figure>'
           if len(pairs) >= MIN_PAIRS_FOR_HISTOGRAM else "")
        + "<table><tr><th>corpus image</th><th>duplicates</th><th>cosine</th><th>variant</th></tr>" + "".join(rows) + "</table>"
    )


def _section_concepts(concepts: Optional[dict]) -> str:
    """Pairs per ontology class and split (TOnICS, ``pipeline.write.concept_tags``); empty without ``--concepts``."""
    if not concepts:
        return ""
    splits = concepts["splits"]
    header = "".join(f"<th>{_e(s)}</th>" for s in splits)
    rows = [f"<tr><td><i>all pairs</i></td>" + "".join(f'<td class="num">{as_int(v["pairs"]):,}</td>' for v in splits.values()) + "</tr>",
            f"<tr><td><i>naming a class</i></td>" + "".join(f'<td class="num">{as_int(v["tagged"]):,}</td>' for v in splits.values()) + "</tr>"]
    for name in concepts["classes"]:
        rows.append(f"<tr><td>{_e(name)}</td>" + "".join(
            f'<td class="num">{as_int(v["per_class"].get(name, 0)):,}</td>' for v in splits.values()) + "</tr>")
    return (f'<h2 id="concepts">TOnICS classes</h2><p class="muted">ontology <code>{_e(concepts.get("ontology"))}</code>, '
            f'root <code>{_e(concepts.get("root"))}</code>, evidence: {_e(concepts.get("evidence"))}. A pair counts '
            f'once per class it names; the trainer draws class minibatches from these pairs.</p>'
            f"<table><tr><th>class</th>{header}</tr>{''.join(rows)}</table>")


def build_html(loaded: dict) -> str:
    funnel = loaded.get("funnel")
    preset = (funnel or {}).get("preset") or {}
    title = f"Corpus audit: {(funnel or {}).get('dataset') or os.path.basename(loaded['stats_dir'].rstrip('/'))}"
    unreadable = loaded.get("unreadable", {})
    problems = (check_funnel(funnel) if funnel is not None else
                [f"{FUNNEL_FILE}: {unreadable[FUNNEL_FILE]}" if FUNNEL_FILE in unreadable else f"{FUNNEL_FILE} is missing"])
    if problems:
        banner = '<div class="banner fail">FUNNEL CHECK FAILED<ul>' + "".join(f"<li>{_e(p)}</li>" for p in problems) + "</ul></div>"
    else:
        banner = (
            f'<div class="banner ok">Conserved: input {as_int(funnel.get("input")):,} = written '
            f'{sum(as_int(v) for v in (funnel.get("written") or {}).values()):,} + rejected {as_int(funnel.get("rejected_total")):,}</div>'
        )
    notices = [f"{name} is missing" for name in loaded.get("missing", []) if name != FUNNEL_FILE]
    notices += [f"{name}: {why}" for name, why in unreadable.items() if name != FUNNEL_FILE]
    notice_html = "".join(f'<p class="muted">{_e(n)}</p>' for n in notices)
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="muted">preset <code>{_e((funnel or {}).get("preset_name", "?"))}</code> · stats from '
        f"<code>{_e(loaded['stats_dir'])}</code></p>",
        '<nav><a href="#funnel">funnel</a><a href="#distributions">distributions</a><a href="#thresholds">thresholds</a>'
        '<a href="#nsfw">nsfw</a><a href="#rejects">sampled rejects</a><a href="#near-duplicates">near-duplicates</a>'
        '<a href="#preset">preset</a></nav>',
        banner,
        notice_html,
        _section_funnel(funnel),
        _section_distributions(loaded.get("distributions"), preset),
        what_if_section.section(loaded.get("what_if"), funnel),
        section_nsfw(loaded, revealed),
        _section_samples(loaded.get("samples") or [], funnel),
        _section_near_duplicates(loaded.get("near_duplicates") or [], NEAR_DUPLICATES_FILE in loaded.get("missing", []), preset),
        _section_preset(funnel),
    ]
    body[-1:-1] = [section for section in (_section_concepts(loaded.get("concepts")), section_model_score(loaded, _img)) if section]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
