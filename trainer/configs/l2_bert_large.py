r"""EfficientNet-L2 + BERT-Large: the full ALIGN model.

L2's pooled features are 1376-d, the paper's embedding size. No projection, so
no dropout on the embedding (EfficientNet's 0.5 head dropout would fall on
the vector the loss compares; the paper has none there). Batch 16384
(1024 TPUv3 cores x 16), 289 px crops of 346 px resizes, 64 tokens, LAMB
1e-3 with 10k warmup and linear decay over 1.2M steps, weight decay 1e-5,
learned temperature from 1.0 (converges near 1/64), label smoothing 0.1.

    python -m trainer.train --config trainer/configs/l2_bert_large.py --workdir W \
        --config.data_dir=gs://bucket/corpus
"""

from trainer.configs import base_config


def get_config(arg=None):
    del arg
    return base_config(
        image_variant="l2", text_size="large", embed_dim=1376, image_size=289,
        max_text_len=64, batch_size=16384, total_steps=1_200_000, peak_lr=1e-3,
        warmup_steps=10_000, eval_every=10_000, log_every=100, checkpoint_every=5_000,
        compute_dtype="bfloat16")
