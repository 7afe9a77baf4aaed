"""The launcher as a user runs it: the sdist installed into a fresh virtualenv, the build run from elsewhere.

Slow (minutes: a fresh venv installs Beam, pyarrow, faiss, ... from PyPI or
pip's cache); run with ``pytest -m slow tests/pipeline/build/test_sdist_launcher.py``.
The commands are those of docs/dataflow.md, less the
Dataflow flags (``--runner``, ``--project``, ``--region``,
``--temp_location``): the job runs on the local FnApiRunner with two worker
processes, with ``--setup_file`` as on Dataflow.
"""

import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import repo_root
from corpus_paths import committed

ROOT = repo_root.ROOT


def photo(seed, size=256):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
    image = Image.fromarray(base).resize((size, size + 32 * (seed % 3)), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def run(args, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{args[:3]}... failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_sdist_in_a_fresh_venv_builds_a_corpus_from_outside_the_repository(tmp_path):
    # 1. The sdist, as a release would build it.
    dist = tmp_path / "dist"
    run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist)], cwd=ROOT)
    (sdist,) = list(dist.glob("alt*text*corpus-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (setup_py,) = (tmp_path / "src").glob("*/setup.py")

    # 2. docs/dataflow.md: a fresh virtualenv with the sdist and the lock's versions (no TensorFlow, no JAX).
    venv = tmp_path / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    run([base_python, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", "-c", os.path.join(ROOT, "requirements", "lock.txt"), str(sdist)],
        timeout=3600)
    probe = run([python, "-c", "import importlib.util as u; print(u.find_spec('tensorflow') is None, "
                 "u.find_spec('tensorflow_datasets') is None, u.find_spec('jax') is None)"], cwd=tmp_path)
    assert probe.stdout.split() == ["True", "True", "True"]

    # 3. Candidates, and the build run from a directory that is not the repository.
    inputs = tmp_path / "candidates"
    inputs.mkdir()
    rows = 12
    pq.write_table(pa.table({
        "url": [f"https://example.com/img/{i}.jpg" for i in range(rows)],
        "caption": [f"a small photograph of a red bicycle number {i}" for i in range(rows)],
        "jpg": [photo(i) for i in range(rows)],
    }), inputs / "part-00000.parquet")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    # docs/dataflow.md: pinned worker requirements from the lock (Dataflow installs them; the local runner ignores them).
    pins = run([python, "-m", "pipeline.build.worker_requirements", "--lock",
                os.path.join(ROOT, "requirements", "lock.txt")], cwd=work, env=env).stdout
    (work / "worker-requirements.txt").write_text(pins)
    assert "apache-beam==" in pins and "pillow==" in pins and "tensorflow" not in pins
    done = run([python, "-m", "pipeline.build", "--input", str(inputs / "*.parquet"), "--output", str(tmp_path / "corpus"),
                "--preset", "align", "--set", "vocab_size=0",
                "--setup_file", str(setup_py), "--requirements_file", "worker-requirements.txt",
                "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
               cwd=work, env=env, timeout=1800)
    assert "committed" in done.stdout.splitlines()[-1]
    info = json.loads((tmp_path / "corpus" / "dataset_info.json").read_text())  # the commit
    corpus = committed(tmp_path / "corpus")
    assert (corpus / "stats" / "metrics.json").exists()
    funnel = json.loads((corpus / "stats" / "funnel.json").read_text())
    assert funnel["conserved"] and funnel["input"] == rows
    written = sum(funnel["written"].values())
    assert written > 0 and sum(int(n) for s in info["splits"] for n in s["shardLengths"]) == written
    # The job ran the installed package, not the repository's files.
    where = run([python, "-c", "import pipeline.build as b; print(b.__file__)"], cwd=work, env=env).stdout.strip()
    assert where.startswith(str(venv)) and not where.startswith(ROOT)
