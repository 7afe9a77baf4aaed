r"""EfficientNet-B7 + BERT-Base: ALIGN's data-scaling and ablation model.

B7's pooled features are 640-d, ALIGN's embedding size, so no image
projection. Without one the pooled features *are* the embedding the loss
compares, so EfficientNet's head dropout (0.5 for B7) is not applied: the
paper puts no dropout on its embeddings, and dropping half of each image
embedding would make the contrastive targets noisy (see
``trainer.models.efficientnet``). Paper recipe: batch 16384, 289 px, 64
tokens, LAMB 1e-3 with 10k warmup and linear decay over 1.2M steps, learned
temperature, smoothing 0.1.

    python -m trainer.train --config trainer/configs/b7_bert_base.py --workdir W \
        --config.data_dir=gs://bucket/corpus
"""

from trainer.configs import base_config


def get_config(arg=None):
    del arg
    return base_config(
        image_variant="b7", text_size="base", embed_dim=640, image_size=289,
        max_text_len=64, batch_size=16384, total_steps=1_200_000, peak_lr=1e-3,
        warmup_steps=10_000, eval_every=10_000, log_every=100, checkpoint_every=5_000,
        compute_dtype="bfloat16")
