"""Config values are checked against their ranges before the trainer builds anything, one line per mistake."""

import os
import subprocess
import sys

import pytest

from tests.trainer import command_line
from trainer import train
from trainer.configs import (
    ConfigError, Range, b3_bert_mini, b7_bert_base, check, check_layout, l2_bert_large, tiny,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def configured(**fields):
    config = tiny.get_config()
    config.data_dir = "out/corpus"
    for path, value in fields.items():
        *parents, leaf = path.split("__")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


@pytest.mark.parametrize("module", [tiny, b3_bert_mini, b7_bert_base, l2_bert_large])
def test_the_shipped_configs_are_in_range(module):
    config = module.get_config()
    config.data_dir = "out/corpus"
    check(config)


@pytest.mark.parametrize("fields, message", [
    ({"batch_size": -8}, "--config.batch_size=-8: must be an integer >= 1"),
    ({"total_steps": 0}, "--config.total_steps=0: must be an integer >= 1"),
    ({"log_every": 0}, "--config.log_every=0: must be an integer >= 1"),
    ({"checkpoint_every": -1}, "--config.checkpoint_every=-1: must be an integer >= 1"),
    ({"image_size": 0}, "--config.image_size=0: must be an integer >= 1"),
    ({"eval_batch_size": 0}, "--config.eval_batch_size=0: must be an integer >= 1"),
    ({"max_text_len": 1}, "--config.max_text_len=1: must be an integer >= 2"),
    ({"optim__peak_lr": -1e-3}, "--config.optim.peak_lr=-0.001: must be a number >= 0"),
    ({"optim__peak_lr": float("inf")}, "--config.optim.peak_lr=inf: must be a number >= 0"),
    ({"optim__warmup_steps": -5}, "--config.optim.warmup_steps=-5: must be an integer >= 0"),
    ({"optim__b2": 1.0}, "--config.optim.b2=1.0: must be a number in [0, 1)"),
    ({"loss__label_smoothing": -0.1}, "--config.loss.label_smoothing=-0.1: must be a number in [0, 1)"),
    ({"model__temperature_init": 0.0}, "--config.model.temperature_init=0.0: must be a number > 0"),
    ({"tonics__beta": 1.5}, "--config.tonics.beta=1.5: must be a number in [0, 1]"),
    ({"evals__retrieval__every": -100},
     "--config.evals.retrieval.every=-100: must be an integer >= 0 (steps; 0: at the end only)"),
    ({"resize_size": 60}, "--config.resize_size=60: must be at least image_size (64): the crop is cut from the resize"),
    ({"compute_dtype": "float16"}, "--config.compute_dtype=float16: must be float32 or bfloat16"),
    ({"optim__name": "sgd"}, "--config.optim.name=sgd: must be lamb or adam"),
    ({"freeze": "images"}, "--config.freeze=images: must be image, text or image,text"),
    ({"accumulation_steps": 0}, "--config.accumulation_steps=0: must be an integer >= 1"),
    ({"accumulation_steps": 5}, "--config.accumulation_steps=5: must be a divisor of batch_size (64)"),
    ({"data_dir": ""}, "--config.data_dir is not set: the corpus to train on (e.g. --config.data_dir=out/corpus)"),
])
def test_a_value_out_of_range_is_one_line_naming_the_field(fields, message):
    with pytest.raises(ConfigError) as error:
        check(configured(**fields))
    assert str(error.value) == message


@pytest.mark.parametrize("fields, devices, message", [
    ({"batch_size": 12}, 8, "--config.batch_size=12: must be a multiple of the device count (8)"),
    ({"batch_size": 64, "accumulation_steps": 16}, 8,
     "--config.accumulation_steps=16: must divide the batch per device (batch_size 64 / 8 devices = 8)"),
])
def test_the_batch_must_split_over_the_devices_and_each_device_rows_into_micro_batches(fields, devices, message):
    config = configured(**fields)
    check(config)   # in range on its own: the layout depends on the devices the run finds
    with pytest.raises(ConfigError) as error:
        check_layout(config, devices)
    assert str(error.value) == message
    check_layout(configured(batch_size=64, accumulation_steps=8), 8)   # one pair per device per micro-batch


def test_ranges_admit_their_bounds_and_nothing_else():
    rate = Range(False, 0, 1, high_open=True)
    assert rate.admits(0) and rate.admits(0.5) and not rate.admits(1) and not rate.admits(float("nan"))
    count = Range(True, 1)
    assert count.admits(1) and count.admits(10**9) and not count.admits(0) and not count.admits(True)
    assert not count.admits(1.5) and not count.admits("3") and not count.admits(None)
    assert Range(True, 1, optional=True).admits(None)


def test_the_trainer_checks_before_it_builds_anything(tmp_path):
    workdir = tmp_path / "work"
    with pytest.raises(ConfigError, match="batch_size=-8"):
        train.train_and_evaluate(configured(batch_size=-8), str(workdir))
    assert not workdir.exists()


# The command line in this process in the default run (``tests.trainer.command_line``), in its own (TensorFlow
# and JAX imported again for each) in CI's integration run.
@pytest.mark.parametrize("process", ["this", pytest.param("own", marks=pytest.mark.integration)])
@pytest.mark.parametrize("override, message", [
    ("--config.batch_size=-8", "error: --config.batch_size=-8: must be an integer >= 1\n"),
    ("--config.total_steps=0", "error: --config.total_steps=0: must be an integer >= 1\n"),
    ("--config.accumulation_steps=3", "error: --config.accumulation_steps=3: must be a divisor of batch_size (64)\n"),
])
def test_the_command_line_says_it_in_one_line_and_creates_nothing(override, message, process, tmp_path, capfd):
    workdir = tmp_path / "run"
    argv = ["--config", command_line.TINY, "--workdir", str(workdir), "--config.data_dir=out/corpus", override]
    if process == "this":
        assert command_line.run(argv, capfd) == (1, "", message)
    else:
        done = subprocess.run([sys.executable, "-m", "trainer.train", *argv], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert (done.returncode, done.stdout, done.stderr) == (1, "", message)
    assert not workdir.exists()
