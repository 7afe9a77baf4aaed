"""Fine-tuning for retrieval (``configs/finetune_retrieval.py``): from a trained run's towers, resumable, evaluated."""

import json
import os

import jax
import numpy as np
import pytest

from trainer import checkpoint, train
from trainer.configs import finetune_retrieval


def params(workdir):
    return checkpoint.load_model(workdir)[1]["params"]


def test_the_config_is_the_pretrained_runs_with_alignss_recipe(tiny_trained):
    workdir, _ = tiny_trained
    pretrained = checkpoint.load_config(workdir)
    config = finetune_retrieval.get_config(workdir)
    assert config.init_from == workdir
    assert config.vocab_path == os.path.join(workdir, "vocab.txt")
    assert config.model.to_dict() == pretrained.model.to_dict() and config.loss.to_dict() == pretrained.loss.to_dict()
    assert config.batch_size == max(8, pretrained.batch_size // 8)
    assert config.optim.peak_lr == pytest.approx(pretrained.optim.peak_lr / 100)
    assert config.evals.to_dict().keys() == pretrained.evals.to_dict().keys()
    with pytest.raises(ValueError, match="needs the pre-trained workdir"):
        finetune_retrieval.get_config(None)


# Light (the default run): 16 px crops, which the CNN tower takes as well (its weights do not depend on
# the image size); heavy (the integration run): the pre-trained run's own 32 px.
@pytest.mark.parametrize("image_size", [pytest.param(16, id="light"),
                                        pytest.param(None, id="heavy", marks=pytest.mark.integration)])
def test_finetuning_starts_from_the_pretrained_towers_resumes_and_evaluates(image_size, tiny_trained, tmp_path):
    pretrained_dir, _ = tiny_trained
    workdir = str(tmp_path / "finetune")
    config = finetune_retrieval.get_config(pretrained_dir)
    if image_size:
        config.update(image_size=image_size, resize_size=image_size + image_size // 8)
    config.total_steps = 1
    config.optim.peak_lr = 0.0        # no update: the params after step 1 are the initial ones
    config.evals = {"retrieval": {"split": "validation"}}
    first = train.train_and_evaluate(config, workdir)
    assert first["step"] == 1 and first["retrieval/num_pairs"] == 16
    want, got = params(pretrained_dir), params(workdir)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=jax.tree_util.keystr(path))

    # Resumed with more steps: from its own step-1 checkpoint, not from the pre-trained towers again.
    config.total_steps = 2
    config.optim.peak_lr = 1e-3
    second = train.train_and_evaluate(config, workdir)
    assert second["step"] == 2 and not second["preempted"]
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert [r["step"] for r in rows if "retrieval/i2t_R@1" in r] == [1, 2]
    moved = any(not np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(params(workdir))))
    assert moved
