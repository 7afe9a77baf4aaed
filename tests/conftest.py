"""Shared fixtures: the embedded sample corpus, generated and built once per test run, and one JAX compilation cache.

With pytest-xdist every worker process runs its own session, so a session
fixture would generate the sample and build it once per worker. The
expensive ones here are made once per run (``once_per_run``: the first worker
to ask makes it under a lock, the others wait for it and read it), in the
run's shared temporary directory.
"""

import contextlib
import fcntl
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The trainer's xla_cpu_fast_compile options for every XLA:CPU program the tests compile: the tests check what
# programs compute, never how fast; EfficientNet's programs compile in a fifth of the default time.
os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0",
                                                  "--xla_llvm_disable_expensive_passes=true",
                                                  "--xla_cpu_use_fusion_emitters=false",
                                                  "--xla_cpu_parallel_codegen_split_count=1"]))

from common import beam_construction  # noqa: E402 (after the path)

beam_construction.install()  # the jobs the tests build are built as the launcher builds them

# Ordinary rows; the ~1,250 planted rows come on top (samplegen).
SAMPLE_SIZE = int(os.environ.get("TEST_SAMPLE_SIZE", "400"))


def run_directory(config) -> pathlib.Path:
    """The temporary directory every process of this run shares (xdist's workers each have one below it)."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # One persistent compilation cache for the run: the trainer tests compile the same tiny programs in many
    # tests, worker processes and subprocesses; XLA:CPU takes seconds for each.
    cache = run_directory(config) / "jax_cache"
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"  # not every op of an eager test
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


@pytest.fixture(scope="session")
def jax_cache_dir(pytestconfig) -> str:
    """The run's JAX compilation cache (``compilation_cache_dir`` of the trainer configs the tests run)."""
    return os.environ["JAX_COMPILATION_CACHE_DIR"]


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def once_per_run(pytestconfig, name: str, make) -> pathlib.Path:
    """``RUN_DIR/name``, made by ``make(directory)`` by the first process of the run that asks for it.

    The others wait on the lock and get the same directory; ``make`` writes
    what they need to read back into it.
    """
    root = run_directory(pytestconfig)
    target, done = root / name, root / f"{name}.done"
    with _locked(root / f"{name}.lock"):
        if not done.exists():
            target.mkdir(parents=True, exist_ok=True)
            make(target)
            done.touch()
    return target


@pytest.fixture(scope="session")
def sample_dir(pytestconfig):
    """The embedded sample, small enough for the default test run."""
    def generate(out):
        subprocess.run([sys.executable, "-m", "samplegen", "--out", str(out), "--num_candidates", str(SAMPLE_SIZE),
                        "--seed", "0"], check=True, cwd=ROOT)

    return once_per_run(pytestconfig, "sample", generate)


def build_args(sample_dir, output, *extra):
    info = json.loads((sample_dir / "sample_info.json").read_text())
    args = ["--input", str(sample_dir / "candidates" / "*.parquet"), "--output", str(output), "--preset", "align"]
    for override in info.get("build_overrides", []):
        args += ["--set", override]
    name, path = info["eval_images"].split("=", 1)
    args += ["--eval_images", f"{name}={sample_dir / path}"]
    return args + list(extra)


@pytest.fixture(scope="session")
def measured_sample_build(sample_dir, pytestconfig):
    """The sample built by the real Beam job, in process on the FnApiRunner that also measures what each
    shuffle receives (``benchmarks.shuffle_bytes``): (its committed version's directory, funnel, shuffles).

    Built once per run; tests read it and never change it (copy it first).
    """
    from benchmarks.shuffle_bytes import Shuffles, measured_build
    from common.corpus_dir import resolve

    def build(where):
        funnel, shuffles = measured_build(build_args(sample_dir, where / "corpus"))
        (where / "measured.json").write_text(json.dumps({"funnel": funnel, "shuffles": shuffles.to_json()}))

    where = once_per_run(pytestconfig, "sample_build", build)
    measured = json.loads((where / "measured.json").read_text())
    output = pathlib.Path(resolve(str(where / "corpus")))  # the committed version's directory
    return output, measured["funnel"], Shuffles.from_json(measured["shuffles"])


@pytest.fixture(scope="session")
def sample_build(measured_sample_build):
    """The sample built by the real Beam job (in-process FnApiRunner): (its committed version's directory, funnel)."""
    output, funnel, _ = measured_sample_build
    return output, funnel
