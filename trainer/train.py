r"""Trains the ALIGN dual encoder on the project's shards.

One file, read top to bottom (big_vision style): the set-up (config and mesh;
data; model and optimizer init; checkpoint resume); loss and train step; the
loop (``train_and_evaluate``); then the command line. Which batch a step gets
is the run's batch policy (``trainer.batch_policy``: random batches, or the
TOnICS curriculum); the evaluators run on the current state's encoders
(``trainer.evaluators.during_training``). Run it as

    python -m trainer.train --config trainer/configs/tiny.py --workdir out/train \
        --config.data_dir=out/corpus [--config.total_steps=100] [--config.eval_dir=...]

or call ``train_and_evaluate(config, workdir)`` from Python.

What a run leaves in ``workdir``: ``config.json`` and ``vocab.txt`` (so the
workdir alone describes the model, see ``trainer.checkpoint.load_*``),
``checkpoints/<step>/`` (orbax), ``metrics.jsonl`` (one JSON object per log
or eval point), ``tensorboard/`` event files, ``retrieval.html`` (the
``gallery`` evaluator's page) and, from the command line, ``train.log``.

Run again with the same workdir and it resumes from the latest checkpoint:
params, optimizer state, step, RNG and the data position. SIGTERM
(preemption) on any host stops every host at the same step (a sync point
after each step; at most ``MAX_STEPS_IN_FLIGHT`` steps are dispatched ahead
of the device, so the stop comes within about two steps' time), saves that
step's checkpoint and returns with ``preempted=True``; the command line then
exits with status 75 (``EXIT_PREEMPTED``: "preempted, resume me"), 0 when the
run is complete. The command line handles SIGTERM from its start: one that
comes during start-up (distributed initialisation, restore, compilation)
stops the run after its first step.

Several hosts: run the command line in every process with
``--coordinator_address=HOST0:PORT --num_processes=N --process_id=I`` (or call
``jax.distributed.initialize(...)``, then ``train_and_evaluate``, in every
process; ``tests/trainer/test_multihost.py`` runs 2 CPU processes through
preemption, resume and every evaluator). Each reads its share of the data;
evaluators see every host's embeddings (the encoders return replicated
arrays); only process 0 writes metrics, config and the retrieval page; orbax
writes the checkpoint together.

What stops a run, with one line: a config value out of range (before anything
is built); a damaged shard, named (``skip_corrupt_records`` skips its damaged
records instead, counted as ``data/records_skipped``, each damage said once);
a non-finite loss or gradient (never applied: the last checkpoint stays good).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags, logging
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from ml_collections import config_flags

from common import console
from common.corpus_dir import DamagedFile, IncompleteCorpus, require_completed
from trainer import accumulate, checkpoint, loss, models, optim
from trainer.configs import check as check_config, check_layout
from trainer.configs import (
    ConfigError, compute_dtype, cpu_fast_compile_options, frozen_towers, parse_flags, vocab_path,
)
from trainer.metric_log import MetricWriter, Progress, compiled_memory
from trainer.preemption import EXIT_PREEMPTED, StopOnSigterm
from trainer.shard_reader import damage_in

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a trainer/configs/*.py file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0's coordinator: run as one process of a "
    "multi-process job (jax.distributed.initialize), with --num_processes and --process_id.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes of a multi-process job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")


#: Steps dispatched but not finished at any time: enough to overlap the input
#: pipeline with the device, few enough that SIGTERM stops within ~2 steps.
MAX_STEPS_IN_FLIGHT = 2

#: Set by ``main``: the console stream, where progress and results also go
#: (library logging goes to ``<workdir>/train.log`` only). Library callers
#: get absl logging only.
_CONSOLE = None


def _say(message: str) -> None:
    """A progress or result line: logged, and printed on the console of a command-line run."""
    logging.info("%s", message)
    if _CONSOLE is not None and jax.process_index() == 0:
        print(message, file=_CONSOLE, flush=True)


@dataclasses.dataclass
class _Run:
    """What the set-up makes for the loop."""

    state: dict                  # params, batch_stats, opt_state, step, rng: replicated on the mesh
    train_step: Callable         # (state, batch) -> (state, metrics), jitted
    policy: object               # the batches (trainer.batch_policy)
    evaluation: object           # the evaluators over the state's encoders (trainer.evaluators.during_training)
    ckpt: checkpoint.Checkpointer
    skipped_records: Callable[[], dict]


def _set_up(config: ml_collections.ConfigDict, workdir: str) -> _Run:
    """Config and mesh, data, model and optimizer init, resume, the train step and the evaluators."""
    # Imported here: the command line says its first line, and handles
    # SIGTERM, before TensorFlow takes seconds to load.
    import tensorflow as tf

    from trainer import batch_policy, input_pipeline, tokenizer as tokenizer_lib
    from trainer.evaluators import during_training

    # tf.data must not grab the accelerators JAX uses.
    tf.config.set_visible_devices([], "GPU")

    # ------------------------------------------------------------------
    # Config and mesh.
    # ------------------------------------------------------------------
    require_completed(config.data_dir, config.allow_incomplete, "--config.allow_incomplete=true")
    if config.compilation_cache_dir:
        # Cache every compiled program (XLA:CPU compiles of this model take
        # minutes on a busy machine). reset_cache: the cache may already have
        # been checked (and found off) by an earlier compile in this process.
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.set_cache_dir(config.compilation_cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        compilation_cache.reset_cache()
    tf.io.gfile.makedirs(workdir)
    # One 'data' axis over every device. Auto axes: we declare the shardings of
    # the step's inputs and outputs, and the compiler places the collectives
    # (the loss's all-gathers, BatchNorm's all-reduces, the gradient psum).
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    replicated = NamedSharding(mesh, P())
    check_layout(config, jax.device_count())
    per_device, micro_steps = config.batch_size // jax.device_count(), config.accumulation_steps
    _say(f"{jax.process_count()} process(es), mesh {dict(mesh.shape)} ({jax.default_backend()}); "
         f"global batch {config.batch_size} ({per_device} per device"
         f"{f', {micro_steps} micro-batches of {per_device // micro_steps}' if micro_steps > 1 else ''})")

    # ------------------------------------------------------------------
    # Data: this host's share of every global batch, laid out on the mesh.
    # ------------------------------------------------------------------
    tokenizer = tokenizer_lib.Tokenizer(vocab_path(config), max_len=config.max_text_len)
    if jax.process_index() == 0:
        checkpoint.save_config(config, workdir)
        tf.io.gfile.copy(vocab_path(config), os.path.join(workdir, checkpoint.VOCAB_FILE), overwrite=True)
    reader = input_pipeline.shard_reader(
        config.data_dir, config.train_split, skip_corrupt=config.skip_corrupt_records,
        remedy="set --config.skip_corrupt_records=true to train without its damaged records")

    def skipped_records() -> dict:
        """With ``skip_corrupt_records``: records skipped so far by every host; each damage said once."""
        if not reader.skip_corrupt:
            return {}
        for problem in reader.new_problems():
            _say(f"damaged shard: {problem}")
        skipped = np.int64(reader.records_skipped())
        if jax.process_count() > 1:
            skipped = np.sum(multihost_utils.process_allgather(skipped))
        return {"data/records_skipped": int(skipped)}

    # ------------------------------------------------------------------
    # Model and optimizer init (params replicated on every device).
    # ------------------------------------------------------------------
    model = models.build(config.model, vocab_size=tokenizer.vocab_size, dtype=compute_dtype(config))
    init_rng, base_rng = jax.random.split(jax.random.key(config.seed, impl=config.prng_impl or None))

    def init(rng):
        images = jnp.zeros((2, config.image_size, config.image_size, 3), jnp.float32)
        texts = jnp.ones((2, config.max_text_len), jnp.int32)
        variables = model.init({"params": rng, "dropout": rng}, images, texts, train=False)
        return {"params": variables["params"], "batch_stats": variables.get("batch_stats", {})}

    # Init runs once: compiled with LLVM's cheap passes on CPU, its runtime is moot.
    fast_compile = cpu_fast_compile_options()
    variables = jax.jit(init, out_shardings=replicated).lower(init_rng).compile(
        compiler_options=fast_compile)(init_rng)
    if config.init_from:
        variables = checkpoint.towers_from(config.init_from, variables, replicated)
        _say(f"towers initialised from {config.init_from}")
    tx, schedule = optim.make(config, variables["params"])
    state = {
        **variables,
        "opt_state": jax.jit(tx.init, out_shardings=replicated).lower(variables["params"]).compile(
            compiler_options=fast_compile)(variables["params"]),
        "step": jax.device_put(jnp.zeros((), jnp.int32), replicated),
        "rng": jax.device_put(jax.random.key_data(base_rng), replicated),
    }
    counts = {name: sum(x.size for x in jax.tree.leaves(tree)) for name, tree in variables["params"].items()}
    _say(f"parameters: {sum(counts.values()):,} ({', '.join(f'{k} {v:,}' for k, v in counts.items())})")

    # Resume: everything in ``state`` plus the batch policy's position (and curriculum).
    ckpt = checkpoint.Checkpointer(workdir, every=config.checkpoint_every, keep=config.keep_checkpoints)
    policy = batch_policy.make(config, tokenizer, mesh, reader, _say)
    # The newest checkpoint that restores: a damaged newer one is said, set aside, and its steps trained again.
    if (resumed := ckpt.restore_newest(state, _say)) is not None:
        latest, state, meta = resumed
        policy.restore(meta)
        _say(f"resumed from step {latest} ({meta['batches_consumed']} batches consumed)")

    step_compile = fast_compile if config.xla_cpu_fast_compile else {}
    return _Run(state=state, train_step=_train_step(config, model, tx, schedule, mesh, state, step_compile),
                policy=policy, evaluation=during_training.Evaluation(
                    config, workdir, model, mesh, tokenizer, step_compile, say=_say),
                ckpt=ckpt, skipped_records=skipped_records)


# ------------------------------------------------------------------
# Loss and train step.
# ------------------------------------------------------------------
def _train_step(config, model, tx, schedule, mesh, state: dict, compiler_options: dict) -> Callable:
    """The jitted step: (state, batch) -> (state, metrics); state replicated, batch split on 'data'."""
    contrastive_loss = loss.get(config.loss.impl)
    if config.loss.impl == "shard_map":
        contrastive_loss = functools.partial(contrastive_loss, mesh=mesh)
    # The global batch's loss and gradients: one pass, or accumulation_steps micro-batches
    # of activations at a time from cached embeddings (the same gradients; trainer.accumulate).
    loss_and_grads = accumulate.loss_and_grads(
        model, contrastive_loss, steps=config.accumulation_steps, shards=mesh.shape["data"],
        label_smoothing=config.loss.label_smoothing, directions=config.loss.directions)
    frozen = frozen_towers(config)
    prng_impl = config.prng_impl or None

    def train_step(state, batch):
        # Each step draws from (base key, step): a resumed run draws the same.
        rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"], impl=prng_impl),
                                 state["step"])
        (value, (batch_stats, metrics, temperature)), grads = loss_and_grads(
            state["params"], state["batch_stats"], batch, rng)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        # A frozen tower (config.freeze) never moves: zero updates, old BatchNorm statistics.
        updates = {k: jax.tree.map(jnp.zeros_like, v) if k in frozen else v for k, v in updates.items()}
        if "image_tower" in frozen:
            batch_stats = state["batch_stats"]
        params = optax.apply_updates(state["params"], updates)

        # NaN guard: a step with a non-finite loss or gradient changes nothing
        # (so no checkpoint can ever hold NaN params); the host stops the run.
        grad_norm = optax.global_norm(grads)
        finite = jnp.isfinite(value) & jnp.isfinite(grad_norm)
        keep_if_bad = lambda new, old: jax.tree.map(  # noqa: E731
            lambda n, o: jnp.where(finite, n, o), new, old)
        new_state = {
            "params": keep_if_bad(params, state["params"]),
            "batch_stats": keep_if_bad(batch_stats, state["batch_stats"]),
            "opt_state": keep_if_bad(opt_state, state["opt_state"]),
            "step": state["step"] + 1,
            "rng": state["rng"],
        }
        metrics = {**metrics, "loss": value, "temperature": temperature,
                   "learning_rate": schedule(state["step"]), "grad_norm": grad_norm,
                   "param_norm": optax.global_norm(params), "finite": finite}
        return new_state, metrics

    replicated = NamedSharding(mesh, P())
    state_sharding = jax.tree.map(lambda _: replicated, state)
    return jax.jit(train_step, in_shardings=(state_sharding, NamedSharding(mesh, P("data"))),
                   out_shardings=(state_sharding, replicated), donate_argnums=0,
                   compiler_options=compiler_options)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       after_step: Optional[Callable[[int], None]] = None,
                       sigterm: Optional[StopOnSigterm] = None) -> dict:
    """Trains (or resumes) ``config`` in ``workdir``; returns the final metrics.

    The result holds ``step``, the last train metrics (``train/...``), the
    last result of every evaluator (``<eval name>/...``) and ``preempted``.
    ``after_step(step)``, if given, is called on the host after every step's
    dispatch, before the loop's checks (a preemption test sends SIGTERM there).
    ``sigterm``: a ``StopOnSigterm`` the caller has already entered (the
    command line does so first thing, so that a SIGTERM during start-up and
    compilation stops the run after its first step instead of killing it);
    without one, SIGTERM is handled from the loop on.
    """
    check_config(config)
    run = _set_up(config, workdir)
    state, train_step, policy, evaluation, ckpt = run.state, run.train_step, run.policy, run.evaluation, run.ckpt

    # ------------------------------------------------------------------
    # The loop.
    # ------------------------------------------------------------------
    writer = MetricWriter(workdir, enabled=jax.process_index() == 0)
    start_step = int(state["step"])
    pending = []          # (step, device metrics) since the last host check
    final = {"step": start_step, "preempted": False}
    timer = Progress(config.total_steps, config.batch_size)
    loop_start = time.time()
    try:
        with contextlib.nullcontext(sigterm) if sigterm is not None else StopOnSigterm() as stop:
            for step in range(start_step + 1, config.total_steps + 1):
                batch = policy.batch(step)
                if step == start_step + 1:   # compiled ahead of the call, to say what a step holds
                    train_step = train_step.lower(state, batch).compile()
                    if memory := compiled_memory(train_step):
                        writer.write(step, memory)
                        _say(f"train step: {memory['memory/peak_bytes'] / 2**20:,.0f} MiB per device (XLA)")
                state, metrics = train_step(state, batch)
                pending.append((step, metrics))
                if len(pending) > MAX_STEPS_IN_FLIGHT:
                    # JAX dispatches asynchronously: unbounded, the loop would run up to
                    # log_every steps ahead of the device, and a SIGTERM would be seen
                    # (and the checkpoint saved) only after all of them had been computed.
                    jax.block_until_ready(pending[-1 - MAX_STEPS_IN_FLIGHT][1])
                if step == start_step + 1:     # the first step compiles; time the others
                    jax.block_until_ready(state)
                    _say(f"first step (data, tracing, compilation) took {time.time() - loop_start:.0f}s")
                    timer.start(step)
                if after_step is not None:
                    after_step(step)
                # Every host stops at the same step: the step after any host saw SIGTERM.
                stop_now = stop.agreed()

                last = step == config.total_steps
                log = step % config.log_every == 0 or last or stop_now
                save = step % config.checkpoint_every == 0 or last or stop_now
                evaluate = last or evaluation.due(step)
                if log or save or evaluate:
                    # Waits for the device; raises on a non-finite step, before any save.
                    train_metrics = _check_and_average(pending, ckpt.latest_step())
                    pending = []
                    if log:
                        train_metrics.update(timer.measure(step))
                        final.update(skipped := run.skipped_records())
                        writer.write(step, {f"train/{k}": v for k, v in train_metrics.items()} | skipped
                                     | policy.log_metrics())
                        _say(timer.line(step, train_metrics))
                    final.update({f"train/{k}": v for k, v in train_metrics.items()}, step=step)
                # Before the save (a preempted step's too): this step's checkpoint holds the policy's
                # state after its update (TOnICS: P_S after a refresh), so a resumed run draws the same.
                if policy_metrics := policy.update(step, evaluation.encoders(state)):
                    writer.write(step, policy_metrics)
                if save:
                    ckpt.save(step, state, {"step": step, **policy.meta()}, force=True)
                if stop_now:
                    _say(f"SIGTERM: saved a checkpoint at step {step}, stopping (exit status "
                         f"{EXIT_PREEMPTED}: resume by running the same command again)")
                    final["preempted"] = True
                    break
                if evaluate:
                    results = evaluation.run(step, state, final=last)
                    writer.write(step, results)
                    final.update(results)
        if start_step >= config.total_steps:   # already done: just report
            final.update(evaluation.run(start_step, state, final=True))
    finally:
        ckpt.wait()   # an async save in flight completes even if the loop raised
        ckpt.close()
        writer.close()
        policy.close()
    return final


def _check_and_average(pending: list, last_checkpoint: Optional[int]) -> dict:
    """Averages the steps' metrics; raises on the first non-finite step."""
    fetched = jax.device_get([m for _, m in pending])
    for (step, _), metrics in zip(pending, fetched):
        if not metrics["finite"]:
            raise FloatingPointError(
                f"non-finite loss ({float(metrics['loss'])}) or gradient norm "
                f"({float(metrics['grad_norm'])}) at step {step}: stopping. The update was not "
                f"applied; the last checkpoint (step {last_checkpoint}) holds finite params. "
                "Lower optim.peak_lr, raise optim.warmup_steps or set optim.grad_clip_norm.")
    keys = [k for k in fetched[0] if k != "finite"]
    return {k: float(np.mean([m[k] for m in fetched])) for k in keys}


