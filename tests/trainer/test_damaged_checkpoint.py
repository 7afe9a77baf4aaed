"""Checkpoints the trainer wrote and something then damaged: resume falls back, loaders name the step.

A real 2-step tiny run (the session's ``tiny_trained``) saves a checkpoint at each step; each case copies it
and damages its newest checkpoint the way a disk or a person would: an
array file truncated or deleted, orbax's metadata or the data position
overwritten with garbage.
"""

import glob
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import tiny_train_config

import repo_root
from filters import model_score
from trainer import checkpoint, train


@pytest.fixture(scope="module")
def two_checkpoints(tiny_trained, tiny_corpus, jax_cache_dir):
    """(workdir, config, final metrics) of a 2-step run with a checkpoint at steps 1 and 2: the session's
    ``tiny_trained`` (never changed: each case damages a copy), and its config without the evaluators."""
    workdir, final = tiny_trained
    config = tiny_train_config(tiny_corpus, jax_cache_dir, checkpoint_every=1, keep_checkpoints=5, evals={})
    assert sorted(os.listdir(os.path.join(workdir, checkpoint.CHECKPOINT_DIR))) == ["1", "2"]
    return workdir, config, final


def _largest_array_file(step_dir):
    found = glob.glob(os.path.join(step_dir, "model", "ocdbt.process_0", "d", "*"))
    return max(found, key=os.path.getsize)


def _truncate(step_dir):
    path = _largest_array_file(step_dir)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


def _delete(step_dir):
    os.remove(_largest_array_file(step_dir))


def _garbage_model_metadata(step_dir):
    with open(os.path.join(step_dir, "model", "_METADATA"), "w") as handle:
        handle.write("garbage")


def _garbage_data_position(step_dir):
    with open(os.path.join(step_dir, "meta", "metadata"), "w") as handle:
        handle.write("\x00garbage{")


DAMAGE = {"truncated": _truncate, "deleted": _delete, "garbage metadata": _garbage_model_metadata}


def _damaged_copy(two_checkpoints, tmp_path, damage, steps=(2,)):
    workdir = str(tmp_path / "run")
    shutil.copytree(two_checkpoints[0], workdir)
    for step in steps:
        damage(os.path.join(workdir, checkpoint.CHECKPOINT_DIR, str(step)))
    return workdir


@pytest.mark.parametrize("name", list(DAMAGE))
def test_loading_a_damaged_checkpoint_names_the_workdir_and_step(two_checkpoints, tmp_path, name):
    workdir = _damaged_copy(two_checkpoints, tmp_path, DAMAGE[name])
    with pytest.raises(checkpoint.DamagedCheckpoint) as error:
        checkpoint.load_model(workdir)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"{workdir}: the checkpoint of step 2 is damaged ("), text
    assert len(text) < 500 and "TensorStore(" not in text, text
    checkpoint.load_model(workdir, step=1)  # the one before it is whole


def test_model_score_with_a_damaged_checkpoint_is_one_line(two_checkpoints, tmp_path):
    workdir = _damaged_copy(two_checkpoints, tmp_path, _truncate)
    scorer = model_score.PairScorer("checkpoint", workdir=workdir)
    with pytest.raises(ValueError) as error:  # the build's one-line usage error, exit status 2
        scorer.check()
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"model score checkpoint {workdir}: the checkpoint of step 2 is "
                                                "damaged"), text


def test_a_damaged_checkpoint_is_exit_status_2_for_evaluate(two_checkpoints, tmp_path, capsys):
    from trainer import evaluate

    workdir = _damaged_copy(two_checkpoints, tmp_path, _garbage_model_metadata)
    with pytest.raises(SystemExit) as done:
        evaluate.main([workdir])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {workdir}: the checkpoint of step 2 is damaged"), err


def _resume(workdir, config, monkeypatch):
    said = []
    monkeypatch.setattr(train, "_say", said.append)
    final = train.train_and_evaluate(config, workdir)
    return final, said


def _assert_resumed_like_the_run(two_checkpoints, workdir, final, said):
    original, _, original_final = two_checkpoints
    skipped = [line for line in said if line.startswith("skipped the checkpoint of step 2: ")]
    assert len(skipped) == 1 and "damaged_checkpoints/2" in skipped[0], said
    assert "resumed from step 1 (1 batches consumed)" in said
    assert os.path.isdir(os.path.join(workdir, checkpoint.DAMAGED_DIR, "2"))
    # The same final state as the run that never had the damaged checkpoint.
    assert final["step"] == original_final["step"] == 2
    np.testing.assert_allclose(final["train/loss"], original_final["train/loss"], rtol=1e-5)
    mine, theirs = checkpoint.load_model(workdir)[1], checkpoint.load_model(original)[1]
    for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_resume_after_a_truncated_checkpoint_continues_from_the_one_before(two_checkpoints, tmp_path, monkeypatch):
    workdir = _damaged_copy(two_checkpoints, tmp_path, _truncate)
    final, said = _resume(workdir, two_checkpoints[1], monkeypatch)
    _assert_resumed_like_the_run(two_checkpoints, workdir, final, said)


