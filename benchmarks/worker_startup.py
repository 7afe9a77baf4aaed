"""What a Dataflow worker installs before its first element, timed: ``--requirements_file`` and ``--setup_file``.

    python -m pipeline.build.worker_requirements > worker-requirements.txt
    pip download --no-deps --prefer-binary -r worker-requirements.txt -d WHEELHOUSE
    pip download setuptools wheel -d TOOLS
    python -m benchmarks.worker_startup --requirements worker-requirements.txt --wheelhouse WHEELHOUSE --tools TOOLS

With ``--requirements_file`` and ``--setup_file``, every SDK container of
every worker (Beam's Python container) starts with ``pip install -r
requirements.txt`` from the files the launcher staged (Beam's requirements
cache: one file per pin, downloaded from GCS by each worker), then ``pip
install workflow.tar.gz`` (this package's sdist), then imports what the job's
DoFns need. This harness does the same in a fresh virtualenv on this
machine, offline (``--no-index --find-links WHEELHOUSE``): the bytes of the
wheelhouse (what each worker downloads), the wall and CPU seconds of each
install (pip and its subprocesses), the installed bytes, and the first
import of the worker's modules (``pipeline.stages.judge``,
``filters.open_nsfw``, ``pipeline.write.second_pass``). The virtualenv's own
creation is not counted (the container exists already).

Beam's container already holds Beam and part of its dependencies at its own
pins, so on Dataflow the pins that match the container are skipped: this
harness measures the whole list, an upper bound.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from benchmarks import harness, record

WORKER_MODULES = ("pipeline.stages.judge", "filters.open_nsfw", "pipeline.write.second_pass",
                  "pipeline.stages.eval_index", "dedup.transforms")


def directory_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def timed(command, **kwargs) -> dict:
    """Wall and CPU seconds (children: pip and what it starts) of one command."""
    return harness.run_command(command, check=True, stdout=subprocess.DEVNULL, **kwargs).cost(1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requirements", required=True, help="the workers' --requirements_file")
    parser.add_argument("--wheelhouse", required=True, help="pip download of it (what the launcher stages)")
    parser.add_argument("--tools", default="", help="wheels of setuptools and wheel (in Beam's container already)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    run = record.Run()
    with open(args.requirements) as handle:
        pins = [line for line in (l.split("#", 1)[0].strip() for l in handle) if line]
    figures = {"pins": len(pins), "wheelhouse_files": len(os.listdir(args.wheelhouse)),
               "wheelhouse_bytes": directory_bytes(args.wheelhouse)}
    with tempfile.TemporaryDirectory() as scratch:
        venv = os.path.join(scratch, "worker")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        quiet = ["-q", "--disable-pip-version-check", "--no-cache-dir", "--no-index"]
        if args.tools:  # what Beam's container has already: setuptools and wheel, to build the pins without wheels
            subprocess.run([python, "-m", "pip", "install", *quiet, "--find-links", args.tools, "--find-links",
                            args.wheelhouse, "setuptools", "wheel"],
                           check=True, stdout=subprocess.DEVNULL)
        empty = directory_bytes(venv)
        # Offline from the staged files, as Beam's container installs them: nothing to fetch a build backend from.
        offline = ["--no-index", "--no-build-isolation", "--find-links", args.wheelhouse, "--disable-pip-version-check",
                   "--no-cache-dir"]
        figures["requirements"] = timed([python, "-m", "pip", "install", "-q", *offline, "-r", args.requirements])
        dist = os.path.join(scratch, "dist")
        subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", dist], cwd=harness.REPO, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (sdist,) = os.listdir(dist)
        figures["sdist_bytes"] = os.path.getsize(os.path.join(dist, sdist))
        figures["setup"] = timed([python, "-m", "pip", "install", "-q", *offline, os.path.join(dist, sdist)])
        figures["installed_bytes"] = directory_bytes(venv) - empty
        figures["first_import"] = timed([python, "-c", "import " + ", ".join(WORKER_MODULES)], cwd=scratch)
    wall = sum(figures[part]["wall_s"] for part in ("requirements", "setup", "first_import"))
    figures["total_wall_s"] = round(wall, 1)
    print(f"{figures['pins']} pins, wheelhouse {figures['wheelhouse_bytes'] / 1e6:.0f} MB "
          f"({figures['wheelhouse_files']} files), installed {figures['installed_bytes'] / 1e6:.0f} MB")
    for part in ("requirements", "setup", "first_import"):
        print(f"{part}: {figures[part]['wall_s']} s wall, {figures[part]['cpu_s']} CPU s")
    print(f"before the first element: {figures['total_wall_s']} s wall")
    run.write("worker_startup", figures, args.json)


if __name__ == "__main__":
    main()
