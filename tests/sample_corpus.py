"""The test run's embedded sample: generated and built once per run, in the background from the start.

With pytest-xdist every worker process runs its own session, so a session
fixture would generate the sample and build it once per worker. Here each is
made once per run, in the run's shared temporary directory, under a file
lock (``once``): whoever comes first makes it, the others wait on the lock
and read what it wrote. ``tests/conftest.py`` starts ``python -m
tests.sample_corpus RUN_DIR`` as soon as the tests are collected, so the
sample is usually made beside the tests that do not need it; a test that
asks before it is done waits for it (or makes it, if the background process
has not taken the lock yet).
"""

import contextlib
import fcntl
import json
import os
import pathlib
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ordinary rows; the ~1,250 planted rows come on top (samplegen).
SAMPLE_SIZE = int(os.environ.get("TEST_SAMPLE_SIZE", "400"))


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def once(run_dir: pathlib.Path, name: str, make) -> pathlib.Path:
    """``run_dir/name``, made by ``make(directory)`` by the first process of the run that asks for it.

    The others wait on the lock and get the same directory; ``make`` writes
    what they need to read back into it.
    """
    target, done = run_dir / name, run_dir / f"{name}.done"
    with _locked(run_dir / f"{name}.lock"):
        if not done.exists():
            target.mkdir(parents=True, exist_ok=True)
            make(target)
            done.touch()
    return target


def build_args(sample_dir, output, *extra):
    """``pipeline.build`` arguments of the sample as its ``sample_info.json`` says to build it."""
    info = json.loads((sample_dir / "sample_info.json").read_text())
    args = ["--input", str(sample_dir / "candidates" / "*.parquet"), "--output", str(output), "--preset", "align"]
    for override in info.get("build_overrides", []):
        args += ["--set", override]
    name, path = info["eval_images"].split("=", 1)
    args += ["--eval_images", f"{name}={sample_dir / path}"]
    return args + list(extra)


def sample(run_dir: pathlib.Path) -> pathlib.Path:
    """The embedded sample, small enough for the default test run."""
    def generate(out):
        subprocess.run([sys.executable, "-m", "samplegen", "--out", str(out), "--num_candidates", str(SAMPLE_SIZE),
                        "--seed", "0"], check=True, cwd=ROOT)

    return once(run_dir, "sample", generate)


def sample_build(run_dir: pathlib.Path) -> pathlib.Path:
    """The sample built by the real Beam job in process, on the FnApiRunner that also measures what each shuffle
    receives (``benchmarks.helpers.shuffles``): a directory with ``corpus/`` and ``measured.json``."""
    sample_dir = sample(run_dir)

    def build(where):
        from benchmarks.helpers.shuffles import measured_build

        funnel, shuffles = measured_build(build_args(sample_dir, where / "corpus"))
        (where / "measured.json").write_text(json.dumps({"funnel": funnel, "shuffles": shuffles.to_json()}))

    return once(run_dir, "sample_build", build)


def start_in_background(run_dir: pathlib.Path):
    """Starts ``python -m tests.sample_corpus run_dir`` unless a process of this run already did: its Popen, or
    None."""
    try:
        os.close(os.open(run_dir / "sample.started", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    with open(run_dir / "sample_corpus.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "tests.sample_corpus", str(run_dir)], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": ROOT})


if __name__ == "__main__":
    from common import beam_construction

    beam_construction.install()  # built as the launcher and the test processes build it
    sample_build(pathlib.Path(sys.argv[1]))
