"""Shared fixtures: the embedded sample corpus, generated and built once per session."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Ordinary rows; the ~1,250 planted rows come on top (samplegen).
SAMPLE_SIZE = int(os.environ.get("TEST_SAMPLE_SIZE", "400"))


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory):
    """The embedded sample, small enough for the default test run."""
    out = tmp_path_factory.mktemp("sample")
    subprocess.run(
        [sys.executable, "-m", "samplegen", "--out", str(out), "--num_candidates", str(SAMPLE_SIZE), "--seed", "0"],
        check=True, cwd=ROOT,
    )
    return out


def build_args(sample_dir, output, *extra):
    info = json.loads((sample_dir / "sample_info.json").read_text())
    args = ["--input", str(sample_dir / "candidates" / "*.parquet"), "--output", str(output), "--preset", "align"]
    for override in info.get("build_overrides", []):
        args += ["--set", override]
    name, path = info["eval_images"].split("=", 1)
    args += ["--eval_images", f"{name}={sample_dir / path}"]
    return args + list(extra)


@pytest.fixture(scope="session")
def measured_sample_build(sample_dir, tmp_path_factory):
    """The sample built by the real Beam job, in process on the FnApiRunner that also
    measures what each shuffle receives (``benchmarks.shuffle_bytes``): (output, funnel, shuffles)."""
    from benchmarks.shuffle_bytes import measured_build

    from common.corpus_dir import resolve

    output = tmp_path_factory.mktemp("built") / "corpus"
    funnel, shuffles = measured_build(build_args(sample_dir, output))
    return type(output)(resolve(str(output))), funnel, shuffles  # the committed version's directory


@pytest.fixture(scope="session")
def sample_build(measured_sample_build):
    """The sample built by the real Beam job (in-process FnApiRunner): (its committed version's directory, funnel)."""
    output, funnel, _ = measured_sample_build
    return output, funnel
