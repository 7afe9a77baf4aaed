r"""EfficientNet-B3 + BERT-Mini: the small member of ALIGN's model-scaling ablation.

B3's pooled features (384-d) get a linear projection to ALIGN's 640-d
embedding, as the paper does for B1/B3/B5; EfficientNet's head dropout (0.3)
sits before that projection, as before EfficientNet's classifier, so the
embedding itself is never dropped out. Everything else is the paper's
pretraining recipe: batch 16384, 289 px crops of 346 px resizes, 64 tokens,
LAMB peak 1e-3 with 10k warmup steps, linear decay over 1.2M steps, learned
temperature from 1.0, label smoothing 0.1, bf16 compute.

    python -m trainer.train --config trainer/configs/b3_bert_mini.py --workdir W \
        --config.data_dir=gs://bucket/corpus
"""

from trainer.configs import base_config


def get_config(arg=None):
    del arg
    return base_config(
        image_variant="b3", text_size="mini", embed_dim=640, image_size=289,
        max_text_len=64, batch_size=16384, total_steps=1_200_000, peak_lr=1e-3,
        warmup_steps=10_000, eval_every=10_000, log_every=100, checkpoint_every=5_000,
        compute_dtype="bfloat16")
