"""How every benchmark takes its figures: process-tree CPU, child commands, repeats and medians, the sample's build.

What a run writes beside its figures (command, commit, machine, load) is
``benchmarks.record``'s; each harness starts a ``record.Run`` and ends with
its ``write``. This module is the measuring side:

- ``Timer``: wall seconds and CPU seconds of a block of code, this process's
  own (every thread) and that of the children it reaped meanwhile
  (``getrusage``), with the load average before and after. A process's
  children count once they are waited for, and a grandchild only if its
  parent waited for it: a Beam runner's SDK workers and a ``Pool``'s
  processes are, a daemon left running is not.
- ``run_command``: one child command, its wall time and the CPU of it and
  every process below it that was reaped (``Timer.children_s``);
  ``run_build`` is ``python -m pipeline.build`` so, with the peak resident
  size of its processes (``WorkerMemory``); ``process_cpu_seconds`` reads a
  process that still runs (a server beside the measured client).
- ``timed`` and ``cpu_ms_per_item``: repeated passes of in-process work,
  medians; ``interleaved``: several arms repeated A, B, A, B ... so that a
  change of load in the machine falls on every arm alike; ``medians``.
- ``sample_build_args``: ``pipeline.build``'s arguments for a sample of
  ``samplegen`` built as the demo builds it (``make_sample`` makes one).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional

from benchmarks import record

REPO = record.REPO


# ---------------------------------------------------------------------------
# CPU of this process and of the processes below it
# ---------------------------------------------------------------------------


def cpu_self() -> float:
    """User + system seconds of this process so far, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_children() -> float:
    """User + system seconds of the children this process has reaped so far (and of what they reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_tree() -> float:
    """``cpu_self() + cpu_children()``: the process tree, as far as it has been reaped."""
    return cpu_self() + cpu_children()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of one process so far, while it runs (``/proc/<pid>/stat``), e.g. a server."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Timer:
    """``with Timer() as t: ...``; then ``t.wall_s``, ``t.self_s``, ``t.children_s``, ``t.cpu_s`` (their sum),
    ``t.load_before`` and ``t.load_after``."""

    def __enter__(self) -> "Timer":
        self.load_before = record.load()
        self._start = (time.perf_counter(), cpu_self(), cpu_children())
        return self

    def __exit__(self, *exc) -> None:
        wall, own, children = self._start
        self.wall_s = time.perf_counter() - wall
        self.self_s = cpu_self() - own
        self.children_s = cpu_children() - children
        self.load_after = record.load()

    @property
    def cpu_s(self) -> float:
        return self.self_s + self.children_s


@dataclass
class Finished:
    """A child command that ran: its exit and output, its wall seconds, the CPU seconds of it and what it reaped,
    and the load average before and after."""

    returncode: int
    stdout: Optional[str]
    stderr: Optional[str]
    wall_s: float
    cpu_s: float
    load_before: List[float]
    load_after: List[float]

    def cost(self, digits: int = 2) -> dict:
        return {"wall_s": round(self.wall_s, digits), "cpu_s": round(self.cpu_s, digits)}


def run_command(argv: List[str], **kwargs) -> Finished:
    """``subprocess.run(argv, **kwargs)`` (``text=True`` unless given), measured.

    Only the children's CPU counts: this process waits meanwhile, and a thread
    of it that watches the command (``WorkerMemory``) is not the command's work.
    """
    kwargs.setdefault("text", True)
    with Timer() as timer:
        done = subprocess.run(argv, **kwargs)
    return Finished(done.returncode, done.stdout, done.stderr, timer.wall_s, timer.children_s,
                    timer.load_before, timer.load_after)


def python_env(**extra) -> dict:
    """This environment with TensorFlow's C++ log quiet and the repository on ``PYTHONPATH``, plus ``extra``."""
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": path, **extra}


# ---------------------------------------------------------------------------
# Peak memory of the processes below this one
# ---------------------------------------------------------------------------


