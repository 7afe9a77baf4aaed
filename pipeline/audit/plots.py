"""The audit report's plots: the funnel, the distributions with the preset's cuts, count of counts, cosines.

Each ``plot_*`` returns a PNG as a ``data:`` URI for the self-contained HTML
of ``pipeline.audit``. matplotlib is imported inside the functions only (a
pyplot-free ``Figure`` on the Agg canvas, no global state), so importing
this module, or the audit, costs nothing when no report is drawn.
"""

from __future__ import annotations

import base64
import functools
import io
import math
from typing import List, Optional, Sequence, Tuple

from filters import presets
from pipeline.funnel.table import as_int, stage_rejected

#: Which preset parameters cut each distribution. The side that is kept
#: (``value OP param``) comes from ``filters.presets.keep_op``, the one place
#: the direction is written; a parameter at its "off" value draws no line.
DISTRIBUTION_CUTS = {
    "shorter_side": ("min_shorter_side", "min_both_sides"),
    "aspect_ratio": ("max_aspect_ratio",),
    "words_per_text": ("min_words", "max_words"),
    "nsfw_score": ("nsfw_threshold",),
    "texts_per_image": ("max_texts_per_image",),
    "images_per_text": ("max_images_per_text",),
}


#: A distribution is drawn on a log count axis when its largest bin is at
#: least this many times its smallest non-empty one (unless it says "log").
LOG_SCALE_RATIO = 50

KEPT, CUT, MIXED, UNKNOWN = "#4c78a8", "#e45756", "#f2a33a", "#9d9da1"
#: The side a distribution's own ``cut`` keeps (``"keep"`` in the file), when it says.
_KEEP_OPS = (">", ">=", "<", "<=")


def distribution_cuts(name: str, dist: dict, preset: dict) -> List[Tuple[str, str, float]]:
    """``[(label, op, value)]`` for a distribution: its own ``cut``, else the preset's."""
    cuts = []
    for param in DISTRIBUTION_CUTS.get(name, ()):
        value = preset.get(param)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not presets.rule_enabled(param, preset):
            continue
        cuts.append((param, presets.keep_op(param, preset), float(value)))
    if not cuts and isinstance(dist.get("cut"), (int, float)):
        cuts.append(("cut", dist.get("keep") if dist.get("keep") in _KEEP_OPS else "", float(dist["cut"])))
    return cuts


def _bins(dist: dict) -> List[Tuple[float, Optional[float], int]]:
    """``[(lo, hi or None for an open last bin, count)]`` from edges/counts.

    Two conventions are read: ``len(counts) == len(edges) - 1`` (bins between
    edges) and ``len(counts) == len(edges)`` (the last bin is ``>= edges[-1]``).
    """
    edges = [float(e) for e in dist.get("edges") or []]
    counts = [as_int(c) for c in dist.get("counts") or []]
    if len(counts) == len(edges) - 1:
        return [(edges[i], edges[i + 1], counts[i]) for i in range(len(counts))]
    if len(counts) == len(edges):
        return [(edges[i], edges[i + 1] if i + 1 < len(edges) else None, counts[i]) for i in range(len(counts))]
    raise ValueError(f"{len(counts)} counts for {len(edges)} edges")


def _bin_label(lo: float, hi: Optional[float], integer: bool) -> str:
    """Integer bins by their inclusive range ([3, 5) is "3–4"); real bins by edges."""

    def num(x):
        return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"

    if hi is None:
        return f"≥{num(lo)}"
    if integer:
        return num(lo) if hi - lo <= 1 else f"{num(lo)}–{num(hi - 1)}"
    return f"{num(lo)}–{num(hi)}"


def _bin_colour(lo: float, hi: Optional[float], cuts, integer: bool) -> str:
    """Kept, cut or mixed: does every value of the bin pass every cut?"""
    ops = [(functools.partial(presets.compare, op), value) for _, op, value in cuts if op]
    if not ops:
        return UNKNOWN
    last = (hi - 1 if integer else hi * (1 - 1e-9)) if hi is not None else math.inf
    ends = [lo, max(lo, last)]
    verdicts = {all(f(v, t) for f, t in ops) for v in ends}
    return KEPT if verdicts == {True} else CUT if verdicts == {False} else MIXED