def main(argv):
    """Command line: progress and results on stdout, everything else in ``<workdir>/train.log``.

    Library chatter (orbax, absl, XLA/TF C++ messages, gloo's connection lines)
    goes to file descriptors 1 and 2, which point at the log during the run
    (``common.console``); an error is one line on the terminal's stderr. With
    the multi-process flags, process ``i > 0`` logs to ``train.process<i>.log``.
    """
    del argv
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    try:  # before anything is printed or created
        check_config(_CONFIG.value)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    # First thing: a SIGTERM during start-up (distributed initialisation, data,
    # compilation: minutes on a big job) stops the run at its first step, with
    # a checkpoint and exit status 75, instead of killing this host while the
    # others wait for it.
    with StopOnSigterm() as sigterm:
        _run_command_line(_WORKDIR.value, sigterm)


def _run_command_line(workdir: str, sigterm: StopOnSigterm) -> None:
    global _CONSOLE
    multi_process_flags = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    if any(flag is not None for flag in multi_process_flags) and not jax.distributed.is_initialized():
        # Before any other JAX call: the backend is created with the job's devices.
        # Flags left unset are detected where JAX can (Cloud TPU, SLURM, ...).
        # JAX's preemption service is off: its SIGTERM notifier would replace
        # this process's handler (installed above), and the run has its own
        # sync point (``StopOnSigterm.agreed``).
        jax.config.update("jax_enable_preemption_service", False)
        jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                                   num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
    process = jax.process_index() if jax.distributed.is_initialized() else 0
    # One log per process (process 0's is train.log): hosts sharing a workdir
    # must not interleave their lines in one file.
    log_name = "train.log" if process == 0 else f"train.process{process}.log"
    log_path = os.path.join(workdir if "://" not in workdir else ".", log_name)
    status = 0
    with console.library_output_to_log(log_path, stdout=True) as terminal:
        _CONSOLE = terminal
        print(f"training {workdir} (log: {log_path})", file=terminal, flush=True)
        try:
            final = train_and_evaluate(_CONFIG.value, workdir, sigterm=sigterm)
            summary = {k: v for k, v in final.items() if not k.startswith("train/") or k == "train/loss"}
            logging.info("final: %s", json.dumps(summary, sort_keys=True))
            skipped = (f", {final['data/records_skipped']:,} damaged record(s) skipped"
                       if final.get("data/records_skipped") else "")
            print(f"{'preempted' if final['preempted'] else 'done'} at step {final['step']}{skipped}; "
                  f"metrics: {os.path.join(workdir, 'metrics.jsonl')}", file=terminal, flush=True)
            status = EXIT_PREEMPTED if final["preempted"] else 0
        except Exception as error:  # one line on the console, the traceback in the log
            status = console.failure(damage_in(error) or error, "training", log_path,
                                     expected=(IncompleteCorpus, DamagedFile, ConfigError))
        finally:
            _CONSOLE = None
    if status:
        sys.exit(status)


if __name__ == "__main__":
    # Checked as flags are parsed: a missing one is a one-line error, not the usage text.
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main, flags_parser=parse_flags)