def descendants(root: int) -> List[int]:
    """Every process below ``root`` (from ``/proc``)."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, parent in parents.items() if parent == pid]
        found.extend(children)
        frontier.extend(children)
    return found


class WorkerMemory(threading.Thread):
    """Polls the peak resident size (VmHWM) of every SDK worker process below this one.

    ``markers``: what a process's command line must contain to be watched
    (add ``b"pipeline.build"`` to watch a build launched below this process too).
    """

    def __init__(self, interval: float = 0.2, markers=(b"sdk_worker_main",)):
        super().__init__(daemon=True)
        self.interval = interval
        self.markers = tuple(markers)
        self.peak_kb: Dict[int, int] = {}
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            for pid in descendants(os.getpid()):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read().replace(b"\0", b" ")
                    if not any(m in cmdline for m in self.markers) or cmdline.startswith(b"/bin/sh"):
                        continue
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), int(line.split()[1]))
                except OSError:
                    continue
            self._done.wait(self.interval)

    def stop(self):
        self._done.set()
        self.join()


def peak_rss_mb() -> float:
    """This process's own peak resident size so far, MB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_build(argv, out: str, env=None, markers=(b"sdk_worker_main", b"pipeline.build")) -> dict:
    """``python -m pipeline.build ARGV`` with its log in ``out``: wall and CPU seconds (it and its workers) and
    the peak resident KB of the build's process (``driver_kb``) and of each other watched process (``peak_kb``).
    A failed build ends the benchmark with its last line."""
    from common.console import LOG_DIR_ENV

    memory = WorkerMemory(markers=markers)
    build = {}

    def launch():
        # Popen, not run: the build's pid names its own peak among the watched processes.
        process = subprocess.Popen([sys.executable, "-m", "pipeline.build", *argv], cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", LOG_DIR_ENV: out, **(env or {})})
        build.update(pid=process.pid, stderr=process.communicate()[1], returncode=process.returncode)

    try:
        memory.start()
        with Timer() as timer:
            launch()
    finally:
        memory.stop()
    if build["returncode"] != 0:
        last = build["stderr"].decode(errors="replace").strip().splitlines()[-1:]
        raise SystemExit(f"error: the build failed ({build['returncode']}): {last} (log in {out})")
    driver_kb = memory.peak_kb.pop(build["pid"], 0)
    return {"wall_s": timer.wall_s, "cpu_s": timer.children_s, "driver_kb": driver_kb, "peak_kb": memory.peak_kb}


# ---------------------------------------------------------------------------
# Repeats and medians
# ---------------------------------------------------------------------------


@dataclass
class Timing:
    """Passes of one piece of work: the last pass's result, each pass's wall and CPU seconds, their medians."""

    result: object = None
    walls: List[float] = field(default_factory=list)
    cpus: List[float] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return statistics.median(self.walls)

    @property
    def cpu_s(self) -> float:
        return statistics.median(self.cpus)


def timed(fn: Callable[[], object], repeats: int) -> Timing:
    """``repeats`` passes of ``fn`` in this process; CPU is this process's (``time.process_time``, every thread)."""
    timing = Timing()
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        timing.result = fn()
        timing.walls.append(time.perf_counter() - wall)
        timing.cpus.append(time.process_time() - cpu)
    return timing


def cpu_ms_per_item(fn: Callable[[], object], count: int, repeats: int, warmup: bool = True, wall: bool = False):
    """Median CPU-ms per item of ``repeats`` passes of ``fn`` over ``count`` items, after one untimed pass
    (compiles, fills caches) unless ``warmup`` is false; with ``wall``, (CPU-ms, wall-ms) per item."""
    if warmup:
        fn()
    timing = timed(fn, repeats)
    per_item = 1000 * timing.cpu_s / count
    return (per_item, 1000 * timing.wall_s / count) if wall else per_item


def interleaved(arms: Mapping[str, Callable[[], object]], repeats: int,
                report: Optional[Callable[[str, int, object], None]] = None) -> Dict[str, list]:
    """Each arm ``repeats`` times, in turns (A, B, A, B ...); ``{arm: [result per repeat]}``.

    A run after another is not measured alike on a shared machine: load
    drifts, caches warm. Turns spread the drift over every arm.
    ``report(arm, repeat, result)`` is called after each run.
    """
    results = {name: [] for name in arms}
    for repeat in range(repeats):
        for name, fn in arms.items():
            results[name].append(fn())
            if report is not None:
                report(name, repeat, results[name][-1])
    return results


def medians(runs: Iterable[dict], fields: Iterable[str]) -> dict:
    """The median of each field over the runs."""
    runs = list(runs)
    return {name: statistics.median(run[name] for run in runs) for name in fields}


# ---------------------------------------------------------------------------
# What a build wrote
# ---------------------------------------------------------------------------


def funnel(output: str) -> dict:
    """The committed version's ``stats/funnel.json`` under a build's ``--output``."""
    import json

    from common.corpus_dir import resolve

    with open(os.path.join(resolve(output), "stats", "funnel.json")) as handle:
        return json.load(handle)


def stage_note(found: dict, stage: str) -> str:
    """A funnel's note of ``stage`` ("" when it has none)."""
    return next((entry.get("note", "") for entry in found["stages"] if entry["stage"] == stage), "")


# ---------------------------------------------------------------------------
# The sample, built as the demo builds it
# ---------------------------------------------------------------------------


def sample_build_args(sample: str, output: str, eval_images: bool = True) -> List[str]:
    """``pipeline.build``'s arguments for ``samplegen``'s output ``sample``: the ALIGN preset with the sample's
    overrides (``sample_info.json``: its corpus is tiny) and, with ``eval_images``, its evaluation set."""
    import json

    with open(os.path.join(sample, "sample_info.json")) as handle:
        info = json.load(handle)
    args = ["--input", os.path.join(sample, "candidates", "*.parquet"), "--output", output, "--preset", "align"]
    for override in info.get("build_overrides", []):
        args += ["--set", override]
    if eval_images:
        name, path = info["eval_images"].split("=", 1)
        args += ["--eval_images", f"{name}={os.path.join(sample, path)}"]
    return args


def make_sample(sample: str, num_candidates: int, seed: int = 0) -> None:
    """``python -m samplegen --out SAMPLE --num_candidates N --seed S`` (quietly; a failure raises)."""
    subprocess.run([sys.executable, "-m", "samplegen", "--out", sample, "--num_candidates", str(num_candidates),
                    "--seed", str(seed)], check=True, capture_output=True)
