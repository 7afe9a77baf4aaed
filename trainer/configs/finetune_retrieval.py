r"""Fine-tuning a trained run for retrieval: ALIGN's recipe (the same loss, a smaller batch, a low LR).

ALIGN fine-tunes its pre-trained towers on Flickr30K and MSCOCO with the
pre-training loss, batch 2048 instead of 16384 and learning rate 1e-5
instead of 1e-3 (Jia et al. 2021, Sec. 5.1). This config takes the
pre-trained run's workdir as its argument and returns that run's own config
(same model, vocabulary, image size, evaluators) with the towers
initialised from its latest checkpoint (``init_from``), the batch divided
by 8, the peak learning rate by 100 and a short schedule:

    python -m trainer.train --config trainer/configs/finetune_retrieval.py:out/train \
        --workdir out/finetune --config.data_dir=out/finetune_corpus [--config.total_steps=...]

``data_dir`` defaults to the pre-training data; point it at the shards of
the retrieval set to fine-tune on. The fine-tuning run is an ordinary run:
it checkpoints, resumes from its own workdir (a resumed run restores its
own checkpoint, not ``init_from``'s), logs and evaluates like pre-training,
and ``trainer.evaluate`` / ``trainer.embed`` work on its workdir.
"""

import os

BATCH_DIVISOR = 8      # ALIGN: 16384 -> 2048
LR_DIVISOR = 100       # ALIGN: 1e-3 -> 1e-5
TOTAL_STEPS = 200
WARMUP_FRACTION = 0.1


def get_config(arg=None):
    from trainer import checkpoint

    if not arg:
        raise ValueError("finetune_retrieval needs the pre-trained workdir: "
                         "--config trainer/configs/finetune_retrieval.py:out/train")
    pretrained = arg
    config = checkpoint.load_config(pretrained)
    config.init_from = pretrained
    config.vocab_path = os.path.join(pretrained, checkpoint.VOCAB_FILE)  # the towers' vocabulary
    config.batch_size = max(8, config.batch_size // BATCH_DIVISOR)
    config.optim.peak_lr = config.optim.peak_lr / LR_DIVISOR
    config.total_steps = TOTAL_STEPS
    config.optim.warmup_steps = int(TOTAL_STEPS * WARMUP_FRACTION)
    config.checkpoint_every = min(config.checkpoint_every, TOTAL_STEPS // 2)
    config.log_every = min(config.log_every, TOTAL_STEPS // 8)
    for entry in config.evals.values():
        if entry.get("every"):
            entry["every"] = TOTAL_STEPS // 2
    return config
