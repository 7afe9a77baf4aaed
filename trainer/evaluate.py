r"""Evaluates a trained checkpoint: retrieval, zero-shot and kNN, on local files.

    python -m trainer.evaluate out/train                        # the run's own evaluators
    python -m trainer.evaluate out/train --step 300 \
        --eval flickr=karpathy:captions_file=dataset_flickr30k.json,image_dir=flickr30k-images \
        --eval shapes=zeroshot:image_dir=out/sample/eval/test \
        --eval held_out=retrieval:data_dir=out/corpus,split=validation

Without ``--eval`` it runs the evaluators of the run's ``config.json`` (the
ones the training run logged; ``gallery`` excepted, it would overwrite the
run's page), on the run's ``data_dir`` and ``eval_dir`` or the ones given
with ``--data_dir`` / ``--eval_dir``. Each ``--eval NAME=TYPE:key=value,...``
names a registered evaluator (``trainer.evaluators``: retrieval over a
shard split, ``karpathy`` retrieval over a Karpathy-split JSON and its image
folder, ``zeroshot`` and ``knn`` over labelled image folders, ``gallery``)
and its arguments; numbers are read as numbers, ``a;b`` as a list. The
model's image size, tokenizer and batch size fill in the rest.

Writes ``<workdir>/eval/step_<N>.json`` (or ``--output``): the workdir, the
step and each evaluation's type, arguments and metrics; prints a table.
Library logging goes to a log file (``common.console``); an error is one
line on stderr.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from typing import Optional, Sequence

from common import cli

SKIPPED_BY_DEFAULT = ("gallery",)


class UsageError(ValueError):
    """A malformed command line; one line for the person."""


def parse_eval_spec(text: str) -> tuple[str, str, dict]:
    """``"flickr=karpathy:captions_file=a.json,max_images=100"`` -> (name, type, kwargs)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise UsageError(f"--eval {text!r}: expected NAME=TYPE[:key=value,...]")
    kind, _, arguments = rest.partition(":")
    kwargs = {}
    for item in filter(None, arguments.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--eval {name}: {item!r} is not key=value")
        kwargs[key.strip()] = _value(value.strip())
    return name, kind.strip(), kwargs


def _value(text: str):
    if ";" in text:
        return [_value(part) for part in text.split(";") if part]
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, (int, float, bool)) else text


def evaluation_plan(config, specs: Sequence[str], data_dir: Optional[str], eval_dir: Optional[str]) -> dict:
    """``{name: {"type": ..., **kwargs}}``: the ``--eval`` specs, else the run's own evals."""
    from trainer import evaluators

    if specs:
        plan = {}
        for text in specs:
            name, kind, kwargs = parse_eval_spec(text)
            if name in plan:
                raise UsageError(f"--eval {name} given twice")
            plan[name] = {"type": kind, **kwargs}
    else:
        plan = {name: dict(entry) for name, entry in (config.get("evals") or {}).items()
                if entry.get("type", name) not in SKIPPED_BY_DEFAULT}
        for entry in plan.values():
            entry.pop("every", None)
    for name, entry in plan.items():
        kind = entry.get("type", name)
        try:
            cls = evaluators.get(kind)
        except KeyError:
            raise UsageError(f"--eval {name}: unknown evaluator type {kind!r} "
                             f"(known: {', '.join(evaluators.names())})") from None
        import inspect

        accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        unknown = [k for k in entry if k != "type" and k not in accepted]
        if unknown:
            raise UsageError(f"--eval {name}: {kind} takes no {', '.join(unknown)} "
                             f"(it takes {', '.join(accepted)})")
    return plan


