r"""Cross-fitted scoring models: K models, each trained on the corpus without one fold of its pairs.

    python -m trainer.crossfit --config trainer/configs/tiny.py --data_dir C1 --workdir W \
        [--folds 2] [--config.NAME=VALUE ...]

A model scores the pairs it was trained on higher than pairs it never saw,
mismatched ones too, so a model trained on a corpus is a poor judge of that
same corpus (Data Filtering Networks train the filtering model apart from
the pool it filters). Here the corpus's pairs are split into ``--folds``
folds by a hash of their key (``common.schema.fold_of``); model k is
trained on every fold but k, and the build scores the pairs of fold k with
model k only (``--model_score crossfit --model_score_arg workdir=W``,
``trainer.pair_score.CrossFitPairModel``): no pair is judged by a model
that saw it.

Written under ``--workdir``::

    data_<k>/      the corpus's train split without fold k (shards of the plain layout), and its whole
                   validation split (no model trains on it)
    fold_<k>/      model k: a trainer.train workdir
    crossfit.json  the folds, the corpus, and the pairs each model trained on; written last, once every
                   model has reached its config's total_steps (the scorer refuses a workdir without it)

Every model gets the same ``--config`` and overrides (each a ``trainer.train``
run, so seeds and schedules are the config's); the vocabulary is the
corpus's ``vocab.txt`` unless ``--config.vocab_path`` names one, so the
models and a model trained on the whole corpus tokenise alike. Run again
after an interruption, it keeps the fold data already written and the
models already trained and resumes a model from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List, Optional, Sequence

from common import cli
from common.schema import fold_of, shard_filename
from common.tfrecord_io import decode_example, read_frames, write_records

MANIFEST = "crossfit.json"
COMPLETED = "COMPLETED"  # a fold's data is complete (common.corpus_dir's plain layout)
#: Records per shard of a fold's data.
RECORDS_PER_SHARD = 2000


class CrossFitError(Exception):
    """A problem with the corpus, the config or a fold's run: one line for the person."""


def fold_dir(workdir: str, fold: int) -> str:
    return os.path.join(workdir, f"fold_{fold}")


def data_dir(workdir: str, fold: int) -> str:
    return os.path.join(workdir, f"data_{fold}")


def _shards(corpus: str, split: str) -> List[str]:
    suffix = f"-{split}.tfrecord-"
    return sorted(os.path.join(corpus, name) for name in os.listdir(corpus) if suffix in name)


def _records(path: str):
    with open(path, "rb") as f:
        for payload in read_frames(f):
            if not isinstance(payload, bytes):
                raise CrossFitError(f"{path}: a damaged record; rebuild the corpus")
            yield payload


def write_fold_data(corpus: str, out: str, fold: int, folds: int, name: str = "crossfit") -> int:
    """``out`` <- the corpus's train records outside ``fold``, and its validation records; the train count."""
    if os.path.exists(os.path.join(out, COMPLETED)):
        with open(os.path.join(out, COMPLETED), encoding="utf-8") as f:
            return int(json.load(f)["train_records"])
    os.makedirs(out, exist_ok=True)
    kept = [payload for path in _shards(corpus, "train") for payload in _records(path)
            if fold_of(_key(payload), folds) != fold]
    if not kept:
        raise CrossFitError(f"no train pairs of {corpus} outside fold {fold} of {folds}")
    _write_split(out, name, "train", kept)
    validation = [payload for path in _shards(corpus, "validation") for payload in _records(path)]
    if validation:
        _write_split(out, name, "validation", validation)
    with open(os.path.join(out, COMPLETED), "w", encoding="utf-8") as f:
        json.dump({"train_records": len(kept), "validation_records": len(validation), "fold": fold,
                   "folds": folds, "corpus": corpus}, f)
    return len(kept)


