"""Two JAX processes on localhost (``jax.distributed.initialize``, gloo collectives on
CPU, 2 devices each): train steps, a preemption on one host only, a checkpoint, every
evaluator and a resume, checked against an uninterrupted 2-process run.

Each process runs ``DRIVER``, which goes through three stages in one
distributed session (one start-up and one coordinator instead of three):

1. ``preempt``: the trainer's command line (``trainer.train.main``, flags
   parsed by absl, the multi-process flags included) with a hook that sends the
   real SIGTERM to process 1 only, after step ``STOP_AFTER``. The sync point
   must stop both processes after that same step; both save it and both exit 75.
2. ``resume``: the same command line again; both continue to ``TOTAL_STEPS``,
   exit 0 and run every evaluator (retrieval, zero-shot, kNN, gallery) on
   embeddings gathered from both hosts, so both report the same numbers.
3. ``reference``: an uninterrupted 2-process run of the same config in
   another workdir (``train_and_evaluate``, no evaluators): the resumed run
   must end with bitwise its parameters and the same loss at every step.

The driver runs in its own session with a timeout; on timeout the test kills
the process groups it started, so it never hangs (a broken sync point, e.g.
``agreed()`` returning the local flag, leaves the hosts waiting for each other:
this test then fails at the timeout).

Cost: 88-120 CPU-seconds for both processes (so at least ~50 s on 2 cores). Process 1
compiles every program in every stage: on CPU, JAX's persistent compilation
cache keys differ between processes and only process 0 writes entries
("Not writing persistent cache entry since process_id != 0").
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOTAL_STEPS = 4
STOP_AFTER = 2
TIMEOUT_S = 480  # the whole job: 88-120 CPU-s, 110-150 s wall at load 7-9 on 2 cores
EXIT_PREEMPTED = 75

# argv: reference workdir, preempted workdir, then the trainer's flags (no --workdir).
DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys
    import ml_collections
    from absl import app, flags
    from trainer import train

    reference, workdir = sys.argv.pop(1), sys.argv.pop(1)
    run_train = train.train_and_evaluate
    stage, finals = None, {}

    def after_step(step):
        import jax
        if stage == "preempt" and jax.process_index() == 1 and step == %(stop_after)d:
            os.kill(os.getpid(), signal.SIGTERM)   # the real signal, to this process only

    def recorded(config, workdir, **kwargs):
        finals[stage] = run_train(config, workdir, after_step=after_step, **kwargs)
        return finals[stage]

    def report(status):
        print("STAGE " + json.dumps({"stage": stage, "status": status, "final": finals.get(stage)}), flush=True)

    def stages(argv):
        global stage
        train.train_and_evaluate = recorded
        flags.FLAGS.workdir = workdir
        for stage in ("preempt", "resume"):
            try:
                train.main(argv)
                report(0)
            except SystemExit as exit:
                report(exit.code)
        stage = "reference"
        config = ml_collections.ConfigDict(train._CONFIG.value.to_dict())
        config.evals = {}
        recorded(config, reference)
        report(0)

    app.run(stages)
    """ % {"stop_after": STOP_AFTER}
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(reference, workdir, overrides, logs):
    """Runs the job; returns per process (exit status, stdout, stderr, {stage: report}).

    Output goes to files in ``logs`` (a pipe left unread while waiting for the
    other process could fill up and stall the job).
    """
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2",
           "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu"}
    os.makedirs(logs, exist_ok=True)
    paths = [(os.path.join(logs, f"process{i}.out"), os.path.join(logs, f"process{i}.err")) for i in range(2)]
    procs = []
    try:
        for i, (out_path, err_path) in enumerate(paths):
            with open(out_path, "w") as out, open(err_path, "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", DRIVER, reference, workdir, "--config", "trainer/configs/tiny.py",
                     f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}",
                     *[f"--config.{k}={v}" for k, v in overrides.items()]],
                    cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True))
        deadline = time.monotonic() + TIMEOUT_S
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the 2-process job did not finish in {TIMEOUT_S}s (hosts out of step "
                            f"wait for each other forever); output in {logs}, logs in {workdir}")
    finally:
        for proc in procs:   # only the process groups this test started
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    results = []
    for proc, (out_path, err_path) in zip(procs, paths):
        with open(out_path) as f:
            out = f.read()
        with open(err_path) as f:
            err = f.read()
        stages = [json.loads(line[len("STAGE "):]) for line in out.splitlines() if line.startswith("STAGE ")]
        results.append((proc.returncode, out, err, {s["stage"]: s for s in stages}))
    return results


