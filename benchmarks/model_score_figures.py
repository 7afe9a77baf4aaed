"""The figures of ``benchmarks.model_score_evidence``, from whatever of it has finished.

- ``filter``: per scoring build (``scored_crossfit``: cross-fitted scores;
  ``scored_plain``: one model trained on every pair it scores;
  ``scored_crossfit_full``: cross-fitted, the models at the full schedule), the
  label-blind threshold and, from the pool's manifest, how many of the
  mismatched and clean pairs that reach the stage it removes, per kind;
  beside it, the label-dependent sweep over fixed thresholds (reported,
  never used to choose); for the plain model, the same shares split by
  whether the model trained on the pair (the bias cross-fitting removes);
- ``corpora``: the clean and mismatched pairs each arm's corpus wrote;
- ``runs``: each finished run's held-out retrieval (R@1, R@5 both ways),
  kNN and zero-shot top-1, and its CPU and wall time;
- ``arms``: per arm, mean and sample standard deviation over its seeds;
  ``paired``: per seed, the difference of two arms' figures, and their
  mean and standard deviation (only seeds both arms finished).
"""

from __future__ import annotations

import collections
import json
import os
import statistics
from typing import Dict, List, Optional

STAGE = "model_score"
SWEEP = [round(0.05 * k, 2) for k in range(-2, 11)]
METRICS = {"i2t_R@1": ("heldout", "i2t_R@1"), "t2i_R@1": ("heldout", "t2i_R@1"),
           "i2t_R@5": ("heldout", "i2t_R@5"), "t2i_R@5": ("heldout", "t2i_R@5"),
           "knn_top1": ("knn", "top1"), "zeroshot_top1": ("zeroshot", "top1")}
PAIRS = (("ms", "align"), ("align", "none"), ("ms", "none"))


def histogram_of(corpus: str) -> dict:
    """The model-score histogram a build wrote (``stats/distributions.json``)."""
    from common.corpus_dir import resolve

    with open(os.path.join(resolve(corpus), "stats", "distributions.json"), encoding="utf-8") as f:
        entry = json.load(f)[STAGE]
    return {"edges": entry["edges"], "counts": entry["counts"]}


def _json(path: str) -> Optional[dict]:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _ledger(corpus: str) -> List[dict]:
    from common.corpus_dir import resolve

    directory = os.path.join(resolve(corpus), "stats", "rejected")
    lines = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:  # none rejected: no ledger
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            lines += [json.loads(line) for line in f]
    return lines


def _committed(corpus: str) -> bool:
    return os.path.exists(os.path.join(corpus, "dataset_info.json"))


