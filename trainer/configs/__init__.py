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
  image_size     train/eval crop (ALIGN: 289 from a 346 resize).
  resize_size    resize before the crop; default image_size * 346 / 289.
  flip_lr        random horizontal flip in training (ALIGN: yes).
  colour_augment training-only colour ops after the crop, ``trainer.preprocess``
                 syntax (e.g. "random_hue(1.0)"); ALIGN: "" (none).
  max_text_len   tokens incl. [CLS]/[SEP] (ALIGN: 64).
  compute_dtype  "float32" or "bfloat16" (params, optimizer and loss stay f32).
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
"""

from __future__ import annotations

import os

import ml_collections
from ml_collections import config_dict


def vocab_path(config) -> str:
    """The run's wordpiece vocabulary: ``vocab_path``, default ``<data_dir>/vocab.txt``."""
    return config.get("vocab_path") or os.path.join(config.data_dir, "vocab.txt")


def compute_dtype(config):
    """The activations' dtype (``compute_dtype``, default float32) as a JAX dtype."""
    import jax.numpy as jnp  # here: a config file loads without JAX

    return jnp.dtype(config.get("compute_dtype", "float32"))


def cpu_fast_compile_options() -> dict:
    """XLA options for LLVM's cheap passes on CPU (``xla_cpu_fast_compile``); {} elsewhere."""
    import jax  # here: a config file loads without JAX

    if jax.default_backend() != "cpu":
        return {}
    return {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


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
    c.total_steps = total_steps
    c.compute_dtype = compute_dtype
    c.prng_impl = "threefry2x32"
    c.compilation_cache_dir = ""
    c.xla_cpu_fast_compile = False

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