def evaluate(workdir: str, *, step: Optional[int] = None, specs: Sequence[str] = (),
             data_dir: Optional[str] = None, eval_dir: Optional[str] = None,
             batch_size: Optional[int] = None, output: Optional[str] = None,
             say=lambda line: None, allow_incomplete: bool = False) -> dict:
    """Runs the evaluations; writes and returns ``{"workdir", "step", "evals": {name: {...}}}``.

    An evaluator that reads the corpus (``data_dir``) reads a committed one
    only (``common.corpus_dir.require_completed``) unless ``allow_incomplete``.
    """
    import tensorflow as tf

    from trainer import checkpoint, evaluators

    tf.config.set_visible_devices([], "GPU")  # tf.data must not take the accelerator JAX uses
    if not os.path.exists(os.path.join(workdir, checkpoint.CONFIG_FILE)):
        raise FileNotFoundError(f"{workdir}: not a training workdir (no {checkpoint.CONFIG_FILE})")
    config = checkpoint.load_config(workdir)
    data_dir = data_dir or config.get("data_dir")
    eval_dir = eval_dir or config.get("eval_dir") or None
    plan = evaluation_plan(config, specs, data_dir, eval_dir)
    from common.corpus_dir import require_completed

    for corpus in _corpora_read(plan, data_dir, eval_dir):
        require_completed(corpus, allow_incomplete, "--allow_incomplete")
    encoders = checkpoint.Encoders(workdir, step)
    say(f"evaluating {workdir} at step {encoders.step} ({', '.join(plan) or 'nothing to run'})")
    batch_size = batch_size or int(config.get("eval_batch_size", 64))
    context = {"data_dir": data_dir, "workdir": workdir, "image_size": encoders.image_size,
               "resize_size": encoders.resize_size, "tokenizer": encoders.tokenizer,
               "batch_size": batch_size}
    built = evaluators.build(plan, context=context, data_dir=data_dir, eval_dir=eval_dir)
    skipped = [name for name in plan if name not in {n for n, _, _ in built}]
    for name in skipped:
        say(f"{name}: skipped (it needs an eval_dir: give --eval_dir)")
    results = {"workdir": os.path.abspath(workdir), "step": encoders.step, "evals": {}}
    for name, _, evaluator in built:
        start = time.time()
        metrics = evaluator.run(encoders.encode_images, encoders.encode_texts)
        arguments = {k: v for k, v in plan[name].items() if k != "type"}
        results["evals"][name] = {"type": plan[name].get("type", name), "arguments": arguments,
                                  "metrics": {k: float(v) for k, v in metrics.items()},
                                  "seconds": round(time.time() - start, 1)}
        say(f"{name}: done in {time.time() - start:.0f}s")
    output = output or os.path.join(workdir, "eval", f"step_{encoders.step}.json")
    tf.io.gfile.makedirs(os.path.dirname(output) or ".")
    with tf.io.gfile.GFile(output, "w") as f:
        f.write(json.dumps(results, indent=2, sort_keys=True) + "\n")
    results["output"] = output
    return results


def _corpora_read(plan: dict, data_dir: Optional[str], eval_dir: Optional[str]) -> list:
    """The corpora the plan's evaluators read shards of (those whose constructor takes ``data_dir``): each
    entry's own ``data_dir`` (``--eval NAME=retrieval:data_dir=...``), else the run's, as
    ``trainer.evaluators.build`` fills it in."""
    import inspect

    from trainer import evaluators

    corpora = []
    for name, entry in plan.items():
        if "data_dir" not in inspect.signature(evaluators.get(entry.get("type", name)).__init__).parameters:
            continue
        corpus = entry.get("data_dir", data_dir)
        if isinstance(corpus, str):
            corpus = corpus.format(data_dir=data_dir, eval_dir=eval_dir)
        if corpus and corpus not in corpora:
            corpora.append(corpus)
    return corpora


def format_table(results: dict) -> str:
    """One row per metric with its chance level beside it, grouped by evaluation."""
    rows = [("evaluation", "metric", "value", "chance")]
    for name, entry in results["evals"].items():
        metrics = entry["metrics"]
        for key, value in metrics.items():
            if key.endswith("_chance"):
                continue
            chance = metrics.get(f"{key}_chance")
            shown = f"{value:.0f}" if key.startswith("num_") else f"{value:.4f}"
            rows.append((name, key, shown, "" if chance is None else f"{chance:.4f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in
                       enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli.ArgumentParser(
        prog="python -m trainer.evaluate", description="Evaluate a trained checkpoint (see the module docstring).")
    parser.add_argument("workdir", help="the training run's workdir (config.json, vocab.txt, checkpoints/)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--eval", dest="evals", action="append", default=[], metavar="NAME=TYPE:k=v,...",
                        help="an evaluation to run (repeatable); default: the run's own evaluators")
    parser.add_argument("--data_dir", default=None, help="shard directory for the run's own evaluators")
    parser.add_argument("--eval_dir", default=None, help="labelled folder {train,test}/<class>/ for them")
    parser.add_argument("--batch_size", type=int, default=None, help="default: the run's eval_batch_size")
    parser.add_argument("--output", default=None, help="result JSON (default <workdir>/eval/step_<N>.json)")
    parser.add_argument("--allow_incomplete", action="store_true",
                        help="read a corpus whose build did not commit (its newest version)")
    args = parser.parse_args(argv)

    from common import console
    from common.corpus_dir import IncompleteCorpus

    if argv is None:  # the command line, not a test: library chatter goes to a log file
        log = console.route_library_output("evaluate")
    else:
        log = "the log"
    try:
        results = evaluate(args.workdir, step=args.step, specs=args.evals, data_dir=args.data_dir,
                           eval_dir=args.eval_dir, batch_size=args.batch_size, output=args.output,
                           say=lambda line: print(line, flush=True), allow_incomplete=args.allow_incomplete)
    except (UsageError, IncompleteCorpus) as error:
        parser.exit(2, f"error: {error}\n")
    except Exception as error:  # one line for the person, the traceback in the log
        from common.corpus_dir import DamagedFile
        from trainer.eval_data import EvalDataError
        from trainer.checkpoint import DamagedCheckpoint  # loaded already, by the time a checkpoint was read

        if isinstance(error, DamagedCheckpoint):  # one line naming the workdir and the step
            parser.exit(2, f"error: {error}\n")
        from trainer.shard_reader import damage_in

        return console.failure(damage_in(error) or error, "evaluation", log,
                               expected=(EvalDataError, FileNotFoundError, DamagedFile))
    print(format_table(results))
    print(f"results: {results['output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