def manifest(work: str) -> List[dict]:
    with open(os.path.join(work, "pool", "manifest.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if '"part": "pool"' in line]


def _share(removed: int, reach: int) -> dict:
    return {"reach": reach, "removed": removed, "share": round(removed / reach, 4) if reach else None}


def removal(rows: List[dict], scores: Dict[str, float], threshold: float) -> dict:
    """Of the pairs that reached the stage (scored): how many of each pairing and kind ``cosine < threshold``
    removes."""
    out = {}
    for group, chosen in (("mismatched", lambda m: m["pairing"] == "mismatched"),
                          ("clean", lambda m: m["pairing"] == "clean")):
        reach = [m for m in rows if chosen(m) and m["pipeline_key"] in scores]
        out[group] = _share(sum(scores[m["pipeline_key"]] < threshold for m in reach), len(reach))
    for kind in sorted({m["kind"] for m in rows}):
        reach = [m for m in rows if m["kind"] == kind and m["pipeline_key"] in scores]
        out[f"kind:{kind}"] = _share(sum(scores[m["pipeline_key"]] < threshold for m in reach), len(reach))
    return out


def filter_figures(work: str, name: str, rows: List[dict]) -> Optional[dict]:
    corpus = os.path.join(work, "corpora", name)
    rule = _json(os.path.join(work, "corpora", f"{name}.threshold.json"))
    if not _committed(corpus) or rule is None:
        return None
    scores = {e["key"]: e["model_score"] for e in _ledger(corpus) if e["reason"].startswith(STAGE + "/")}
    threshold = rule["threshold"]
    figures = {"threshold_rule": rule["rule"], "threshold": threshold, "scored": len(scores),
               "histogram": histogram_of(corpus), "at_threshold": removal(rows, scores, threshold),
               "sweep_label_dependent": {str(t): {g: removal(rows, scores, t)[g] for g in ("mismatched", "clean")}
                                         for t in SWEEP}}
    if name == "scored_plain":
        from common.schema import split_of

        for split in ("train", "validation"):
            keys = {k for k in scores if split_of(k, 0.05) == split}
            figures[f"seen_by_model:{split}"] = removal(rows, {k: scores[k] for k in keys}, threshold)
    return figures


def written(work: str, arm: str, rows: List[dict]) -> Optional[dict]:
    corpus = os.path.join(work, "corpora", arm)
    if not _committed(corpus):
        return None
    rejected = {e["key"] for e in _ledger(corpus)}
    kept = [m for m in rows if m["pipeline_key"] not in rejected]
    counts = collections.Counter(m["pairing"] for m in kept)
    kinds = collections.Counter(m["kind"] for m in kept)
    total = sum(counts.values())
    return {"written": total, "clean": counts["clean"], "mismatched": counts["mismatched"],
            "mismatched_share": round(counts["mismatched"] / total, 4) if total else None, "kinds": dict(kinds)}


def run_figures(work: str, arm: str, seed: int) -> Optional[dict]:
    run = os.path.join(work, "runs", f"{arm}_s{seed}")
    evaluation = _json(os.path.join(run, "eval", "evidence.json"))
    if evaluation is None:
        return None
    evals = evaluation["evals"]
    figures = {name: evals[which]["metrics"][key] for name, (which, key) in METRICS.items()}
    figures["step"] = evaluation["step"]
    cost = _json(os.path.join(run, "cost.json")) or {}
    figures.update({k: cost.get(k) for k in ("cpu_s", "wall_s", "load_before")})
    return figures


def _mean_sd(values: List[float]) -> dict:
    return {"n": len(values), "mean": round(statistics.fmean(values), 4),
            "sd": round(statistics.stdev(values), 4) if len(values) > 1 else None}


def summarize(work: str, seeds) -> dict:
    work = os.path.abspath(work)
    if not os.path.exists(os.path.join(work, "pool", "manifest.jsonl")):
        return {}
    rows = manifest(work)
    runs = {f"{arm}_s{seed}": run_figures(work, arm, seed) for arm in ("none", "align", "ms") for seed in seeds}
    runs = {name: figures for name, figures in runs.items() if figures}
    arms = {}
    for arm in ("none", "align", "ms"):
        done = [runs[f"{arm}_s{s}"] for s in seeds if f"{arm}_s{s}" in runs]
        if done:
            arms[arm] = {metric: _mean_sd([r[metric] for r in done]) for metric in METRICS}
    paired = {}
    for a, b in PAIRS:
        both = [s for s in seeds if f"{a}_s{s}" in runs and f"{b}_s{s}" in runs]
        if both:
            per_seed = {str(s): {m: round(runs[f"{a}_s{s}"][m] - runs[f"{b}_s{s}"][m], 4) for m in METRICS}
                        for s in both}
            paired[f"{a}-{b}"] = {"per_seed": per_seed, **{
                m: _mean_sd([per_seed[str(s)][m] for s in both]) for m in METRICS}}
    return {
        "pool": _json(os.path.join(work, "pool", "pool_info.json")),
        "filter": {name: filter_figures(work, name, rows)
                   for name in ("scored_crossfit", "scored_plain", "scored_crossfit_full")},
        "corpora": {arm: written(work, arm, rows) for arm in ("none", "align", "ms")},
        "runs": runs, "arms": arms, "paired": paired,
    }


def report(figures: dict) -> None:
    if not figures:
        print("nothing has finished yet")
        return
    for name, found in figures["filter"].items():
        if not found:
            continue
        at = found["at_threshold"]
        print(f"{name}: threshold {found['threshold']:g} ({found['threshold_rule']}): mismatched removed "
              f"{at['mismatched']['removed']}/{at['mismatched']['reach']} ({at['mismatched']['share']:.1%}), "
              f"clean lost {at['clean']['removed']}/{at['clean']['reach']} ({at['clean']['share']:.1%})")
    for arm, found in figures["corpora"].items():
        if found:
            print(f"corpus {arm}: {found['written']} written, {found['mismatched']} mismatched "
                  f"({found['mismatched_share']:.1%})")
    for arm, found in figures["arms"].items():
        print(f"{arm}: " + ", ".join(f"{m} {v['mean']:.3f}" + (f" ± {v['sd']:.3f}" if v["sd"] is not None else "")
                                     + f" (n={v['n']})" for m, v in found.items() if "R@5" not in m))
    for pair, found in figures["paired"].items():
        print(f"{pair}: " + ", ".join(f"{m} {v['mean']:+.3f}" + (f" ± {v['sd']:.3f}" if v["sd"] is not None else "")
                                      for m, v in found.items() if m != "per_seed" and "R@5" not in m)
              + f" (seeds {', '.join(found['per_seed'])})")


def plot(figures: dict, path: str) -> Optional[str]:
    """The figures' picture (PNG at ``path``): each scoring build's trade-off over fixed thresholds (mismatched
    pairs removed against clean pairs lost, the label-blind cut marked, the 80% / 10% bar shaded), and each arm's
    held-out R@1 and kNN / zero-shot top-1, mean and standard deviation over its seeds. None before anything."""
    if not figures or not (any(figures["filter"].values()) or figures["arms"]):
        return None
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2))
    trade, arms = figure.subplots(1, 2)
    trade.fill_between([0, 0.1], 0.8, 1.0, color="#d8ecd8", label="the bar: >= 80% removed, <= 10% lost")
    for name, found in figures["filter"].items():
        if not found:
            continue
        sweep = sorted(found["sweep_label_dependent"].items(), key=lambda item: float(item[0]))
        line, = trade.plot([s["clean"]["share"] for _, s in sweep], [s["mismatched"]["share"] for _, s in sweep],
                           marker=".", label=name)
        at = found["at_threshold"]
        trade.plot(at["clean"]["share"], at["mismatched"]["share"], marker="o", markersize=9, color=line.get_color(),
                   markerfacecolor="none")
        trade.annotate(f"cut {found['threshold']:g}", (at["clean"]["share"], at["mismatched"]["share"]),
                       textcoords="offset points", xytext=(6, -12), fontsize=8)
    trade.set(xlabel="clean pairs lost", ylabel="mismatched pairs removed", xlim=(0, 1), ylim=(0, 1.02),
              title="the score's cut over fixed thresholds (o: the label-blind cut)")
    trade.legend(fontsize=8, loc="lower right")
    metrics = ["i2t_R@1", "t2i_R@1", "knn_top1", "zeroshot_top1"]
    names = [arm for arm in ("none", "align", "ms") if arm in figures["arms"]]
    width = 0.8 / max(1, len(names))
    for i, arm in enumerate(names):
        found = figures["arms"][arm]
        arms.bar([m + i * width for m in range(len(metrics))], [found[m]["mean"] for m in metrics], width,
                 yerr=[found[m]["sd"] or 0 for m in metrics], capsize=3, label=f"{arm} (n={found[metrics[0]]['n']})")
    arms.set_xticks([m + width * (len(names) - 1) / 2 for m in range(len(metrics))], metrics)
    arms.set(title="each arm, mean and sd over seeds", ylabel="score")
    arms.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path
