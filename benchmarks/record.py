"""What every benchmark writes beside its figures: machine, command, commit, load.

Each harness ends with ``record.write(name, figures, args.json)``: the JSON
(``benchmarks/results/<name>.json`` unless ``--json`` names another path)
holds the command line that produced it, the commit of the tree it ran on
(with ``dirty`` if the tree had uncommitted changes), the CPU model, core
count and vector instruction sets, and the load average before and after,
so a table in
``benchmarks/RESULTS.md`` can be traced to a run and regenerated.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", REPO, *args], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def commit() -> str:
    """HEAD of the tree the benchmark runs on, ``+dirty`` if tracked files differ from it."""
    head = _git("rev-parse", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if dirty else "")


def cpu_model() -> str:
    """``Model name`` from ``lscpu`` (``/proc/cpuinfo`` if lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The vector instruction sets that change what XLA, oneDNN, faiss and libjpeg-turbo run: the same
#: commit printed different trainer figures on an AMD EPYC and an Intel Xeon.
INSTRUCTION_SETS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                    "amx_bf16", "amx_int8", "asimd", "sve")


def instruction_sets() -> list:
    """Which of ``INSTRUCTION_SETS`` the CPU has (``/proc/cpuinfo``'s flags; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    return [name for name in INSTRUCTION_SETS if name in flags]
    except OSError:
        pass
    return []


def load() -> list:
    """1, 5 and 15 minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "instruction_sets": instruction_sets(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def command() -> str:
    """The command line as it would be typed from the repository root."""
    argv = list(sys.argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        argv = ["python", "-m", spec.name.removesuffix(".__main__"), *argv[1:]]
    else:
        argv = ["python", *argv]
    return shlex.join(argv)


class Run:
    """Started at the beginning of a benchmark: remembers the load and time before it ran."""

    def __init__(self):
        self.started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.load_before = load()

    def write(self, name: str, figures, path: str = "") -> str:
        """Write ``figures`` with the run's provenance as JSON; returns the path."""
        path = path or os.path.join(RESULTS_DIR, f"{name}.json")
        document = {
            "benchmark": name,
            "command": command(),
            "commit": commit(),
            "machine": machine(),
            "started_utc": self.started,
            "load_before": self.load_before,
            "load_after": load(),
            "figures": figures,
        }
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(document, f, indent=1, sort_keys=False)
            f.write("\n")
        print(f"wrote {os.path.relpath(path, REPO) if path.startswith(REPO) else path}", flush=True)
        return path