#: Resumes (``restore_newest``) of damaged copies of a run, in a process of their own: what the console shows.
#: The collection after each stands for the training that follows a resume (the reads a failed restore left
#: behind printed their tracebacks when collected).
_RESUMES = """
import gc, sys
import orbax.checkpoint as ocp
from trainer import checkpoint

whole = checkpoint.Checkpointer(sys.argv[1], every=1, keep=5)
step_1 = whole.manager.restore(1, args=ocp.args.Composite(model=ocp.args.StandardRestore(),
                                                          train=ocp.args.StandardRestore()))
like = {**step_1.model, **step_1.train}
whole.close()
for workdir in sys.argv[2:]:
    resumer = checkpoint.Checkpointer(workdir, every=1, keep=5)
    step, _, meta = resumer.restore_newest(like, print)
    resumer.close()
    print("resumed from step", step)
    gc.collect()
"""


def test_resume_from_a_truncated_checkpoint_leaves_no_noise_on_the_console(two_checkpoints, tmp_path):
    runs = 10
    workdirs = [_damaged_copy(two_checkpoints, tmp_path / str(run), _truncate) for run in range(runs)]
    env = dict(os.environ, PYTHONPATH=repo_root.ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", _RESUMES, two_checkpoints[0], *workdirs],
                          cwd=repo_root.ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines.count("resumed from step 1") == runs, done.stdout
    assert sum(line.startswith("skipped the checkpoint of step 2: ") for line in lines) == runs, done.stdout
    noise = [line for line in (done.stdout + done.stderr).splitlines()
             if "Traceback" in line or "Exception ignored" in line or "Event loop is closed" in line]
    assert not noise, done.stderr[:3000]


@pytest.mark.slow  # a training run each; the truncated case above is the default run's twin
@pytest.mark.parametrize("damage", [_delete, _garbage_model_metadata, _garbage_data_position],
                         ids=["deleted", "garbage metadata", "garbage data position"])
def test_resume_after_any_damage_continues_from_the_one_before(two_checkpoints, tmp_path, monkeypatch, damage):
    workdir = _damaged_copy(two_checkpoints, tmp_path, damage)
    final, said = _resume(workdir, two_checkpoints[1], monkeypatch)
    _assert_resumed_like_the_run(two_checkpoints, workdir, final, said)


def test_resume_with_every_checkpoint_damaged_names_the_newest(two_checkpoints, tmp_path, monkeypatch):
    workdir = _damaged_copy(two_checkpoints, tmp_path, _garbage_data_position, steps=(1, 2))
    with pytest.raises(checkpoint.DamagedCheckpoint) as error:
        _resume(workdir, two_checkpoints[1], monkeypatch)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"{workdir}: the checkpoint of step 2 is damaged"), text
    assert sorted(os.listdir(os.path.join(workdir, checkpoint.CHECKPOINT_DIR))) == ["1", "2"]  # nothing moved
    with open(os.path.join(workdir, "metrics.jsonl")) as handle:
        assert all(json.loads(line) for line in handle)


@pytest.mark.parametrize("flags", [["--model_score", "checkpoint", "--model_score_arg"],
                                   ["--embedder", "checkpoint", "--embedder_arg"]], ids=["model_score", "embedder"])
def test_a_build_with_a_damaged_checkpoint_exits_2_naming_it(two_checkpoints, tmp_path, capsys, flags):
    from pipeline.build import launcher
    from tests.pipeline.build.test_build_safety import write_candidates

    workdir = _damaged_copy(two_checkpoints, tmp_path, _truncate)
    pattern = write_candidates(tmp_path / "in", rows=2)
    with pytest.raises(SystemExit) as done:
        launcher.main(["--input", str(pattern), "--output", str(tmp_path / "out"), *flags, f"workdir={workdir}"])
    assert done.value.code == 2 and not (tmp_path / "out").exists()
    first = capsys.readouterr().err.splitlines()[0]
    assert f"{workdir}: the checkpoint of step 2 is damaged" in first and "Traceback" not in first, first


def test_a_damaged_config_is_one_line_naming_it(two_checkpoints, tmp_path):
    workdir = _damaged_copy(two_checkpoints, tmp_path, lambda step_dir: None)
    path = os.path.join(workdir, checkpoint.CONFIG_FILE)
    with open(path, "w") as handle:
        handle.write('{"model": {"name": "two_tower", "image": [' + "[" * 100_000)
    with pytest.raises(checkpoint.DamagedFile, match=f"^{path}: JSON nested 100,00[0-9] deep"):
        checkpoint.load_model(workdir)
    with pytest.raises(ValueError) as error:
        model_score.PairScorer("checkpoint", workdir=workdir).check()
    assert str(error.value).startswith(f"model score checkpoint {path}: JSON nested"), error.value
