"""The bootstrap loop measured: what a model trained on the corpus finds when it scores that corpus.

    python -m benchmarks.bootstrap_loop --sample S --before C1 --after C2 \\
        --train_before W1 --train_after W2 [--json PATH]

The loop on the demo's sample, one model that scores the pairs it trained
on (the commands are in ``benchmarks/RESULTS.md``, "Bootstrap loop"; the
cross-fitted loop on a noisy pool is ``benchmarks.model_score_evidence``):
``samplegen`` makes S; C1 is S built with the ALIGN preset; W1 is
``trainer.train`` on C1; C2 is S built again with ``--model_score
checkpoint --model_score_arg workdir=W1`` and a cut; W2 is
``trainer.train`` on C2 with W1's config and budget.

Figures, from S's manifest (``samplegen``: each row's ``pairing`` and
``expected`` fate) and C2's rejection ledger:

- of the mismatched pairs that reach the model-score stage (their expected
  fate is not a rejection by an earlier stage), the share it rejected;
- of the clean pairs that reach it, the share it rejected;
- the mismatched and clean pairs each corpus wrote (the ledger's complement);
- with ``--every_score C0`` (S built with the same model and
  ``--set model_score_threshold=0.99``, so that every scored pair is in its
  ledger with its cosine), the same two shares at each of ``--thresholds``:
  what another threshold would have removed;
- W1 and W2 evaluated alike (``trainer.evaluate``): retrieval over C1's
  validation split and over C2's (the split is by key hash, so C2's is C1's
  without the pairs the score removed), zero-shot and kNN over S's
  labelled evaluation images.
"""

from __future__ import annotations

import collections
import glob
import json
import os

from benchmarks import record
from common import cli

STAGE = "model_score"


