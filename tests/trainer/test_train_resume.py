"""The trainer end to end on the tiny corpus: train, preempt with SIGTERM, resume.

A run stopped by SIGTERM and resumed from its checkpoint must end with
exactly the params of an uninterrupted run: that needs the params,
optimizer state, step, RNG *and* the data position back. One compilation
cache is shared by the runs, so the train step compiles once.

Each end-to-end test runs twice: light in the default run (the session's
2-step ``tiny_trained`` run as the reference, stopped after step 1) and
heavy in the integration run (a 4-step run of its own, stopped after step 2).
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import tiny_train_config
from trainer import checkpoint, train
from trainer.configs import tiny

from tests.trainer import command_line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cache_dir(jax_cache_dir):
    return jax_cache_dir


@dataclasses.dataclass(frozen=True)
class Size:
    total_steps: int
    stop_after: int          # the step after which SIGTERM comes
    heavy: bool


LIGHT, HEAVY = Size(total_steps=2, stop_after=1, heavy=False), Size(total_steps=4, stop_after=2, heavy=True)
SIZES = [pytest.param(LIGHT, id="light"), pytest.param(HEAVY, id="heavy", marks=pytest.mark.integration)]


@pytest.fixture(scope="module", params=SIZES)
def size(request):
    return request.param


def small_config(data_dir, cache_dir, **overrides):
    config = tiny.get_config()
    config.data_dir = data_dir
    config.total_steps = HEAVY.total_steps
    config.batch_size = 8
    config.image_size = 32
    config.max_text_len = 16
    config.log_every = 1
    config.checkpoint_every = 100      # only the preemption and final saves
    config.eval_batch_size = 8
    config.compilation_cache_dir = cache_dir
    config.xla_cpu_fast_compile = True
    config.evals = {}
    config.update(overrides)
    return config


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def params_of(workdir):
    _, variables, _ = checkpoint.load_model(workdir)
    return variables


def run_config(size, data_dir, cache_dir):
    """The config of ``size``'s runs (without evaluators): the light one is ``tiny_trained``'s."""
    if size.heavy:
        return small_config(data_dir, cache_dir)
    config = tiny_train_config(data_dir, cache_dir)
    config.evals = {}
    return config


@pytest.fixture(scope="module")
def uninterrupted(size, tiny_corpus, cache_dir, tmp_path_factory, request):
    """(workdir, final) of the uninterrupted run of ``size``, with the retrieval evaluator at its end."""
    if not size.heavy:
        return request.getfixturevalue("tiny_trained")
    workdir = str(tmp_path_factory.mktemp("uninterrupted"))
    config = small_config(tiny_corpus, cache_dir,
                          evals={"retrieval": {"split": "validation"}})
    final = train.train_and_evaluate(config, workdir)
    return workdir, final


def test_uninterrupted_run_writes_everything(uninterrupted, size):
    workdir, final = uninterrupted
    assert final["step"] == size.total_steps and not final["preempted"]
    assert np.isfinite(final["train/loss"])
    # The retrieval evaluator ran at the end on the 16 validation pairs.
    assert final["retrieval/num_pairs"] == 16.0
    assert 0.0 <= final["retrieval/i2t_R@1"] <= 1.0
    assert final["retrieval/i2t_R@1_chance"] == pytest.approx(1 / 16)
    steps = [m["step"] for m in read_metrics(workdir) if "train/loss" in m]
    assert steps == list(range(1, size.total_steps + 1))
    assert os.listdir(os.path.join(workdir, "tensorboard"))
    assert checkpoint.load_config(workdir).total_steps == size.total_steps
    # The learned temperature moved away from its initial value.
    assert final["train/temperature"] != tiny.get_config().model.temperature_init


def test_sigterm_then_resume_equals_uninterrupted(uninterrupted, size, tiny_corpus, cache_dir,
                                                  tmp_path):
    reference_dir, _ = uninterrupted
    workdir = str(tmp_path / "preempted")
    config = run_config(size, tiny_corpus, cache_dir)

    def preempt(step):
        if step == size.stop_after:
            os.kill(os.getpid(), signal.SIGTERM)   # the real signal, the real handler

    handler_before = signal.getsignal(signal.SIGTERM)
    first = train.train_and_evaluate(config, workdir, after_step=preempt)
    assert first["preempted"] and first["step"] == size.stop_after
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [str(size.stop_after)]
    # SIGTERM handling is scoped to the run: the previous handler is back.
    assert signal.getsignal(signal.SIGTERM) == handler_before

    second = train.train_and_evaluate(config, workdir)
    assert second["step"] == size.total_steps and not second["preempted"]

    # Same losses step by step: the resumed steps saw the same batches (the
    # stream's batches from stop_after on, not a restart from batch 0) with the same state ...
    reference = {m["step"]: m["train/loss"] for m in read_metrics(reference_dir)
                 if "train/loss" in m}
    resumed = {m["step"]: m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m}
    assert sorted(resumed) == list(range(1, size.total_steps + 1))
    np.testing.assert_allclose([resumed[s] for s in sorted(resumed)],
                               [reference[s] for s in sorted(reference)], rtol=1e-6)
    # ... and bitwise the same params and batch statistics at the end.
    want, got = params_of(reference_dir), params_of(workdir)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a),  # bitwise
                                      err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("size", SIZES)
def test_sigterm_during_start_up_stops_the_command_line_at_its_first_step(size, tiny_corpus, cache_dir, tmp_path,
                                                                          capfd, monkeypatch):
    """The command line handles SIGTERM from its first line on: a preemption that comes
    while it imports, restores and compiles (minutes on a big job) stops the run after
    step 1 with a checkpoint and exit status 75; it must not kill the host outright.
    Light (the default run): the command line in this process (``tests.trainer.command_line``) with
    ``tiny_trained``'s config, whose programs the run's compilation cache holds; SIGTERM comes as the
    run starts setting up. Heavy (the integration run): the real command line in a process of its own,
    the signal as soon as it has printed its first line (before TensorFlow is imported or anything
    compiles)."""
    workdir = str(tmp_path / "run")
    config = run_config(size, tiny_corpus, cache_dir)
    fields = ("data_dir", "total_steps", "batch_size", "image_size", "max_text_len", "compilation_cache_dir")
    overrides = [f"--config.{k}={config[k]}" for k in fields + (() if size.heavy else (
        "resize_size", "xla_cpu_fast_compile"))]
    if not size.heavy:
        set_up = train._set_up

        def signalled_set_up(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)   # the real signal, while the run starts
            return set_up(*args, **kwargs)

        monkeypatch.setattr(train, "_set_up", signalled_set_up)
        handler_before = signal.getsignal(signal.SIGTERM)
        status, out, err = command_line.run(["--config", command_line.TINY, "--workdir", workdir, *overrides], capfd)
        assert signal.getsignal(signal.SIGTERM) == handler_before
        assert out.startswith("training "), out
    else:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.train", "--config", "trainer/configs/tiny.py", "--workdir", workdir,
             *overrides], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        try:
            first = proc.stdout.readline()   # printed before TensorFlow is imported or anything compiles
            assert first.startswith("training "), first
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        status = proc.returncode
    assert status == train.EXIT_PREEMPTED, (status, out, err)
    assert "preempted at step 1" in out and err == ""
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["1"]


@pytest.mark.parametrize("missing", ["--config", "--workdir"])
def test_a_missing_flag_is_a_short_error(missing, tmp_path):
    args = {"--config": "trainer/configs/tiny.py", "--workdir": str(tmp_path / "run")}
    del args[missing]
    done = subprocess.run([sys.executable, "-m", "trainer.train", *[f"{k}={v}" for k, v in args.items()]],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode != 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) <= 2 and f"{missing}=None" in lines[0], done.stderr  # not the 50-line usage text
    assert not os.path.exists(tmp_path / "run")


# The command line in this process in the default run (``tests.trainer.command_line``), in its own in CI's
# integration run.
@pytest.mark.parametrize("process", ["this", pytest.param("own", marks=pytest.mark.integration)])
def test_an_override_of_no_config_field_is_one_line(process, tmp_path, capfd):
    argv = [f"--config={command_line.TINY}", f"--workdir={tmp_path / 'run'}", "--config.warmup_step=5"]
    if process == "this":
        status, stdout, stderr = command_line.run(argv, capfd)
    else:
        done = subprocess.run([sys.executable, "-m", "trainer.train", *argv], cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        status, stdout, stderr = done.returncode, done.stdout, done.stderr
    assert status != 0 and stdout == ""
    assert stderr.strip().splitlines() == [
        "error: --config.warmup_step: no field 'warmup_step' in the config (the config file's get_config() "
        "lists its fields)"]
    assert not os.path.exists(tmp_path / "run")


def test_load_image_encoder(uninterrupted):
    """The towers of either size's run: 32 px images, 128-d embeddings."""
    workdir, _ = uninterrupted
    encode, image_size = checkpoint.load_image_encoder(workdir)
    assert image_size == 32
    images = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype(np.float32)
    embeddings = encode(images)
    assert embeddings.shape == (3, 128) and embeddings.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)
    # Per-example (eval-mode BatchNorm): a batch of one gives the same row.
    np.testing.assert_allclose(encode(images[:1]), embeddings[:1], atol=1e-5)
    with pytest.raises(ValueError):
        encode(np.zeros((1, 64, 64, 3), np.float32))


def test_nan_guard_stops_with_a_clear_message():
    metrics = [(1, {"finite": True, "loss": 3.0, "grad_norm": 1.0}),
               (2, {"finite": False, "loss": float("nan"), "grad_norm": float("nan")})]
    with pytest.raises(FloatingPointError, match="step 2"):
        train._check_and_average(metrics, last_checkpoint=None)
    ok = train._check_and_average(metrics[:1], last_checkpoint=None)
    assert ok == {"loss": 3.0, "grad_norm": 1.0}


def test_a_corpus_whose_build_did_not_finish_is_refused(tiny_corpus, cache_dir, tmp_path):
    """No COMPLETED (a killed build): refused before any work, unless explicitly allowed."""
    import shutil

    from common.corpus_dir import IncompleteCorpus

    killed = tmp_path / "killed"
    shutil.copytree(tiny_corpus, killed)
    os.remove(killed / "COMPLETED")
    with pytest.raises(IncompleteCorpus, match="allow_incomplete"):
        train.train_and_evaluate(small_config(str(killed), cache_dir), str(tmp_path / "work"))
    assert not os.path.exists(tmp_path / "work")
