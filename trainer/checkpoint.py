"""Checkpoints of a training run (orbax), and loading a trained encoder back.

A checkpoint at step s holds three items in ``workdir/checkpoints/<s>/``:

* ``model``: ``{"params", "batch_stats"}``, everything needed for inference;
* ``train``: ``{"opt_state", "step", "rng"}``, what resuming also needs
  (``rng`` is the raw key data of the run's base key; each step folds in its
  step number, so restoring the key restores every later random draw);
* ``meta``: JSON ``{"step", "batches_consumed"}``: the data position, i.e.
  how many global batches the input pipeline has produced, to restart it with
  ``make_dataset(..., start_batch=batches_consumed)``.

Saving is asynchronous: ``save`` returns once the arrays are copied to host
memory, and the files are written in the background (the train step may then
reuse the device buffers). The run's config is in ``workdir/config.json``,
written by the trainer, so ``load_image_encoder(workdir)`` needs nothing else.

A checkpoint that does not restore (an array file truncated or missing, its
metadata overwritten) is ``DamagedCheckpoint``, one line naming the workdir
and the step. Resuming (``Checkpointer.restore_newest``) then restores the
newest checkpoint that restores cleanly, moves each damaged newer one aside
(``damaged_checkpoints/<step>``, so the run can save that step again) and
says which it skipped and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from typing import Any, Callable, List, Optional

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from common.state_files import DamagedFile
from trainer.configs import compute_dtype, cpu_fast_compile_options, vocab_path

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"
CHECKPOINT_DIR = "checkpoints"
#: Where resuming moves a checkpoint that does not restore (``workdir/damaged_checkpoints/<step>``).
DAMAGED_DIR = "damaged_checkpoints"


class DamagedCheckpoint(DamagedFile):
    """A checkpoint that does not restore: the message names the workdir and the step, in one line."""

    def __init__(self, workdir: str, step: int, error: BaseException):
        self.workdir, self.step = workdir, int(step)
        super().__init__(f"{workdir}: the checkpoint of step {step} is damaged ({_first_sentence(error)}): "
                         f"restore it, or delete {os.path.join(workdir, CHECKPOINT_DIR, str(step))} to use the one "
                         "before it")


def _first_sentence(error: BaseException) -> str:
    """TensorStore and orbax explain over many lines (whole specs); the start names what went wrong."""
    text = " ".join(str(error).split()) or type(error).__name__
    text = re.split(r"\. See full TensorStore details|\s\[tensorstore_spec", text)[0]
    if isinstance(error, ValueError) and type(error) is not ValueError and not text.startswith(type(error).__name__):
        text = f"{type(error).__name__}: {text}"  # e.g. JSONDecodeError: Expecting value
    return text.split(". ")[0].rstrip(":.")[:200]


class _AwaitingLoop(asyncio.SelectorEventLoop):
    """An event loop that, when closed, first lets the tasks still running on it finish.

    orbax runs a restore in a fresh loop and closes it as soon as the first
    array read fails, with the other reads still pending: TensorStore then
    completes them into a closed loop, and each one's coroutine, collected
    later, prints a traceback ("Event loop is closed"), some thousand lines
    for one damaged checkpoint. Waiting for them here (their errors taken,
    not raised) leaves nothing behind.
    """

    def close(self):
        if not self.is_closed() and not self.is_running():
            pending = [task for task in asyncio.all_tasks(self) if not task.done()]
            if pending:
                self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        super().close()


class _AwaitingLoopPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self):
        return _AwaitingLoop()


@contextlib.contextmanager
def _reads_awaited():
    """Within it, every event loop asyncio makes (orbax's, per restore) awaits its pending reads on close."""
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_AwaitingLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(previous)


def _is_mismatch(error: BaseException) -> bool:
    """orbax's refusal of a checkpoint whose trees do not fit the model asked for (not damage)."""
    text = str(error)
    return isinstance(error, ValueError) and ("do not match" in text or "not compatible with the stored shape" in text)


class Checkpointer:
    """A thin wrapper over ``ocp.CheckpointManager`` with the items above."""

    def __init__(self, workdir: str, *, every: int, keep: int, async_save: bool = True):
        self.workdir = workdir
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=every, max_to_keep=keep,
            enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(
            os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR)), options=options,
            item_names=("model", "train", "meta"))

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def save(self, step: int, state: dict, meta: dict, *, force: bool = False) -> bool:
        model, train = split_state(state)
        return self.manager.save(step, args=ocp.args.Composite(
            model=ocp.args.StandardSave(model),
            train=ocp.args.StandardSave(train),
            meta=ocp.args.JsonSave(meta)), force=force)

    def restore(self, step: int, like_state: dict) -> tuple[dict, dict]:
        """Restores onto the shapes, dtypes and shardings of ``like_state``; ``DamagedCheckpoint`` if it cannot."""
        like_model, like_train = jax.tree.map(_abstract, split_state(like_state))
        try:
            with _reads_awaited():
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    model=ocp.args.StandardRestore(like_model),
                    train=ocp.args.StandardRestore(like_train),
                    meta=ocp.args.JsonRestore()))
            meta = dict(restored.meta)
            if not isinstance(meta.get("batches_consumed"), int):
                raise ValueError(f"meta: batches_consumed is {meta.get('batches_consumed')!r}, not a count")
        except Exception as error:  # TensorStore's errors are plain Exceptions
            if _is_mismatch(error):
                raise
            raise DamagedCheckpoint(self.workdir, step, error) from error
        return {**restored.model, **restored.train}, meta

    def restore_newest(self, like_state: dict, say: Callable[[str], None]) -> Optional[tuple[int, dict, dict]]:
        """``(step, state, meta)`` of the newest checkpoint that restores (None without any checkpoint).

        Each newer one that does not is said in one line and moved to
        ``damaged_checkpoints/`` (by process 0), so that the run saves its
        step afresh; if none restores, the newest one's ``DamagedCheckpoint``.
        """
        skipped: List[DamagedCheckpoint] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                state, meta = self.restore(step, like_state)
            except DamagedCheckpoint as damaged:
                skipped.append(damaged)
                continue
            for damaged in skipped:
                say(f"skipped the checkpoint of step {damaged.step}: {_first_sentence(damaged.__cause__)}; "
                    f"moved to {self._set_aside(damaged.step)}")
            if skipped:
                if jax.process_count() > 1:  # every host lists the steps again only after process 0 moved them
                    from jax.experimental import multihost_utils

                    multihost_utils.sync_global_devices("damaged checkpoints set aside")
                self.manager.reload()
            return step, state, meta
        if skipped:
            raise skipped[0]
        return None

    def _set_aside(self, step: int) -> str:
        target = os.path.join(self.workdir, DAMAGED_DIR, str(step))
        if jax.process_index() == 0:
            if os.path.exists(target):
                shutil.rmtree(target)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(os.path.join(self.manager.directory, str(step)), target)
        return target

    def wait(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.close()


def split_state(state: dict) -> tuple[dict, dict]:
    model = {"params": state["params"], "batch_stats": state["batch_stats"]}
    train = {k: v for k, v in state.items() if k not in model}
    return model, train


def _abstract(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))


