"""Does model-score filtering help? The noisy pool built three ways, trained with several seeds, evaluated alike.

    nice -n 10 python -m benchmarks.model_score_evidence --work DIR [--seeds 0,1,2] [--pairs 6000]
        [--mismatched_share 0.3] [--folds 2] [--steps N] [--crossfit_steps N] [--only STEP,...]
    python -m benchmarks.model_score_evidence --work DIR --summary   # the figures of what has finished

Resumable: every step writes its output where the next run finds it and
skips it (a committed build, a run at its config's ``total_steps``, an
evaluation's JSON), so an interrupted harness is finished by running the
same command again. Steps, in order (``--only`` runs a subset):

1. ``pool``: ``benchmarks.noisy_pool`` (``--pairs``, ``--mismatched_share``).
2. ``builds``: the pool three ways and the held-out pairs once:
   ``none`` (every rule off that can be: the arm "no filter"), ``align``
   (ALIGN's rules, the tiny-corpus overrides of the sample), ``heldout``
   (the clean held-out pairs, all in the validation split); then one
   vocabulary (``trainer.vocab``, 2000 word pieces) from ``none``'s
   alt-texts, which every run uses, so the arms differ in their pairs only.
3. ``crossfit``: ``trainer.crossfit`` on ``align`` (``--folds`` models,
   ``--crossfit_steps`` each: with 2 folds each model sees half the pairs,
   so half the schedule is as many passes over its data).
4. ``score``: ``align`` rebuilt with ``--model_score crossfit`` and a cut
   that rejects every scored pair (``model_score_threshold=1``), so that its
   ledger holds each scored pair's cosine and its histogram every such pair;
   the threshold by the label-blind rule (``filters.score_cut.otsu_threshold``
   of that histogram, written down before the runs: ``docs/model-score.md``);
   then ``ms``: ``align`` with ``--model_score crossfit`` at that threshold
   (the third arm).
5. ``train``: ``tiny`` for ``--steps`` (default 400 of its 1,200: the
   schedule an idle 2-core machine pays for 13 runs in about an hour; the
   ALIGN arm ends at ~30x chance held-out R@1) on ``align``
   and ``ms``, one run per seed, seed by seed; each run evaluated when it
   ends (``evaluate``): retrieval over the held-out pairs, kNN and
   zero-shot over the pool's labelled images.
6. ``plain``: the non-cross-fitted comparison: ``align`` scored by the
   ``align`` run of the first seed (trained on every pair it scores),
   with the same rule (run as soon as that run ends).
7. ``rescore``: the fold models again at the config's full schedule
   (``crossfit_full``) and the same rule on their scores
   (``scored_crossfit_full``): what a better scoring model removes (no arm
   trains on it).
8. ``baseline``: ``tiny`` on ``none`` per seed, evaluated alike.

``--summary`` (also printed at the end) reads what exists:
``benchmarks.model_score_figures``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import List, Optional

from benchmarks import record
from benchmarks.harness import cpu_children
from common import cli

REPO = record.REPO
STEPS = ("pool", "builds", "crossfit", "score", "train", "plain", "rescore", "baseline")
ARMS = ("none", "align", "ms")
CONFIG = "trainer/configs/tiny.py"
#: The schedule the recorded evidence ran (benchmarks/RESULTS.md), the same for every arm and seed.
STEPS_RUN = 400
VOCAB_SIZE = 2000
#: The sample's overrides for a corpus of thousands (samplegen.writer.build_overrides).
SMALL_CORPUS = ["vocab_size=0", "min_ngram_count=2", "num_clusters=16"]
#: Every rule off that can be turned off, the others at values that keep every pair: the arm "no filter".
NO_FILTER = ["min_shorter_side=0", "max_aspect_ratio=1000", "min_words=0", "max_words=1000", "max_chars=100000",
             "max_texts_per_image=0", "max_images_per_text=0", "vocab_size=0", "min_ngram_count=0",
             "num_clusters=16"]
#: In every arm: the pool's pictures are drawn scenes that the NSFW scorer rejects none of, at ~25 CPU-ms per
#: picture (five builds of 6,000 pairs: most of the builds' CPU); the arms differ by the rules under test only.
NSFW_OFF = "nsfw_threshold=1.0"
#: A threshold no cosine reaches: every scored pair goes to the ledger with its score.
EVERY_SCORE = "model_score_threshold=1"


class Harness:
    def __init__(self, work: str, log=print):
        self.work = os.path.abspath(work)
        self.log_line = log
        os.makedirs(self.work, exist_ok=True)

    def path(self, *parts) -> str:
        return os.path.join(self.work, *parts)

    def log(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        self.log_line(line)
        with open(self.path("harness.log"), "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def run(self, what: str, command: List[str], record_to: Optional[str] = None) -> None:
        """One subprocess with its CPU and wall time (and the load) logged; a failure ends the harness."""
        before, load, start = cpu_children(), os.getloadavg(), time.time()
        with open(self.path("commands.log"), "a", encoding="utf-8") as f:
            f.write(" ".join(command) + "\n")
        done = subprocess.run([sys.executable, *command], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        cpu, wall = cpu_children() - before, time.time() - start
        facts = {"cpu_s": round(cpu, 1), "wall_s": round(wall, 1), "load_before": [round(x, 2) for x in load],
                 "load_after": [round(x, 2) for x in os.getloadavg()]}
        self.log(f"{what}: exit {done.returncode}, {cpu:.0f} CPU-s, {wall:.0f} s wall, load {load[0]:.1f}")
        if done.returncode != 0:
            tail = done.stdout.decode(errors="replace").strip().splitlines()[-3:]
            raise SystemExit(f"error: {what} failed: {' | '.join(tail)}")
        if record_to:
            with open(record_to, "w", encoding="utf-8") as f:
                json.dump(facts, f, indent=2)

    # -- corpora -------------------------------------------------------------------------------------------

    def corpus(self, name: str) -> str:
        return self.path("corpora", name)

    def build(self, name: str, pattern: str, sets: List[str], extra: List[str] = ()) -> None:
        output = self.corpus(name)
        if os.path.exists(os.path.join(output, "dataset_info.json")):
            return
        argv = ["-m", "pipeline.build", "--input", pattern, "--output", output, "--preset", "align"]
        for value in [*sets, NSFW_OFF]:
            argv += ["--set", value]
        self.run(f"build {name}", argv + list(extra), self.path("corpora", f"{name}.cost.json"))

    def vocab(self) -> str:
        from common.corpus_dir import resolve

        return os.path.join(resolve(self.corpus("none")), "vocab.txt")

    def step_pool(self, pairs: int, share: float) -> None:
        if os.path.exists(self.path("pool", "pool_info.json")):
            return
        self.run("pool", ["-m", "benchmarks.noisy_pool", "--out", self.path("pool"), "--pairs", str(pairs),
                          "--mismatched_share", str(share), "--processes", "2"])

    def step_builds(self) -> None:
        candidates = self.path("pool", "candidates", "*.parquet")
        self.build("none", candidates, NO_FILTER)
        self.build("align", candidates, SMALL_CORPUS)
        self.build("heldout", self.path("pool", "heldout", "*.parquet"), NO_FILTER + ["validation_fraction=1"])
        if not os.path.exists(self.vocab()):
            self.run("vocab", ["-m", "trainer.vocab", "--data_dir", self.corpus("none"),
                               "--vocab_size", str(VOCAB_SIZE)])

    def train_overrides(self, steps: Optional[int]) -> List[str]:
        found = [f"--config.vocab_path={self.vocab()}", "--config.evals.retrieval.every=0"]
        return found + ([f"--config.total_steps={steps}"] if steps else [])

    def step_crossfit(self, folds: int, steps: Optional[int]) -> None:
        """The fold models (``steps``: their schedule, default the config's)."""
        if os.path.exists(self.path("crossfit", "crossfit.json")):
            return
        self.run("crossfit", ["-m", "trainer.crossfit", "--config", CONFIG, "--data_dir", self.corpus("align"),
                              "--workdir", self.path("crossfit"), "--folds", str(folds),
                              *self.train_overrides(steps)], self.path("crossfit.cost.json"))

    def score_and_cut(self, name: str, model: List[str]) -> float:
        """Builds ``name`` (every scored pair in its ledger) and returns the label-blind rule's threshold."""
        from benchmarks.model_score_figures import histogram_of
        from filters.score_cut import otsu_threshold

        self.build(name, self.path("pool", "candidates", "*.parquet"), SMALL_CORPUS + [EVERY_SCORE], model)
        threshold = otsu_threshold(histogram_of(self.corpus(name)))
        with open(self.path("corpora", f"{name}.threshold.json"), "w", encoding="utf-8") as f:
            json.dump({"rule": "otsu", "threshold": threshold}, f)
        self.log(f"{name}: the label-blind rule's threshold {threshold:g}")
        return threshold

    def step_score(self) -> None:
        model = ["--model_score", "crossfit", "--model_score_arg", f"workdir={self.path('crossfit')}"]
        threshold = self.score_and_cut("scored_crossfit", model)
        self.build("ms", self.path("pool", "candidates", "*.parquet"),
                   SMALL_CORPUS + [f"model_score_threshold={threshold!r}"], model)

    def step_plain(self, seed: int) -> None:
        run = self.path("runs", f"align_s{seed}")
        from trainer.crossfit import trained_to_end

        if not trained_to_end(run):
            self.log(f"plain: waits for {run}")
            return
        self.score_and_cut("scored_plain", ["--model_score", "checkpoint", "--model_score_arg", f"workdir={run}"])

    # -- training and evaluation ---------------------------------------------------------------------------

    def step_rescore(self, folds: int) -> None:
        """The fold models at the config's full schedule, and the same rule on their scores (no arm trains on it)."""
        if not os.path.exists(self.path("crossfit_full", "crossfit.json")):
            self.run("crossfit_full", ["-m", "trainer.crossfit", "--config", CONFIG, "--data_dir",
                                       self.corpus("align"), "--workdir", self.path("crossfit_full"),
                                       "--folds", str(folds), *self.train_overrides(None)],
                     self.path("crossfit_full.cost.json"))
        self.score_and_cut("scored_crossfit_full",
                           ["--model_score", "crossfit", "--model_score_arg", f"workdir={self.path('crossfit_full')}"])

    def step_train(self, seeds: List[int], steps: Optional[int], plain_seed: int, arms=("align", "ms")) -> None:
        from trainer.crossfit import trained_to_end

        for arm, seed in [(arm, seed) for seed in seeds for arm in arms]:
            run = self.path("runs", f"{arm}_s{seed}")
            if not trained_to_end(run):
                self.run(f"train {arm} seed {seed}",
                         ["-m", "trainer.train", f"--config={CONFIG}", f"--workdir={run}",
                          f"--config.data_dir={self.corpus(arm)}", f"--config.seed={seed}",
                          *self.train_overrides(steps)], os.path.join(run, "cost.json"))
            self.evaluate(run)
            if arm == "align" and seed == plain_seed:
                self.step_plain(seed)

    def evaluate(self, run: str) -> None:
        output = os.path.join(run, "eval", "evidence.json")
        if os.path.exists(output):
            return
        pool = self.path("pool")
        self.run(f"evaluate {os.path.basename(run)}", [
            "-m", "trainer.evaluate", run, "--output", output,
            "--eval", f"heldout=retrieval:data_dir={self.corpus('heldout')},split=validation",
            "--eval", f"zeroshot=zeroshot:image_dir={pool}/eval/test",
            "--eval", f"knn=knn:train_dir={pool}/eval/train,test_dir={pool}/eval/test"])


def main(argv=None) -> int:
    parser = cli.ArgumentParser(prog="python -m benchmarks.model_score_evidence",
                                description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="directory of every step's output (kept: resumable)")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds per arm (comma-separated)")
    parser.add_argument("--pairs", type=int, default=6000, help="pairs in the noisy pool")
    parser.add_argument("--mismatched_share", type=float, default=0.3, help="share of mismatched pairs in the pool")
    parser.add_argument("--folds", type=int, default=2, help="cross-fitting folds")
    parser.add_argument("--steps", type=int, default=STEPS_RUN,
                        help=f"training steps of every arm and seed (default {STEPS_RUN}; 0: the config's schedule)")
    parser.add_argument("--crossfit_steps", type=int, default=None,
                        help="steps of each fold model (default: --steps)")
    parser.add_argument("--only", default=",".join(STEPS), help=f"steps to run, of {','.join(STEPS)}")
    parser.add_argument("--summary", action="store_true", help="only print and record the figures of what exists")
    parser.add_argument("--json", default=None, help="default benchmarks/results/model_score_evidence.json")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: integers, comma-separated")
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if not seeds or any(s not in STEPS for s in only):
        parser.error(f"--seeds needs one seed at least, --only names steps of {','.join(STEPS)}")
    from benchmarks import model_score_figures

    harness = Harness(args.work)
    run = record.Run()
    if not args.summary:
        steps = {"pool": lambda: harness.step_pool(args.pairs, args.mismatched_share),
                 "builds": harness.step_builds,
                 "crossfit": lambda: harness.step_crossfit(args.folds, args.crossfit_steps or args.steps),
                 "score": harness.step_score,
                 "train": lambda: harness.step_train(seeds, args.steps, seeds[0]),
                 "plain": lambda: harness.step_plain(seeds[0]),
                 "rescore": lambda: harness.step_rescore(args.folds),
                 "baseline": lambda: harness.step_train(seeds, args.steps, seeds[0], arms=("none",))}
        for step in STEPS:
            if step in only:
                steps[step]()
    figures = model_score_figures.summarize(harness.work, seeds)
    model_score_figures.report(figures)
    written = run.write("model_score_evidence", figures, args.json)
    picture = model_score_figures.plot(figures, os.path.splitext(written)[0] + ".png")  # beside the JSON
    if picture:
        print(f"wrote {picture}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
