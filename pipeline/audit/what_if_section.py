"""The report's threshold explorer: for each rule, the records written as a curve over its threshold.

Each point is the audit's what-if (``pipeline.what_if``) with that one
threshold changed, every other as built: a filled dot where it is exact, an
open one with its bound as an error bar where it is an estimate. The
build's value is a solid line; ALIGN's and CC12M's (``filters.presets``)
dashed and dotted where they differ from it and fall on the chart. Static
PNGs in the report (no script, no server), like its other plots.
"""

from __future__ import annotations

import html
import math
from typing import List, Optional, Sequence, Tuple

from filters import presets
from pipeline.audit.plots import KEPT, _figure, _finish
from pipeline.what_if import answer as wi
from pipeline.what_if import rules

#: The thresholds the explorer draws, in stage order.
PARAMS = ("min_shorter_side", "max_aspect_ratio", "min_words", "max_words", "max_word_repetition",
          "nsfw_threshold", "model_score_threshold", "model_score_top_fraction",
          "max_texts_per_image", "max_images_per_text", "vocab_size", "min_ngram_count")
POINTS = 40


def _integers(low: int, high: int, log: bool) -> List[int]:
    if high <= low:
        return [low]
    if not log or low < 1:
        step = max(1, (high - low) // POINTS)
        return list(range(low, high + 1, step))
    ratio = (high / low) ** (1 / POINTS)
    return sorted({int(round(low * ratio ** k)) for k in range(POINTS + 1)})


def thresholds(param: str, doc: dict) -> Sequence[float]:
    """The values a curve is drawn at: on the bins' edges wherever the grid has them."""
    built = doc["built"]
    if param == "min_shorter_side":
        return _integers(0, max(800, 2 * built[param]), log=False)
    if param == "max_aspect_ratio":
        return [k / 10 for k in range(10, 61)]
    if param == "min_words":
        return _integers(0, min(built["max_words"], 30), log=False)
    if param == "max_words":
        return _integers(max(built["min_words"], 1), max(100, built[param]), log=False)
    if param == "max_word_repetition":
        return [k / 20 for k in range(21)]
    if param == "nsfw_threshold":  # fine at the low end, where scores of ordinary images lie; 1.0 is off
        return [0.01, 0.02, 0.05] + [k / 20 for k in range(2, 21)]
    if param.startswith("model_score_"):
        return _score_thresholds(param, doc)
    if param in ("max_texts_per_image", "max_images_per_text"):
        cap = doc.get("caps", {}).get(param[len("max_"):])
        return _integers(1, cap, log=True) if cap else []
    facts = doc.get("rare_ngrams")
    if not facts:
        return []
    if param == "min_ngram_count":
        return _integers(0, facts["reach"], log=False)
    total = facts["ngrams_at_or_above_reach"] + sum(n for _, n in facts["count_of_counts"])
    return _integers(facts["ngrams_at_or_above_reach"] + 1, max(total, 2), log=True)


def _score_thresholds(param: str, doc: dict) -> Sequence[float]:
    """The top fraction from 0 to 1; the threshold over the scores' range, on the grid's 0.001 edges (exact)."""
    scored = doc["rules"].get("model_score")
    if not scored:
        return []  # the build ran no model
    if param == "model_score_top_fraction":
        return [k / POINTS for k in range(POINTS + 1)]
    grid = rules.COSINES
    occupied = [b for pairs in scored.values() for b, _ in pairs]
    low, high = grid.ends(min(occupied))[0], grid.ends(max(occupied))[1]
    low, high = math.floor(low * 1000) / 1000, math.ceil(high * 1000) / 1000
    return sorted({round(low + (high - low) * k / POINTS, 3) for k in range(POINTS + 1)})


def curve(param: str, doc: dict, funnel: dict) -> List[Tuple[float, int, int]]:
    """``(threshold, written, bound)`` for each threshold the what-if answers."""
    points = []
    for value in thresholds(param, doc):
        try:
            result = wi.what_if(doc, funnel, wi.parse_assignments([f"{param}={value}"], doc["built"]))
        except wi.WhatIfError:
            continue  # e.g. min_words above max_words, or a vocabulary beyond the reach
        points.append((value, result.written, result.bound))
    return points


def _marks(param: str, built) -> List[Tuple[str, float, str]]:
    marks = [(f"this build: {presets.format_value(built)}", built, "-")]
    for name, style in (("align", "--"), ("cc12m", ":")):
        value = presets.get_preset(name).as_dict()[param]
        if value != built:
            marks.append((f"{name}: {presets.format_value(value)}", value, style))
    return marks


def plot_curve(param: str, points, built, off: Optional[float]) -> str:
    from matplotlib.lines import Line2D

    fig = _figure(5.2, 3.0, bottom=0.7)
    ax = fig.add_subplot()
    xs = [p[0] for p in points]
    ax.plot(xs, [p[1] for p in points], color=KEPT, linewidth=1)
    exact = [p for p in points if p[2] == 0]
    rough = [p for p in points if p[2] > 0]
    ax.plot([p[0] for p in exact], [p[1] for p in exact], "o", color=KEPT, markersize=3)
    if rough:
        ax.errorbar([p[0] for p in rough], [p[1] for p in rough], yerr=[p[2] for p in rough], fmt="o",
                    color=KEPT, markerfacecolor="white", markersize=3, elinewidth=0.8, capsize=2)
    if param in ("max_texts_per_image", "max_images_per_text", "vocab_size") and min(xs) > 0:
        ax.set_xscale("log")
    handles = []
    low, high = min(xs), max(xs)
    for label, value, style in _marks(param, built):
        if value == off or not low <= value <= high:
            continue
        ax.axvline(value, color="black", linestyle=style, linewidth=1)
        handles.append(Line2D([], [], color="black", linestyle=style, linewidth=1, label=label))
    if rough:
        handles.append(Line2D([], [], marker="o", color=KEPT, markerfacecolor="white", linestyle="none",
                              label="estimate (bar: its bound)"))
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.9)
    ax.set_xlabel(param)
    ax.set_ylabel("records written")
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, f"written vs {param}")


