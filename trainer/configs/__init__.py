"""Trainer configs: Python files with ``get_config(arg=None) -> ConfigDict``.

Every config is ``base_config()`` with its own numbers, so the tiny CPU demo
and the paper-scale runs differ only in numbers, never in structure. Any
field can be overridden on the command line (``--config.total_steps=100``,
``--config.model.image.norm=group``, ``--config.optim.peak_lr=3e-3``).

Fields:
  data_dir       shard directory (the pipeline's output); required. A build
                 that did not finish (no COMPLETED) is refused unless
                 ``allow_incomplete`` is True.
  vocab_path     wordpiece vocabulary; default ``<data_dir>/vocab.txt``.
  eval_dir       optional labelled image folder ``{train,test}/<class>/``
                 for the zero-shot and KNN evaluators (skipped when empty).
  batch_size     global batch (ALIGN: 16384); negatives span all of it.
  accumulation_steps  K micro-batches per step (default 1): the loss and its
                 gradients are the whole batch's, exactly, with one micro-batch
                 of activations alive at a time, for ~one extra forward pass
                 (``trainer.accumulate``). Must divide the batch per device.
  image_size     train/eval crop (ALIGN: 289 from a 346 resize).
  resize_size    resize before the crop; default image_size * 346 / 289.
  flip_lr        random horizontal flip in training (ALIGN: yes).
  colour_augment training-only colour ops after the crop, ``trainer.preprocess``
                 syntax (e.g. "random_hue(1.0)"); ALIGN: "" (none).
  max_text_len   tokens incl. [CLS]/[SEP] (ALIGN: 64).
  compute_dtype  "float32" or "bfloat16": the towers' activations and matmuls
                 (params, optimizer state, gradients, BatchNorm and LayerNorm
                 statistics, attention softmax, embeddings and loss stay f32).
  prng_impl      JAX PRNG ("threefry2x32" default; "rbg" compiles faster on CPU).
  model.*        ``trainer.models.two_tower.TwoTower`` fields: embed_dim,
                 image (EfficientNet: variant, norm, dropout, drop_path, width and
                 depth multipliers overriding the variant's, bn_momentum),
                 text (BERT: size, dropout, pool "cls" or "mean"), temperature_init,
                 learn_temperature.
  loss.*         impl ("plain": jit inserts the all-gathers; "shard_map"),
                 label_smoothing (ALIGN: 0.1), directions ("both": L_i2t + L_t2i,
                 ALIGN's; "image_retrieval": L_t2i only, TOnICS's L_IR).
  init_from      workdir of a trained run: start from its towers (same model
                 config and vocabulary); optimizer and data start fresh.
  freeze         "image", "text" or "image,text": those towers never update.
  tonics.*       TOnICS curriculum (``trainer.tonics``): enabled, refresh_every,
                 refresh_instances, refresh_threshold, alpha, beta, refresh_split.
                 Needs a corpus built with ``--concepts``.
  optim.*        name ("lamb", ALIGN's; or "adam"), peak_lr, warmup_steps, weight_decay, b1, b2, eps,
                 grad_clip_norm (optional).
  evals.<name>   evaluator kwargs plus ``type`` (registry name, default: the
                 entry's name) and ``every`` (steps; all run at the end).
                 String values may use ``{data_dir}`` and ``{eval_dir}``.
  compilation_cache_dir  optional persistent XLA compilation cache.
  xla_cpu_fast_compile   on CPU, compile with LLVM's cheap passes (for tests
                 and very short runs: faster compiles, slower steps).
  skip_corrupt_records   train past damaged shard records (a failed checksum,
                 a truncated shard), counted and reported, instead of stopping
                 at the first with an error naming the file. Evaluators over
                 the shards still stop: a score over fewer pairs than the
                 last run's would not compare with it.

``check(config)`` checks every value against its range (``RANGES``,
``CHOICES``) before the trainer builds anything; the error is one line
naming the field as the command line spells it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional

import ml_collections
from ml_collections import config_dict


def vocab_path(config) -> str:
    """The run's wordpiece vocabulary: ``vocab_path``, default ``<data_dir>/vocab.txt``."""
    from common.corpus_dir import read_dir

    return config.get("vocab_path") or os.path.join(read_dir(config.data_dir), "vocab.txt")


def compute_dtype(config):
    """The activations' dtype (``compute_dtype``) as a JAX dtype."""
    import jax.numpy as jnp  # here: a config file loads without JAX

    return jnp.dtype(config.compute_dtype)


def cpu_fast_compile_options() -> dict:
    """XLA options for a cheap compile on CPU (``xla_cpu_fast_compile``); {} elsewhere.

    LLVM's cheap passes, the loop emitters instead of the fusion emitters and
    one codegen unit: a fifth of the default compile time of EfficientNet's
    programs (tiny's init: ~25 CPU-s by default, ~5 so), at the cost of
    slower code: the trainer always compiles its one-off programs (init,
    optimizer init) so, and every program when the config asks.
    """
    import jax  # here: a config file loads without JAX

    if jax.default_backend() != "cpu":
        return {}
    return {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
            "xla_cpu_use_fusion_emitters": False, "xla_cpu_parallel_codegen_split_count": 1}