def manifest(sample: str) -> list:
    with open(os.path.join(sample, "manifest.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def ledger(corpus: str):
    """The lines of a committed build's rejection ledger."""
    from common.corpus_dir import resolve

    for path in sorted(glob.glob(os.path.join(resolve(corpus), "stats", "rejected", "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)


def ledger_reasons(corpus: str) -> dict:
    """``{pipeline key: Counter of reasons}`` of a committed build's rejection ledger."""
    reasons = collections.defaultdict(collections.Counter)
    for entry in ledger(corpus):
        reasons[entry["key"]][entry["reason"]] += 1
    return reasons


def threshold_sweep(rows: list, every_score: str, thresholds) -> dict:
    """``{threshold: score_shares}`` from a build whose ledger holds every scored pair's cosine."""
    scores = {e["key"]: e["model_score"] for e in ledger(every_score) if e["reason"].startswith(STAGE + "/")}
    sweep = {}
    for threshold in thresholds:
        below = {key: {STAGE + "/below_threshold": 1} for key, score in scores.items() if score < threshold}
        sweep[str(threshold)] = score_shares(rows, below)
    return sweep


def reaches(expected: str) -> bool:
    """A row whose expected fate is written, or a rejection at or after the model-score stage."""
    from filters import stages

    if expected in ("written", "written_once"):
        return True
    return stages.STAGE_INDEX[stages.stage_of(expected)] >= stages.STAGE_INDEX[STAGE]


def score_shares(rows: list, after: dict) -> dict:
    """Per pairing (clean, mismatched, and the planted ``mismatched_pair`` rows alone): rows that reach the
    stage and how many of them it rejected."""
    shares = {}
    groups = {"mismatched": lambda m: m["pairing"] == "mismatched",
              "mismatched_pair": lambda m: m["case"] == "mismatched_pair",
              "clean": lambda m: m["pairing"] == "clean"}
    for pairing, chosen in groups.items():
        reaching = [m for m in rows if chosen(m) and reaches(m["expected"])]
        cut = sum(1 for m in reaching if any(r.startswith(STAGE + "/") for r in after.get(m["pipeline_key"], ())))
        shares[pairing] = {"reach": len(reaching), "rejected": cut,
                           "share_rejected": round(cut / len(reaching), 4) if reaching else None}
    return shares


def written(rows: list, reasons: dict) -> dict:
    """Per pairing, the rows a corpus wrote: a key's rows minus its ledger lines."""
    per_key = collections.Counter(m["pipeline_key"] for m in rows)
    pairing_of = {m["pipeline_key"]: m["pairing"] for m in rows}
    counts = collections.Counter()
    for key, total in per_key.items():
        counts[str(pairing_of[key])] += total - sum(reasons.get(key, {}).values())
    return dict(sorted(counts.items()))


def evaluations(workdir: str, sample: str, before: str, after: str) -> dict:
    from trainer import evaluate

    eval_dir = os.path.join(sample, "eval")
    specs = [f"held_out_before=retrieval:data_dir={before},split=validation",
             f"held_out_after=retrieval:data_dir={after},split=validation",
             f"zeroshot=zeroshot:image_dir={eval_dir}/test",
             f"knn=knn:train_dir={eval_dir}/train,test_dir={eval_dir}/test"]
    output = os.path.join(workdir, "eval", "bootstrap_loop.json")
    result = evaluate.evaluate(workdir, specs=specs, output=output)
    return {"step": result["step"], **{name: entry["metrics"] for name, entry in result["evals"].items()}}


def main(argv=None) -> int:
    parser = cli.ArgumentParser(prog="python -m benchmarks.bootstrap_loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", required=True, help="samplegen's output (manifest.jsonl, eval/)")
    parser.add_argument("--before", required=True, help="the build without the model-score stage")
    parser.add_argument("--after", required=True, help="the build with it (the model trained on --before)")
    parser.add_argument("--train_before", required=True, help="trainer.train's workdir on --before")
    parser.add_argument("--train_after", required=True, help="trainer.train's workdir on --after")
    parser.add_argument("--every_score", default=None,
                        help="S built with the model and model_score_threshold=0.99 (every scored pair in its ledger)")
    parser.add_argument("--thresholds", default="0.1,0.15,0.2,0.225,0.25,0.275,0.3",
                        help="thresholds of the sweep over --every_score (comma-separated)")
    parser.add_argument("--json", default=None, help="default benchmarks/results/bootstrap_loop.json")
    args = parser.parse_args(argv)
    run = record.Run()

    from common.corpus_dir import resolve

    rows = manifest(args.sample)
    before, after = ledger_reasons(args.before), ledger_reasons(args.after)
    with open(os.path.join(resolve(args.after), "stats", "distributions.json"), encoding="utf-8") as f:
        distribution = json.load(f)[STAGE]
    figures = {
        "score": {k: distribution.get(k) for k in ("model", "scored", "threshold", "fraction_cut", "cut")},
        "shares": score_shares(rows, after),
        "written_before": written(rows, before),
        "written_after": written(rows, after),
        "sweep": threshold_sweep(rows, args.every_score, [float(t) for t in args.thresholds.split(",")])
        if args.every_score else None,
        "eval_before": evaluations(args.train_before, args.sample, args.before, args.after),
        "eval_after": evaluations(args.train_after, args.sample, args.before, args.after),
    }
    shares = figures["shares"]
    print(f"mismatched pairs removed: {shares['mismatched']['rejected']} of {shares['mismatched']['reach']} "
          f"(planted mismatched_pair rows {shares['mismatched_pair']['rejected']} of "
          f"{shares['mismatched_pair']['reach']}); clean pairs lost: {shares['clean']['rejected']} of {shares['clean']['reach']}")
    for name in ("eval_before", "eval_after"):
        e = figures[name]
        print(f"{name}: R@1 i2t/t2i on C1 validation {e['held_out_before']['i2t_R@1']:.3f}/"
              f"{e['held_out_before']['t2i_R@1']:.3f}, on C2 validation {e['held_out_after']['i2t_R@1']:.3f}/"
              f"{e['held_out_after']['t2i_R@1']:.3f}, kNN {e['knn']['top1']:.3f}, zero-shot {e['zeroshot']['top1']:.3f}")
    run.write("bootstrap_loop", figures, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