def section(doc: Optional[dict], funnel: Optional[dict]) -> str:
    """The report's explorer section (a note when the build wrote no what-if stats)."""
    head = '<h2 id="thresholds">Threshold explorer</h2>'
    if not doc or not funnel or doc.get("format_version") != wi.FORMAT_VERSION:
        return head + '<p class="muted">No stats/what_if.json: this build predates the what-if.</p>'
    figures = []
    for param in PARAMS:
        if param not in doc["built"]:
            continue
        points = curve(param, doc, funnel)
        if len(points) < 2:
            continue
        built = doc["built"][param]
        off = presets.PARAMS_BY_NAME[param].off
        uri = plot_curve(param, points, built, off)
        exact = sum(1 for p in points if p[2] == 0)
        beyond = [f"{label} is off the chart" for label, value, _ in _marks(param, built)
                  if value != off and not points[0][0] <= value <= points[-1][0]]
        caption = html.escape(f"{param}: {exact} of {len(points)} points exact. "
                              f"{presets.PARAMS_BY_NAME[param].doc}. " + "; ".join(beyond))
        figures.append(f'<figure><img src="{uri}" alt="written vs {html.escape(param)}">'
                       f"<figcaption>{caption}</figcaption></figure>")
    text = ("<p>Records written if one threshold changed, every other as built, from this build's stats "
            "(<code>python -m pipeline.audit CORPUS --what_if PARAM=VALUE</code> for any mix). "
            "Filled dots are exact; open dots are estimates, their bar the bound.</p>")
    return head + text + '<div class="plots">' + "".join(figures) + "</div>"