def base_config(*, image_variant: str, text_size: str, embed_dim: int, image_size: int,
                max_text_len: int, batch_size: int, total_steps: int, peak_lr: float,
                warmup_steps: int, eval_every: int, log_every: int, checkpoint_every: int,
                compute_dtype: str = "float32", image_dropout=None, drop_path: float = 0.2,
                text_dropout: float = 0.1, eval_batch_size: int = 256
                ) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.data_dir = ""
    c.allow_incomplete = False
    c.vocab_path = ""
    c.eval_dir = ""
    c.train_split = "train"
    c.image_size = image_size
    c.resize_size = config_dict.placeholder(int)
    c.flip_lr = True
    c.colour_augment = ""
    c.max_text_len = max_text_len
    c.batch_size = batch_size
    c.accumulation_steps = 1
    c.total_steps = total_steps
    c.compute_dtype = compute_dtype
    c.prng_impl = "threefry2x32"
    c.compilation_cache_dir = ""
    c.xla_cpu_fast_compile = False
    c.skip_corrupt_records = False

    c.model = ml_collections.ConfigDict()
    c.model.name = "two_tower"
    c.model.embed_dim = embed_dim
    c.model.image = ml_collections.ConfigDict(
        {"variant": image_variant, "norm": "batch", "drop_path": drop_path,
         "dropout": config_dict.placeholder(float), "width": config_dict.placeholder(float),
         "depth": config_dict.placeholder(float), "bn_momentum": 0.99})
    c.model.image.dropout = image_dropout   # None: the EfficientNet table's rate
    c.model.text = ml_collections.ConfigDict({"size": text_size, "dropout": text_dropout})
    c.model.text.max_len = c.get_ref("max_text_len")
    c.model.text.pool = "cls"               # ALIGN: the [CLS] token's final state
    c.model.temperature_init = 1.0          # ALIGN: learned, initialised at 1.0
    c.model.learn_temperature = True

    c.loss = ml_collections.ConfigDict({"impl": "plain", "label_smoothing": 0.1, "directions": "both"})
    # Start from another run's towers, optionally freezing one (TOnICS aligns pre-trained towers).
    c.init_from = ""
    c.freeze = ""
    # TOnICS curriculum batches (trainer.tonics); the paper's refresh parameters.
    c.tonics = ml_collections.ConfigDict({
        "enabled": False, "refresh_every": 5000, "refresh_instances": 100, "refresh_threshold": 0.9,
        "alpha": 0.9, "beta": 0.2, "refresh_split": "validation"})

    c.optim = ml_collections.ConfigDict()
    c.optim.name = "lamb"
    c.optim.peak_lr = peak_lr
    c.optim.warmup_steps = warmup_steps
    c.optim.weight_decay = 1e-5
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-6
    c.optim.grad_clip_norm = config_dict.placeholder(float)

    c.log_every = log_every
    c.checkpoint_every = checkpoint_every
    c.keep_checkpoints = 3
    c.eval_batch_size = eval_batch_size
    c.evals = ml_collections.ConfigDict()
    c.evals.retrieval = {"every": eval_every, "split": "validation"}
    c.evals.zeroshot = {"every": eval_every, "image_dir": "{eval_dir}/test"}
    c.evals.knn = {"every": eval_every, "train_dir": "{eval_dir}/train",
                   "test_dir": "{eval_dir}/test"}
    # The page of held-out queries and what the model retrieves: at the end only.
    c.evals.gallery = {"split": "validation"}
    return c


# ---------------------------------------------------------------------------
# Ranges: checked before anything is built
# ---------------------------------------------------------------------------


