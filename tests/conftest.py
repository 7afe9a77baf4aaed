"""Shared fixtures: the embedded sample corpus, generated and built once per test run, and one JAX compilation cache.

The sample is made once per run, in the background from the moment the
tests are collected, and the test files that use it run after the others
(``tests.sample_corpus``).
"""

import json
import os
import pathlib
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One OpenMP thread per test process (and the commands the tests start), set before anything loads an OpenMP
# runtime: the run's worker processes share the machine's cores, and OpenMP's idle threads spin (faiss, the
# k-means and image code under the dedup, record and sample tests: a fifth more CPU than one thread there;
# the trainer's and the builds' tests took the same either way).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The trainer's xla_cpu_fast_compile options for every XLA:CPU program the tests compile: the tests check what
# programs compute, never how fast; EfficientNet's programs compile in a fifth of the default time.
os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0",
                                                  "--xla_llvm_disable_expensive_passes=true",
                                                  "--xla_cpu_use_fusion_emitters=false",
                                                  "--xla_cpu_parallel_codegen_split_count=1"]))

from common import beam_construction  # noqa: E402 (after the path)

beam_construction.install()  # the jobs the tests build are built as the launcher builds them

from tests import sample_corpus  # noqa: E402
from tests.sample_corpus import build_args  # noqa: E402,F401 (the tests' way to build the sample again)

#: The fixtures that need the sample: their tests run after the others (``pytest_collection_modifyitems``).
SAMPLE_FIXTURES = {"sample_dir", "sample_build", "measured_sample_build"}
_BACKGROUND = None  # the process making the sample, if this one started it


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
    # The project's per-machine caches (what loading open_nsfw found): the run's own, never the user's.
    os.environ["ALT_TEXT_CORPUS_CACHE_DIR"] = str(run_directory(config) / "cache")


@pytest.fixture(scope="session")
def jax_cache_dir(pytestconfig) -> str:
    """The run's JAX compilation cache (``compilation_cache_dir`` of the trainer configs the tests run)."""
    return os.environ["JAX_COMPILATION_CACHE_DIR"]


def once_per_run(pytestconfig, name: str, make) -> pathlib.Path:
    """``RUN_DIR/name``, made by ``make(directory)`` once per run (``tests.sample_corpus.once``)."""
    return sample_corpus.once(run_directory(pytestconfig), name, make)


@pytest.fixture(scope="session")
def made_once(pytestconfig):
    """``made_once(name, make)``: ``once_per_run`` for fixtures in other folders (``tests/trainer/conftest.py``):
    what every worker process of the run reads, made by whichever asks first."""
    return lambda name, make: once_per_run(pytestconfig, name, make)


@pytest.fixture(scope="session")
def sample_dir(pytestconfig):
    """The embedded sample, small enough for the default test run."""
    return sample_corpus.sample(run_directory(pytestconfig))


@pytest.fixture(scope="session")
def measured_sample_build(sample_dir, pytestconfig):
    """The sample built by the real Beam job, in process on the FnApiRunner that also measures what each
    shuffle receives (``benchmarks.helpers.shuffles``): (its committed version's directory, funnel, shuffles).

    Built once per run; tests read it and never change it (copy it first).
    """
    from benchmarks.helpers.shuffles import Shuffles
    from common.corpus_dir import resolve

    where = sample_corpus.sample_build(run_directory(pytestconfig))
    measured = json.loads((where / "measured.json").read_text())
    output = pathlib.Path(resolve(str(where / "corpus")))  # the committed version's directory
    return output, measured["funnel"], Shuffles.from_json(measured["shuffles"])


def _uses_the_sample(item) -> bool:
    return bool(SAMPLE_FIXTURES.intersection(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(session, config, items):
    """Test files that use the sample run last, and the sample is made in the background from the start.

    Generating and building the sample is the run's largest single piece of
    work (a minute of CPU); made by the first test that asks, it held every
    other worker that needed it idle. Started as a process of its own as soon
    as the tests are collected, it runs beside the tests that do not need it,
    which come first. Every worker collects the same items and sorts them the
    same way (xdist requires one order).
    """
    files = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    late = {name for name, its in files.items() if any(_uses_the_sample(i) for i in its)}
    items[:] = [i for name, its in files.items() if name not in late for i in its] + \
               [i for name, its in files.items() if name in late for i in its]
    if late and not config.option.collectonly:
        global _BACKGROUND
        _BACKGROUND = sample_corpus.start_in_background(run_directory(config))


def pytest_unconfigure(config):
    if _BACKGROUND is not None and _BACKGROUND.poll() is None:  # the run ended (or was stopped) before it did
        _BACKGROUND.kill()
        _BACKGROUND.wait()


@pytest.fixture(scope="session")
def sample_build(measured_sample_build):
    """The sample built by the real Beam job (in-process FnApiRunner): (its committed version's directory, funnel)."""
    output, funnel, _ = measured_sample_build
    return output, funnel


@pytest.fixture(scope="module")
def server(request):
    """A loopback image server on 127.0.0.1 for the tests that download, started once for the module that asks.

    ``MisbehavingServer`` with its one good JPEG unless the module names
    another in ``SERVER``: a function of no arguments that returns the server
    to start (``LoopbackImages`` for img2dataset's cases, or a
    ``MisbehavingServer`` of the module's own images).
    """
    from tests.pipeline.download_server import MisbehavingServer

    make = getattr(request.module, "SERVER", MisbehavingServer)
    with make() as running:
        yield running
