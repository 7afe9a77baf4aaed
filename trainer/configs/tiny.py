r"""Tiny ALIGN: a CPU demo that learns retrieval on the sample corpus in minutes.

Same recipe as the paper (EfficientNet + BERT from scratch, learned
temperature from 1.0, label smoothing 0.1, LAMB with linear warmup/decay),
scaled to 2 CPU cores: EfficientNet with width and depth x0.25 at 64 px, a
2-layer BERT, 128-d embeddings, batch 128, 24 tokens (the sample's captions
are at most 22), 400 steps.

The LR is scaled up with the run 3000x shorter than the paper's: LAMB's
trust ratio makes a step change each weight matrix by ``lr`` of its norm, and
the Adam-stepped log-temperature moves by about ``lr`` per step, so 1e-2 lets
the temperature fall from 1.0 towards ALIGN's ~1/64 within the run (measured
on the 2,888-pair sample corpus: 0.19 at step 400; held-out R@1 0.14 i2t /
0.13 t2i over 163 pairs, ~22x chance; with 2e-3 the temperature stayed near
0.9 and R@1 was at chance after 100 steps).

    python -m trainer.train --config trainer/configs/tiny.py --workdir out/train \
        --config.data_dir=out/corpus [--config.eval_dir=out/sample/eval]
"""

from trainer.configs import base_config


def get_config(arg=None):
    del arg
    config = base_config(
        image_variant="tiny", text_size="tiny", embed_dim=128, image_size=64,
        max_text_len=24, batch_size=128, total_steps=400, peak_lr=1e-2,
        warmup_steps=40, eval_every=100, log_every=25, checkpoint_every=100,
        image_dropout=0.0, drop_path=0.0, text_dropout=0.0, eval_batch_size=128)
    # Zero-shot and KNN (with --config.eval_dir) compile more encoders: less often.
    config.evals.zeroshot.every = config.evals.knn.every = 200
    # RngBitGenerator keys: init compiles ~2x faster on CPU than threefry.
    config.prng_impl = "rbg"
    return config