def _figure(width: float, height: float, left: float = 0.8, bottom: float = 0.55):
    """A pyplot-free Figure (no global state, Agg canvas); margins in inches."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    fig.subplots_adjust(left=left / width, right=1 - 0.2 / width, bottom=bottom / height, top=1 - 0.35 / height)
    return fig


def _png_data_uri(fig) -> str:
    buf = io.BytesIO()
    # A fixed layout, not bbox_inches="tight": that draws every figure twice.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _finish(fig, ax, title: str) -> str:
    """The house style every plot ends with: a small title, no top/right frame; the PNG."""
    ax.set_title(title, fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return _png_data_uri(fig)


def plot_funnel(funnel: dict) -> str:
    """Horizontal bars per stage: records out (kept) and rejected, in order."""
    rows = funnel.get("stages") or []
    fig = _figure(9, 0.3 * max(len(rows), 3) + 1.0, left=1.6, bottom=0.5)
    ax = fig.add_subplot()
    names = [row.get("stage", "?") for row in rows]
    outs = [as_int(row.get("out")) for row in rows]
    rejected = [stage_rejected(row) for row in rows]
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, outs, color=[KEPT if row.get("ran", True) else UNKNOWN for row in rows], label="out (kept)")
    ax.barh(ys, rejected, left=outs, color=CUT, label="rejected by this stage")
    total = max(as_int(funnel.get("input")), 1)
    for y, row, out, rej in zip(ys, rows, outs, rejected):
        text = f"{out:,}" + (f"  (-{rej:,})" if rej else "") + ("" if row.get("ran", True) else "  not run")
        ax.text(total * 1.01, y, text, va="center", fontsize=8)
    ax.set_yticks(ys, names, fontsize=8)
    ax.set_xlim(0, total * 1.3)
    ax.set_xlabel("records")
    ax.legend(loc="lower left", fontsize=8)
    return _finish(fig, ax, "funnel: records remaining after each stage")


def _wants_log(dist: dict) -> bool:
    """The file's ``log`` flag, else log when small bins would vanish next to big ones."""
    if "log" in dist:
        return bool(dist["log"])
    positive = [as_int(c) for c in dist.get("counts") or [] if as_int(c) > 0]
    return bool(positive) and max(positive) >= LOG_SCALE_RATIO * min(positive)


