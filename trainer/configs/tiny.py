r"""Tiny ALIGN: a CPU demo that learns retrieval on the sample corpus in minutes.

Same recipe as the paper (EfficientNet + BERT from scratch, learned
temperature from 1.0, label smoothing 0.1, LAMB with linear warmup/decay),
scaled to 2 CPU cores: EfficientNet with width and depth x0.25 at 64 px, a
2-layer BERT, 128-d embeddings, batch 128, LR warmup and peak scaled.

    python -m trainer.train --config trainer/configs/tiny.py --workdir out/train \
        --config.data_dir=out/corpus [--config.eval_dir=out/sample/eval]
"""

from trainer.configs import base_config


def get_config(arg=None):
    del arg
    config = base_config(
        image_variant="tiny", text_size="tiny", embed_dim=128, image_size=64,
        max_text_len=24, batch_size=128, total_steps=1000, peak_lr=2e-3,
        warmup_steps=100, eval_every=250, log_every=25, checkpoint_every=250,
        image_dropout=0.0, drop_path=0.0, text_dropout=0.0, eval_batch_size=128)
    # RngBitGenerator keys: init compiles ~2x faster on CPU than threefry.
    config.prng_impl = "rbg"
    return config