def _key(payload: bytes) -> str:
    values = decode_example(payload, names=("key",), first_only=True)["key"]
    if not values:
        raise CrossFitError("a corpus record without a key")
    return values[0].decode("utf-8")


def _write_split(out: str, name: str, split: str, payloads: List[bytes]) -> None:
    count = max(1, -(-len(payloads) // RECORDS_PER_SHARD))
    for index in range(count):
        with open(os.path.join(out, shard_filename(name, split, index, count)), "wb") as f:
            write_records(f, payloads[index::count])


def trained_to_end(workdir: str) -> bool:
    """Has the run in ``workdir`` saved a checkpoint at its config's ``total_steps``?"""
    from trainer import checkpoint

    if not os.path.isfile(os.path.join(workdir, checkpoint.CONFIG_FILE)):
        return False
    total = checkpoint.load_config(workdir).get("total_steps")
    step = checkpoint.latest_step(workdir)
    return step is not None and total is not None and step >= int(total)


def train_folds(config: str, corpus: str, workdir: str, folds: int, overrides: Sequence[str],
                log=print) -> dict:
    """Writes each fold's data, trains each model (skipping finished ones), then ``crossfit.json``."""
    from common.corpus_dir import require_completed

    corpus = require_completed(corpus)
    if not _shards(corpus, "train"):
        raise CrossFitError(f"{corpus}: no train shards")
    overrides = list(overrides)
    if not any(o.startswith("--config.vocab_path") for o in overrides):
        vocab = os.path.join(corpus, "vocab.txt")
        if not os.path.isfile(vocab):
            raise CrossFitError(f"{corpus} has no vocab.txt: run python -m trainer.vocab --data_dir {corpus} "
                                "first, or pass --config.vocab_path=FILE")
        overrides.append(f"--config.vocab_path={vocab}")
    trained_on = {}
    for fold in range(folds):
        records = write_fold_data(corpus, data_dir(workdir, fold), fold, folds)
        run = fold_dir(workdir, fold)
        trained_on[f"fold_{fold}"] = records
        if trained_to_end(run):
            log(f"crossfit: model {fold} already trained ({run})")
            continue
        log(f"crossfit: model {fold} of {folds} on {records:,} pairs (all but fold {fold}) -> {run}")
        command = [sys.executable, "-m", "trainer.train", f"--config={config}", f"--workdir={run}",
                   f"--config.data_dir={data_dir(workdir, fold)}", *overrides]
        status = subprocess.run(command).returncode
        if status != 0 or not trained_to_end(run):
            raise CrossFitError(f"model {fold} did not finish (exit status {status}); see {run}/train.log, "
                                "then run the same command again to resume")
    manifest = {"folds": folds, "corpus": corpus, "models": [f"fold_{k}" for k in range(folds)],
                "trained_on": trained_on, "config": config, "overrides": overrides}
    with open(os.path.join(workdir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    return manifest


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli.ArgumentParser(prog="python -m trainer.crossfit", description=__doc__.split("\n\n")[0],
                                epilog="Any --config.NAME=VALUE is passed to every model's trainer.train.")
    parser.add_argument("--config", required=True, help="trainer config file, as trainer.train's --config")
    parser.add_argument("--data_dir", required=True, help="the corpus (a build's output)")
    parser.add_argument("--workdir", required=True, help="where the folds' data, models and crossfit.json go")
    parser.add_argument("--folds", type=int, default=2, help="K: models, each trained without one fold (>= 2)")
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if not a.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.folds < 2:
        parser.error("--folds must be >= 2")
    if not os.path.isfile(args.config):
        parser.error(f"--config {args.config}: no such file")
    from common.corpus_dir import DamagedFile, IncompleteCorpus

    try:
        manifest = train_folds(args.config, args.data_dir, args.workdir, args.folds, rest)
    except (CrossFitError, IncompleteCorpus, DamagedFile, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"crossfit: {manifest['folds']} models -> {os.path.join(args.workdir, MANIFEST)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