def save_config(config: ml_collections.ConfigDict, workdir: str) -> None:
    with open(os.path.join(workdir, CONFIG_FILE), "w") as f:
        f.write(config.to_json(indent=2, sort_keys=True))


def load_config(workdir: str) -> ml_collections.ConfigDict:
    """The run's config; a damaged ``config.json`` is ``DamagedFile``, one line naming it."""
    from common.state_files import obj, parse

    path = os.path.join(workdir, CONFIG_FILE)
    with open(path, "rb") as f:
        return ml_collections.ConfigDict(parse(f.read(), path, obj, "restore it from the run's command"))


def vocab_file(workdir: str, config) -> str:
    """The run's copy of its vocabulary, else the one its config names."""
    copy = os.path.join(workdir, VOCAB_FILE)
    return copy if os.path.exists(copy) else vocab_path(config)


def load_model(workdir: str, step: Optional[int] = None) -> tuple[Any, dict, ml_collections.ConfigDict]:
    """(model, variables {"params", "batch_stats"}, config) of a run's checkpoint.

    ``step`` defaults to the latest checkpoint. Arrays are restored on the
    first local device. A checkpoint that does not restore is
    ``DamagedCheckpoint`` (one line: workdir and step); one that does not fit
    the model its config describes, orbax's ``ValueError``.
    """
    # Imported here so that this module (and orbax) stay cheap to import.
    from trainer import models, tokenizer as tokenizer_lib

    config = load_config(workdir)
    vocab_size = tokenizer_lib.Tokenizer(vocab_file(workdir, config), config.max_text_len).vocab_size
    model = models.build(config.model, vocab_size=vocab_size, dtype=compute_dtype(config))
    manager = ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR)),
        options=ocp.CheckpointManagerOptions(read_only=True), item_names=("model",))
    try:  # closed also when the checkpoint is missing or does not fit: an open manager fails noisily at exit
        available = manager.all_steps()
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {workdir}/{CHECKPOINT_DIR}")
        if step not in available:
            raise FileNotFoundError(f"no checkpoint of step {step} in {workdir}/{CHECKPOINT_DIR} "
                                    f"(steps: {', '.join(map(str, sorted(available))) or 'none'})")
        shapes = jax.eval_shape(
            lambda: model.init(jax.random.key(0), np.zeros((1, config.image_size, config.image_size, 3),
                                                           np.float32),
                               np.ones((1, config.max_text_len), np.int32)))
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        like = {"params": shapes["params"], "batch_stats": shapes.get("batch_stats", {})}
        like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), like)
        try:
            with _reads_awaited():
                variables = manager.restore(step, args=ocp.args.Composite(
                    model=ocp.args.StandardRestore(like))).model
        except Exception as error:  # TensorStore's errors are plain Exceptions
            if _is_mismatch(error):
                raise
            raise DamagedCheckpoint(workdir, step, error) from error
    finally:
        manager.close()
    return model, variables, config