def plot_distribution(name: str, dist: dict, preset: dict) -> str:
    """Equal-width bars per bin (edges are uneven), coloured kept/cut by the preset."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    bins = _bins(dist)
    cuts = distribution_cuts(name, dist, preset)
    integer = all(float(lo).is_integer() and (hi is None or float(hi).is_integer()) for lo, hi, _ in bins)
    fig = _figure(max(5.0, 0.4 * len(bins) + 1.2), 3.2, bottom=0.8)
    ax = fig.add_subplot()
    xs = list(range(len(bins)))
    colours = [_bin_colour(lo, hi, cuts, integer) for lo, hi, _ in bins]
    ax.bar(xs, [c for _, _, c in bins], width=0.9, color=colours)
    ax.margins(y=0.08)
    ax.set_xticks(xs, [_bin_label(lo, hi, integer) for lo, hi, _ in bins], rotation=45, ha="right", fontsize=8)
    if _wants_log(dist):
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylabel("count (log)")
    else:
        ax.set_ylabel("count")
    used = [(KEPT, "kept"), (CUT, "cut"), (MIXED, "partly cut")]
    handles = [Patch(color=c, label=t) for c, t in used if c in colours]
    styles = iter(("--", ":", "-."))
    for label, op, value in cuts:
        x = _position(_boundary(op, value, integer), bins)
        if x is None:
            continue
        style = next(styles, "--")
        ax.axvline(x, color="black", linestyle=style, linewidth=1)
        text = f"{label} = {value:g}" + (f" (keep {op} {value:g})" if op else "")
        handles.append(Line2D([], [], color="black", linestyle=style, linewidth=1, label=text))
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.9)
    return _finish(fig, ax, name)


def _position(value: float, bins) -> Optional[float]:
    """x of ``value`` on the equal-width bin axis (bin i is centred on i)."""
    for i, (lo, hi, _) in enumerate(bins):
        if value < lo:
            return None if i == 0 else i - 0.5
        if hi is None or value < hi:
            return i - 0.5 + (0.0 if hi is None else (value - lo) / (hi - lo))
    return len(bins) - 0.5


def _boundary(op: str, value: float, integer: bool) -> float:
    """Where kept and cut values meet: for integers ``> 200`` cuts 200 itself."""
    return value + 1 if integer and op in (">", "<=") else value


def plot_count_of_counts(coc: dict) -> str:
    """How many distinct n-grams occur exactly c times, log-log, with the cut."""
    pairs = sorted((as_int(c), as_int(n)) for c, n in (coc.get("counts") or {}).items() if as_int(c) > 0)
    fig = _figure(6.5, 3.4, bottom=0.75)
    ax = fig.add_subplot()
    if pairs:
        ax.scatter([c for c, _ in pairs], [n for _, n in pairs], s=8, color=KEPT)
        ax.set_xscale("log")
        ax.set_yscale("log")
    cut = coc.get("cut_count")
    if isinstance(cut, (int, float)) and cut > 0:
        ax.axvline(cut, color=CUT, linestyle="--", linewidth=1)
        ax.text(cut, 0.03, f" n-grams seen < {cut:g} times: out of vocabulary", transform=ax.get_xaxis_transform(),
                va="bottom", fontsize=7, color=CUT)
    ax.set_xlabel("times an n-gram occurs")
    ax.set_ylabel("distinct n-grams")
    return _finish(fig, ax, "n-gram count of counts")


def plot_cosines(pairs: Sequence[dict], threshold: Optional[float]) -> str:
    cosines = [float(p["cosine"]) for p in pairs if isinstance(p.get("cosine"), (int, float))]
    fig = _figure(6.0, 2.6)
    ax = fig.add_subplot()
    ax.hist(cosines, bins=min(40, max(5, len(cosines) // 2)), color=KEPT)
    if threshold:
        ax.axvline(threshold, color=CUT, linestyle="--", linewidth=1)
        ax.text(threshold, 0.97, f" threshold {threshold:g}", transform=ax.get_xaxis_transform(), va="top", fontsize=7)
    ax.set_xlabel("cosine similarity of the pair")
    ax.set_ylabel("pairs")
    return _finish(fig, ax, "near-duplicate pairs found")


def plot_model_scores(entry: dict) -> str:
    """The scored pairs' cosines (bars, coloured by the stage's cut), both cuts, and the scores of the
    pairs other stages rejected (lines): the ``model_score`` entry of distributions.json."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    bins = _bins(entry)
    width = min((hi - lo for lo, hi, _ in bins if hi is not None), default=0.05)
    others = {stage: [as_int(c) for c in (row.get("counts") or [])] for stage, row in
              sorted((entry.get("other_stages") or {}).items()) if isinstance(row, dict)}
    used = [i for i, (_, _, count) in enumerate(bins) if count or any(i < len(c) and c[i] for c in others.values())]
    first, last = (min(used), max(used)) if used else (0, len(bins) - 1)
    shown = bins[first:last + 1]
    lows = [lo for lo, _, _ in shown]
    fig = _figure(7.0, 3.2)
    ax = fig.add_subplot()
    cut = entry.get("cut")
    cuts = [("cut", ">=", float(cut))] if isinstance(cut, (int, float)) else []
    colours = [_bin_colour(lo, lo + width if hi is None else hi, cuts, False) for lo, hi, _ in shown]
    ax.bar(lows, [count for _, _, count in shown], width=width * 0.95, align="edge", color=colours)
    handles = [Patch(color=c, label=t) for c, t in ((KEPT, "kept"), (CUT, "cut"), (MIXED, "partly cut"))
               if c in colours]
    for (stage, counts), style in zip(others.items(), ("-", "--", ":", "-.") * 4):
        ys = [counts[i] if i < len(counts) else 0 for i in range(first, last + 1)]
        ax.step([lo + width / 2 for lo in lows], ys, where="mid", color="black", linestyle=style, linewidth=1)
        handles.append(Line2D([], [], color="black", linestyle=style, linewidth=1, label=f"rejected by {stage}"))
    for name, value, colour in (("model_score_threshold", entry.get("threshold"), CUT),
                                ("top fraction's cut", entry.get("fraction_cut"), MIXED)):
        if isinstance(value, (int, float)):
            ax.axvline(value, color=colour, linestyle="--", linewidth=1.2)
            handles.append(Line2D([], [], color=colour, linestyle="--", label=f"{name} {value:.3f}"))
    if _wants_log({"counts": [count for _, _, count in shown]}):
        ax.set_yscale("symlog", linthresh=1)
    ax.set_xlabel("image-text cosine")
    ax.set_ylabel("pairs")
    ax.legend(handles=handles, fontsize=7, loc="upper left", framealpha=0.9)
    return _finish(fig, ax, "model score: every scored pair, and the pairs other stages rejected")