def params_of(workdir):
    import jax

    from trainer import checkpoint

    _, variables, _ = checkpoint.load_model(workdir)
    return {jax.tree_util.keystr(path): np.asarray(x)
            for path, x in jax.tree_util.tree_leaves_with_path(variables)}


def train_losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [(row["step"], row["train/loss"]) for row in rows if "train/loss" in row], rows


# Two JAX processes with a coordinator: CI's integration run. Its light twins in the default run: each host's
# share of the data (tests/trainer/test_input_pipeline.py, process_count=2) and one process's preemption and
# bitwise resume (tests/trainer/test_train_resume.py).
@pytest.mark.integration
def test_two_processes_preempt_in_sync_checkpoint_evaluate_and_resume(tiny_corpus, tiny_eval_folder,
                                                                       tmp_path):
    overrides = dict(data_dir=tiny_corpus, eval_dir=tiny_eval_folder, total_steps=TOTAL_STEPS,
                     batch_size=8, image_size=32, resize_size=36, max_text_len=16, log_every=1,
                     checkpoint_every=100, eval_batch_size=8,
                     compilation_cache_dir=os.environ["JAX_COMPILATION_CACHE_DIR"], xla_cpu_fast_compile=True)
    reference, workdir = str(tmp_path / "reference"), str(tmp_path / "run")

    results = run_two_processes(reference, workdir, overrides, str(tmp_path / "output"))
    for status, out, err, stages in results:
        assert status == 0 and set(stages) == {"preempt", "resume", "reference"}, err[-3000:]
    (_, console, _, stages0), (_, _, _, stages1) = results

    # SIGTERM on process 1 only: both stopped after the same step, saved it, exited 75.
    for stages in (stages0, stages1):
        assert stages["preempt"]["status"] == EXIT_PREEMPTED
        assert stages["preempt"]["final"]["preempted"] and stages["preempt"]["final"]["step"] == STOP_AFTER
        assert stages["resume"]["status"] == 0
        assert stages["resume"]["final"]["step"] == TOTAL_STEPS and not stages["resume"]["final"]["preempted"]
    assert f"preempted at step {STOP_AFTER}" in console and f"done at step {TOTAL_STEPS}" in console
    assert "Gloo" not in console          # library chatter goes to the logs, not the console
    assert os.path.exists(os.path.join(workdir, "train.process1.log"))

    # Every evaluator ran on both hosts over the whole set, with the same numbers.
    evals = [{k: v for k, v in s["resume"]["final"].items() if not k.startswith(("train/", "step", "preempted"))}
             for s in (stages0, stages1)]
    assert evals[0] == evals[1]
    assert evals[0]["retrieval/num_pairs"] == 16.0  # the tiny corpus's validation split
    assert {"zeroshot/top1", "knn/top1", "gallery/text_queries"} <= set(evals[0])
    assert os.path.exists(os.path.join(workdir, "retrieval.html"))

    # One metrics writer (process 0): every step once, the same losses as the uninterrupted run.
    losses, rows = train_losses(workdir)
    want, _ = train_losses(reference)
    assert [step for step, _ in losses] == list(range(1, TOTAL_STEPS + 1))
    assert losses == want
    assert [row["step"] for row in rows if "retrieval/num_pairs" in row] == [TOTAL_STEPS]
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [str(STOP_AFTER), str(TOTAL_STEPS)]

    # Bitwise the uninterrupted run's parameters and BatchNorm statistics.
    got, expected = params_of(workdir), params_of(reference)
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
