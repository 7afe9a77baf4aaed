"""CPU of a rebuild that reuses a previous build's facts (``--reuse``) against a full rebuild, per kind of change.

    python -m benchmarks.reuse_cost [--photos 2000] [--sample 1000] [--repeats 3] [--json PATH]

Inputs: ``benchmarks.photo_candidates`` photographs (400-800 px, 5 files)
and the ``samplegen`` sample (its candidates, its evaluation set and build
overrides, as the demo builds it). For each input, NSFW on (the ``align``
preset's open_nsfw at 0.5) and off (``nsfw_threshold=1.0``):

- the old build: the input with ``--set min_shorter_side=300`` (a stricter
  size rule, so that loosening it admits records the old build never
  decoded or scored);
- (a) a looser per-record threshold: the size rule back at the preset's 200;
- (b) a changed corpus-wide threshold: ``max_images_per_text=5``;
- (c) 20% more input files: one more file of new records beside the old ones;
- (d) an added evaluation set: 40 of the input's pictures and 40 others as a
  second set (the photographs have none before: theirs is the first).

Each case is built twice with the same arguments, in full and with
``--reuse`` of the old build, in turns (``harness.interleaved``); each pair's
outputs are checked to hold the same records, reasons and funnel (bar the
read stage's note) before its figures count. CPU is the build process and
every worker it reaped (user + system); the ratio is reuse / full. Both
include the interpreter's and Beam's start-up (~4 CPU-s), the same for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from benchmarks import harness, record
from benchmarks.helpers.images import write_candidates

OLD = ["--set", "min_shorter_side=300"]
CASES = ("a_looser_record_rule", "b_corpus_threshold", "c_more_files", "d_eval_set")


def same_output(full: str, reused: str) -> None:
    """The two versions' tables, ledger and funnel agree (what the tests check byte for byte)."""
    from common.corpus_dir import resolve

    a, b = resolve(full), resolve(reused)
    for relative in ("stats/candidates/_summary.json", "stats/what_if.json"):
        with open(os.path.join(a, relative), "rb") as one, open(os.path.join(b, relative), "rb") as other:
            if one.read() != other.read():
                raise SystemExit(f"error: {relative} differs between {full} and {reused}")
    funnels = []
    for output in (full, reused):
        funnel = harness.funnel(output)
        funnel["stages"] = [{k: v for k, v in stage.items() if not (stage["stage"] == "read" and k == "note")}
                            for stage in funnel["stages"]]
        funnels.append(funnel)
    if funnels[0] != funnels[1]:
        raise SystemExit(f"error: the funnels of {full} and {reused} differ")


def eval_set(directory: str, input_dir: str, count: int = 40) -> str:
    """``count`` pictures of the input and ``count`` others (another seed) as JPEG files: an evaluation set."""
    import pyarrow.parquet as pq

    from benchmarks.helpers.images import candidate

    os.makedirs(directory, exist_ok=True)
    first = sorted(f for f in os.listdir(input_dir) if f.endswith(".parquet"))[0]
    pictures = [data for data in pq.read_table(os.path.join(input_dir, first), columns=["jpg"]).column("jpg")
                .to_pylist() if data][:count]
    pictures += [candidate(99, i)["jpg"] for i in range(count)]
    for i, data in enumerate(pictures):
        with open(os.path.join(directory, f"{i:03d}.jpg"), "wb") as handle:
            handle.write(data)
    return directory


