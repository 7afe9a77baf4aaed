"""Two JAX processes on localhost: train steps, a preemption sync point, a checkpoint,
an evaluation and a resume, each process a real subprocess joined by
``jax.distributed.initialize``.

Slow (two processes compile the train step; minutes on a busy 2-core
machine): ``pytest -m slow tests/trainer/test_multihost.py``.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

TOTAL_STEPS = 4
TIMEOUT_S = 2700  # per run of the two processes; minutes each on a loaded 2-core machine

# One process of the run. SIGTERM reaches process 1 after step 2 and process 0
# only after step 3 (or never): the sync point must stop both after step 2.
DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys
    import jax
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                               process_id=int(sys.argv[2]))
    from trainer import train
    from trainer.configs import tiny

    config = tiny.get_config()
    config.update(data_dir=sys.argv[3], total_steps=%(total)d, batch_size=8, image_size=32,
                  max_text_len=16, log_every=1, checkpoint_every=100, eval_batch_size=8,
                  compilation_cache_dir=sys.argv[5], xla_cpu_fast_compile=True)
    config.evals = {"retrieval": {"split": "validation"}}
    preempt_at = {0: 3, 1: 2}[jax.process_index()] if sys.argv[6] == "preempt" else None

    def after_step(step):
        if step == preempt_at:
            os.kill(os.getpid(), signal.SIGTERM)

    final = train.train_and_evaluate(config, sys.argv[4], after_step=after_step)
    print("FINAL " + json.dumps(final, sort_keys=True), flush=True)
    """ % {"total": TOTAL_STEPS}
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(data_dir, workdir, cache_dir, mode):
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
           "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER, address, str(i), data_dir, workdir,
                               cache_dir, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for i in range(2)]
    finals = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            assert proc.returncode == 0, err[-3000:]
            finals.append(json.loads(next(line for line in out.splitlines()
                                          if line.startswith("FINAL "))[len("FINAL "):]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return finals


@pytest.mark.slow
def test_two_processes_preempt_in_sync_checkpoint_evaluate_and_resume(tiny_corpus, tmp_path):
    workdir, cache_dir = str(tmp_path / "run"), str(tmp_path / "cache")

    # Host 1 sees SIGTERM after step 2, host 0 later: both stop and save at step 2.
    first = run_two_processes(tiny_corpus, workdir, cache_dir, "preempt")
    assert [f["preempted"] for f in first] == [True, True]
    assert [f["step"] for f in first] == [2, 2]
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["2"]

    # Resume on both hosts from step 2 to the end; the final evaluation gathers
    # every host's embeddings, so both hosts report the same numbers.
    second = run_two_processes(tiny_corpus, workdir, cache_dir, "run")
    assert [f["step"] for f in second] == [TOTAL_STEPS] * 2
    assert not any(f["preempted"] for f in second)
    assert second[0]["retrieval/num_pairs"] == 16.0
    retrieval = [{k: v for k, v in f.items() if k.startswith("retrieval/")} for f in second]
    assert retrieval[0] == retrieval[1] and len(retrieval[0]) > 3
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        steps = [row["step"] for row in map(json.loads, f) if "train/loss" in row]
    assert steps == list(range(1, TOTAL_STEPS + 1))  # one writer (process 0), no step twice