class ConfigError(ValueError):
    """A config value outside its range: ``--config.<field>=<value>: must be ...``."""


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric field may hold; ``optional``: None (unset) too."""

    integer: bool
    low: Optional[float] = None
    high: Optional[float] = None
    high_open: bool = False  # ``high`` itself excluded (rates, momenta, smoothing)
    low_open: bool = False
    optional: bool = False

    def admits(self, value) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.integer and not float(value).is_integer():
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or (value < self.high or (not self.high_open and value == self.high))

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            bounds = f" in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            bounds = f" {'>' if self.low_open else '>='} {self.low:g}"
        else:
            bounds = ""
        return kind + bounds + (" (or unset)" if self.optional else "")


COUNT, POSITIVE_COUNT = Range(True, 0), Range(True, 1)
FRACTION = Range(False, 0, 1, high_open=True)  # dropout, smoothing, momentum-like rates
PROBABILITY = Range(False, 0, 1)

#: Field path -> its range. A field a config does not have is not checked.
RANGES = {
    "seed": Range(True), "batch_size": POSITIVE_COUNT, "accumulation_steps": POSITIVE_COUNT,
    "total_steps": POSITIVE_COUNT,
    "image_size": POSITIVE_COUNT, "resize_size": Range(True, 1, optional=True),
    "max_text_len": Range(True, 2),  # [CLS] and [SEP]
    "log_every": POSITIVE_COUNT, "checkpoint_every": POSITIVE_COUNT, "keep_checkpoints": POSITIVE_COUNT,
    "eval_batch_size": POSITIVE_COUNT,
    "model.embed_dim": POSITIVE_COUNT, "model.temperature_init": Range(False, 0, low_open=True),
    "model.image.dropout": Range(False, 0, 1, high_open=True, optional=True), "model.image.drop_path": FRACTION,
    "model.image.width": Range(False, 0, low_open=True, optional=True),
    "model.image.depth": Range(False, 0, low_open=True, optional=True),
    "model.image.bn_momentum": PROBABILITY, "model.text.dropout": FRACTION,
    "loss.label_smoothing": FRACTION,
    "optim.peak_lr": Range(False, 0), "optim.warmup_steps": COUNT,  # 0: a run that never updates
    "optim.weight_decay": Range(False, 0), "optim.b1": FRACTION, "optim.b2": FRACTION,
    "optim.eps": Range(False, 0, low_open=True), "optim.grad_clip_norm": Range(False, 0, low_open=True, optional=True),
    "tonics.refresh_every": COUNT, "tonics.refresh_instances": POSITIVE_COUNT,
    "tonics.refresh_threshold": PROBABILITY, "tonics.alpha": PROBABILITY, "tonics.beta": PROBABILITY,
}
#: Field path -> the values it may take.
CHOICES = {
    "compute_dtype": ("float32", "bfloat16"), "optim.name": ("lamb", "adam"),
    "loss.impl": ("plain", "shard_map"), "loss.directions": ("both", "image_retrieval"),
    "model.text.pool": ("cls", "mean"),
}


def _field(config, path: str):
    """(found, value) of a dotted field path."""
    node = config
    for part in path.split("."):
        if not hasattr(node, "get") or part not in node:
            return False, None
        node = node.get(part)
    return True, node


def frozen_towers(config) -> set:
    """``config.freeze`` ("", "image", "text" or "image,text") as parameter collection names."""
    names = {part.strip() for part in config.freeze.split(",") if part.strip()}
    if names - {"image", "text"}:
        raise ConfigError(f"--config.freeze={config.freeze}: must be image, text or image,text")
    return {f"{name}_tower" for name in names}


def check(config) -> None:
    """Raises ``ConfigError`` (one line, the first field out of range) unless every value is in range."""
    def fail(path, value, expected):
        raise ConfigError(f"--config.{path}={value}: must be {expected}")

    if not config.data_dir:
        raise ConfigError("--config.data_dir is not set: the corpus to train on (e.g. --config.data_dir=out/corpus)")

    for path, allowed in RANGES.items():
        found, value = _field(config, path)
        if found and not allowed.admits(value):
            fail(path, value, allowed)
    for path, allowed in CHOICES.items():
        found, value = _field(config, path)
        if found and value not in allowed:
            fail(path, value, " or ".join(allowed))
    for name, entry in (config.evals or {}).items():
        found, every = _field(entry, "every")
        if found and not COUNT.admits(every):
            fail(f"evals.{name}.every", every, f"{COUNT} (steps; 0: at the end only)")
    steps = config.accumulation_steps
    if config.batch_size % steps:
        fail("accumulation_steps", steps, f"a divisor of batch_size ({config.batch_size})")
    resize = config.resize_size
    if resize is not None and resize < config.image_size:
        fail("resize_size", resize, f"at least image_size ({config.image_size}): the crop is cut from the resize")
    frozen_towers(config)


def check_layout(config, devices: int) -> None:
    """Raises ``ConfigError`` unless the batch splits over ``devices`` and each device's rows into K micro-batches.

    A micro-batch is a block of every device's rows (``trainer.accumulate``),
    so K must divide the batch per device, hence each host's batch too.
    """
    if config.batch_size % devices:
        raise ConfigError(f"--config.batch_size={config.batch_size}: must be a multiple of the "
                          f"device count ({devices})")
    steps, per_device = config.accumulation_steps, config.batch_size // devices
    if per_device % steps:
        raise ConfigError(f"--config.accumulation_steps={steps}: must divide the batch per device "
                          f"(batch_size {config.batch_size} / {devices} devices = {per_device})")


def parse_flags(argv):
    """absl's flag parsing for a trainer command: a ``--config.X`` override that does not apply is one line."""
    import sys

    from absl import app

    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError) as error:  # ml_collections: the override names no field of the config
        overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
        field = str(error).strip("\"'")
        sys.exit(f"error: {', '.join(overrides) or '--config'}: no field '{field}' in the config "
                 "(the config file's get_config() lists its fields)")
    except (TypeError, ValueError) as error:  # a value of the wrong type for its field
        sys.exit(f"error: {error}")
