r"""Tiny ALIGN: a CPU demo that visibly learns retrieval on the sample corpus in minutes.

A BERT text tower, L2-normalised embeddings, learned temperature and the
in-batch softmax loss with label smoothing 0.1, as in the paper, scaled to
2 CPU cores: a 2-layer BERT, 128-d embeddings, batch 64, 24 tokens (the
sample's captions are at most 22), 1200 steps at 64 px.

What a short CPU run needs that a 1.2M-step one does not (the paper configs
keep the paper's values):
  * a plain 6-layer CNN image tower (``trainer.models.convnet``: 3x3 convs,
    32-32-64-64-128-128 channels, BatchNorm, ReLU) instead of EfficientNet:
    EfficientNet at width x0.5 / depth x0.25 (8-24 channels in its early
    layers) had barely started after 50 steps (held-out R@1 0.03 / 0.04;
    the CNN: 0.12 / 0.12) and ended at 0.29 / 0.31 after 400 (the CNN:
    0.57 / 0.55, for the same ~10 CPU-min);
  * the text embedding is the mean of the token states (``text.pool``), not
    the [CLS] state: every word reaches the loss from the first step (R@1
    0.64 / 0.60 after 400 steps at batch 128, against 0.57 / 0.55);
  * batch 64 for 1200 steps rather than 128 for 400 (more, smaller
    updates; ~12 CPU-min) and a random hue rotation of every training image
    (``colour_augment``): kNN top-1 0.69 and zero-shot 0.54 over the
    sample's 8 shape classes after 1200 steps; without the rotation 0.51 and
    0.59 (the image embedding then keeps colour, which the nearest
    neighbour matches on); after 800 steps 0.50 and 0.45;
  * temperature initialised at 0.07 (CLIP's init) and learned, not ALIGN's 1.0:
    from 1.0 the logits span [-1, 1], the softmax over the batch is nearly
    flat, and the temperature was still 0.19 after 400 steps;
  * Adam at peak 2e-3 with 50 warmup steps, linear decay to 0 (``optim.name``):
    LAMB's per-layer trust ratio moved the few-channel layers too slowly
    (4e-3 learned no better);
  * BatchNorm momentum 0.9: 0.99 averages over ~100 steps, so the eval
    statistics would lag the weights of a short run;
  * no horizontal flip (captions say "left of" / "right of"), and a mild
    random crop (64 of 72 px) so that shapes near the border stay in view;
  * no dropout (a few hundred steps do not overfit).

Measured curve (steps vs held-out R@1): benchmarks/RESULTS.md.

    python -m trainer.train --config trainer/configs/tiny.py --workdir out/train \
        --config.data_dir=out/corpus [--config.eval_dir=out/sample/eval]
"""

import ml_collections

from trainer.configs import base_config


def get_config(arg=None):
    del arg
    config = base_config(
        image_variant="tiny", text_size="tiny", embed_dim=128, image_size=64,
        max_text_len=24, batch_size=64, total_steps=1200, peak_lr=2e-3,
        warmup_steps=50, eval_every=100, log_every=50, checkpoint_every=200,
        text_dropout=0.0, eval_batch_size=128)
    config.resize_size = 72
    config.flip_lr = False
    config.colour_augment = "random_hue(1.0)"
    config.model.text.pool = "mean"
    config.model.image = ml_collections.ConfigDict(
        {"tower": "convnet", "filters": (32, 32, 64, 64, 128, 128), "norm": "batch",
         "bn_momentum": 0.9})
    config.model.temperature_init = 0.07
    config.optim.name = "adam"
    config.optim.b2 = 0.98
    # Zero-shot and kNN (with --config.eval_dir) compile more encoders: at the end only.
    config.evals.zeroshot.every = config.evals.knn.every = 0
    # RngBitGenerator keys: init compiles ~2x faster on CPU than threefry.
    config.prng_impl = "rbg"
    return config