def prepare(work: str, kind: str, size: int) -> dict:
    """The old build's arguments (without --output) and each case's.

    The old build reads ``in/base/``; 20% more records in new files go to
    ``in/more/``, and the case's glob reads both (the old files at the same paths).
    """
    if kind == "photos":
        write_candidates(os.path.join(work, "in", "base"), size, seed=0, rows_per_file=max(1, size // 5))
        write_candidates(os.path.join(work, "in", "more"), max(1, size // 5), seed=1, rows_per_file=size)
        base = ["--input", os.path.join(work, "in", "base", "*.parquet"), "--preset", "align"]
        both = os.path.join(work, "in", "*", "*.parquet")
        pictures = os.path.join(work, "in", "base")
    else:
        harness.make_sample(os.path.join(work, "in", "base"), size, seed=0)
        harness.make_sample(os.path.join(work, "more"), max(1, size // 5), seed=1)
        shutil.move(os.path.join(work, "more", "candidates"), os.path.join(work, "in", "more", "candidates"))
        args = harness.sample_build_args(os.path.join(work, "in", "base"), "unused")
        at = args.index("--output")
        base = args[:at] + args[at + 2:]
        both = os.path.join(work, "in", "*", "candidates", "*.parquet")
        pictures = os.path.join(work, "in", "base", "candidates")
    more = [both if arg == base[1] else arg for arg in base]
    added = ["--eval_images", f"added={eval_set(os.path.join(work, 'added_eval'), pictures)}"]
    return {"old": base + OLD, "cases": {
        "a_looser_record_rule": base,
        "b_corpus_threshold": base + OLD + ["--set", "max_images_per_text=5"],
        "c_more_files": more + OLD,
        "d_eval_set": base + OLD + added,
    }}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--sample", type=int, default=1000, help="the sample's candidates (samplegen --num_candidates)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each arm, in turns A, B, A, B; the medians count")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of " + ", ".join(CASES))
    parser.add_argument("--nsfw", default="on,off", help="on, off or both (comma-separated)")
    parser.add_argument("--json", default="", help="default benchmarks/results/reuse_cost.json")
    args = parser.parse_args(argv)
    cases = [case for case in CASES if case in args.cases.split(",") or case[0] in args.cases.split(",")]
    settings = [(f"nsfw_{name}", extra) for name, extra in (("on", []), ("off", ["--set", "nsfw_threshold=1.0"]))
                if name in args.nsfw.split(",")]
    if not cases or not settings:
        parser.error(f"--cases names none of {', '.join(CASES)}, or --nsfw neither on nor off")
    run = record.Run()
    results = {}
    for kind, size in (("photos", args.photos), ("sample", args.sample)):
        if not size:
            continue
        with tempfile.TemporaryDirectory() as work:
            plan = prepare(work, kind, size)
            for setting, extra in settings:
                old = os.path.join(work, f"old_{setting}")
                built = harness.run_build(plan["old"] + extra + ["--output", old], os.path.join(work, "logs"))
                figures = {"old_build_cpu_s": round(built["cpu_s"], 2)}
                for case in cases:
                    argv_case = plan["cases"][case] + extra
                    outputs = {}

                    def arm(name, reuse):
                        def go():
                            out = os.path.join(work, f"{case}_{setting}_{name}_{len(outputs.get(name, []))}")
                            outputs.setdefault(name, []).append(out)
                            more = ["--reuse", old] if reuse else []
                            return harness.run_build(argv_case + ["--output", out] + more,
                                                     os.path.join(work, "logs"))["cpu_s"]
                        return go

                    runs = harness.interleaved({"full": arm("full", False), "reuse": arm("reuse", True)},
                                               args.repeats)
                    same_output(outputs["full"][0], outputs["reuse"][0])
                    full, reused = (sorted(runs[n])[len(runs[n]) // 2] for n in ("full", "reuse"))
                    figures[case] = {"full_cpu_s": round(full, 2), "reuse_cpu_s": round(reused, 2),
                                     "ratio": round(reused / full, 3), "read_note": harness.stage_note(harness.funnel(outputs["reuse"][0]), "read")}
                    print(kind, setting, case, json.dumps(figures[case]), flush=True)
                    for out in outputs["full"] + outputs["reuse"]:
                        shutil.rmtree(out, ignore_errors=True)
                results[f"{kind}_{setting}"] = figures
    run.write("reuse_cost", dict(results=results, photos=args.photos, sample=args.sample, repeats=args.repeats,
                                 cases=cases, nsfw=[setting for setting, _ in settings]),
              args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