def towers_from(source_workdir: str, variables: dict, sharding) -> dict:
    """``variables`` with the params and BatchNorm statistics of ``source_workdir``'s latest checkpoint.

    TOnICS aligns pre-trained towers (``config.init_from``): a run starts from
    another run's towers (and temperature); optimizer, step and data start fresh.
    """
    loaded = dict(load_model(source_workdir)[1])
    shapes = lambda tree: {jax.tree_util.keystr(path): np.shape(x)  # noqa: E731
                           for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    mine, theirs = shapes(variables), shapes(loaded)
    mismatched = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if mismatched:
        raise ValueError(f"config.init_from {source_workdir}: the model differs ({len(mismatched)} parameters, "
                         f"e.g. {mismatched[0]}): same model config and vocabulary needed")
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), sharding), dict(loaded))


def latest_step(workdir: str) -> Optional[int]:
    """The run's latest checkpoint step (None without one)."""
    manager = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR)),
                                    options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        return manager.latest_step()
    finally:
        manager.close()


class Encoders:
    """Both towers of one checkpoint: what evaluation, embedding export and search use.

    ``encode_images``: float32 ``[B, S, S, 3]`` in [-1, 1] (the trainer's eval
    preprocessing) -> ``[B, D]``; ``encode_texts``: int32 ``[B, L]`` token ids
    -> ``[B, D]``; both L2-normalised float32 numpy. Also ``tokenizer``,
    ``config`` (the run's), ``step``, ``workdir``, ``image_size``,
    ``resize_size``. Arrays live on the first local device (one CPU,
    GPU or TPU chip); each batch shape compiles once, so callers pad their
    last batch (``trainer.evaluators.encode_in_batches`` does).
    """

    def __init__(self, workdir: str, step: Optional[int] = None):
        from trainer import tokenizer as tokenizer_lib

        step = latest_step(workdir) if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {workdir}/{CHECKPOINT_DIR}")
        model, self.variables, self.config = load_model(workdir, step)
        self.workdir, self.step = workdir, int(step)
        self.image_size = int(self.config.image_size)
        self.resize_size = self.config.get("resize_size")
        self.tokenizer = tokenizer_lib.Tokenizer(vocab_file(workdir, self.config), self.config.max_text_len)
        # Compiled as the run compiled its evaluators (``xla_cpu_fast_compile``
        # changes the float rounding), so a re-evaluation gives the run's numbers.
        options = cpu_fast_compile_options() if self.config.get("xla_cpu_fast_compile") else {}
        self._images = jax.jit(lambda v, x: model.apply(v, images=x, train=False)[0],
                               compiler_options=options)
        self._texts = jax.jit(lambda v, t: model.apply(v, texts=t, train=False)[1],
                              compiler_options=options)

    def encode_images(self, images: np.ndarray) -> np.ndarray:
        return np.asarray(self._images(self.variables, np.asarray(images, np.float32)), np.float32)

    def encode_texts(self, tokens: np.ndarray) -> np.ndarray:
        return np.asarray(self._texts(self.variables, np.asarray(tokens, np.int32)), np.float32)


def load_image_encoder(workdir: str, step: Optional[int] = None
                       ) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    """The image tower of a trained run, for embedding images (e.g. near-dup removal).

    Returns ``(encode, image_size)``: ``encode(images)`` takes float32
    ``[B, S, S, 3]`` in [-1, 1] (the trainer's eval preprocessing: resize,
    central crop to ``image_size``) and returns float32 ``[B, D]`` L2-normalised
    numpy embeddings.
    """
    model, variables, config = load_model(workdir, step)
    apply = jax.jit(lambda v, x: model.apply(v, images=x, train=False)[0])

    def encode(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, np.float32)
        if images.ndim != 4 or images.shape[1:] != (config.image_size, config.image_size, 3):
            raise ValueError(f"expected [B, {config.image_size}, {config.image_size}, 3] images, "
                             f"got {images.shape}")
        return np.asarray(apply(variables, images), np.float32)

    return encode, int(config.image_size)


def load_text_encoder(workdir: str, step: Optional[int] = None
                      ) -> tuple[Callable[[np.ndarray], np.ndarray], Any]:
    """``(encode, tokenizer)``: ``encode(int32 [B, L] token ids) -> [B, D]`` L2-normalised."""
    from trainer import tokenizer as tokenizer_lib

    model, variables, config = load_model(workdir, step)
    apply = jax.jit(lambda v, t: model.apply(v, texts=t, train=False)[1])

    def encode(tokens: np.ndarray) -> np.ndarray:
        return np.asarray(apply(variables, np.asarray(tokens, np.int32)), np.float32)

    return encode, tokenizer_lib.Tokenizer(vocab_file(workdir, config), config.max_text_len)
