"""A local build's progress on the terminal: the pass, files and records done, the rate and an ETA.

Beam's local runners hand out their counters only when the job has ended,
so the workers tell the launcher themselves: a local run sets
``$ALT_TEXT_CORPUS_PROGRESS_DIR`` (worker processes inherit it), each
worker process appends small JSON lines of what it has done since its last
line to a file of its own there (``tally``: at most one line every half
second, and one when a file ends), and the launcher's ``ProgressBoard``
sums the files in a thread and prints a line at most every
``--progress_seconds``. On Dataflow the variable is unset and ``tally``
does nothing: its console shows the job's progress.

The first pass's total is estimated from the input's bytes (what the files
that have ended held per byte, times every input file's size); the second
pass's is what the first pass kept, an upper bound (the corpus stages reject
more).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Callable, Dict, Iterable, Optional

PROGRESS_DIR_ENV = "ALT_TEXT_CORPUS_PROGRESS_DIR"
#: The passes, in the order they run, with what the console calls them.
PASSES = {"judge": "pass 1, reading and judging", "write": "pass 2, writing"}
#: A worker writes what it did at most this often (seconds), and whenever a file ends.
FLUSH_SECONDS = 0.5
#: A rate is shown once a stage has counted for this long.
MIN_RATE_SECONDS = 1.0

_lock = threading.Lock()
_pending: Dict[str, dict] = {}
_last_flush = [0.0]


def tally(stage: str, records: int = 0, kept: int = 0, file: Optional[str] = None, file_records: int = 0) -> None:
    """Worker side: ``records`` more done in ``stage`` (``kept`` of them went on); ``file`` when one ended,
    with the ``file_records`` it held.

    Nothing without ``$ALT_TEXT_CORPUS_PROGRESS_DIR`` (Dataflow, tests that run a graph by hand).
    """
    directory = os.environ.get(PROGRESS_DIR_ENV)
    if not directory:
        return
    with _lock:
        entry = _pending.setdefault(stage, {"records": 0, "kept": 0, "files": []})
        entry["records"] += records
        entry["kept"] += kept
        if file is not None:
            entry["files"].append([file, file_records])
        now = time.monotonic()
        if file is None and now - _last_flush[0] < FLUSH_SECONDS:
            return
        _last_flush[0] = now
        lines = [json.dumps({"stage": name, **counts}) for name, counts in _pending.items()]
        _pending.clear()
    try:
        with open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    except OSError:  # the launcher has gone (or removed its directory): progress is not worth failing the job
        pass


class Totals:
    """What the workers' lines add up to, per stage."""

    def __init__(self):
        self.records: Dict[str, int] = {}
        self.kept: Dict[str, int] = {}
        self.files: Dict[str, Dict[str, int]] = {}  # per stage: the files that ended and their records
        self.started: Dict[str, float] = {}
        self.updated: Dict[str, float] = {}  # when the stage's count last grew: its rate stops there
        self.first: Dict[str, int] = {}  # the records of its first line, done before it was seen

    def add(self, line: dict, now: float) -> None:
        stage = line.get("stage")
        if stage not in PASSES:
            return
        records = int(line.get("records", 0))
        if stage not in self.started:
            self.started[stage], self.first[stage] = now, records
        self.records[stage] = self.records.get(stage, 0) + records
        if records:
            self.updated[stage] = now
        self.kept[stage] = self.kept.get(stage, 0) + int(line.get("kept", 0))
        ended = self.files.setdefault(stage, {})
        for path, records in line.get("files", ()):
            ended[path] = ended.get(path, 0) + int(records)


def _size(path: str) -> Optional[int]:
    try:
        return os.path.getsize(path) if "://" not in path else None
    except OSError:
        return None


def _records(count: int) -> str:
    return f"{count:,} record" + ("" if count == 1 else "s")


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def progress_line(totals: Totals, input_sizes: Dict[str, Optional[int]], now: float) -> Optional[str]:
    """The line for the pass running now (the latest that has begun), or None before the first record."""
    running = [stage for stage in PASSES if stage in totals.started]
    if not running:
        return None
    stage = running[-1]
    done = totals.records.get(stage, 0)
    elapsed = totals.updated.get(stage, totals.started[stage]) - totals.started[stage]
    rate = (done - totals.first[stage]) / elapsed if elapsed >= MIN_RATE_SECONDS else None
    if stage == "judge":
        ended = totals.files.get(stage, {})
        total = _estimated_records(done, input_sizes, ended)
        fields = [f"{len(ended):,} of {len(input_sizes):,} files",
                  _records(done) + (f" of ~{total:,}" if total else "")]
    else:
        total = totals.kept.get("judge") or None
        fields = [_records(done) + (f" of at most {total:,} kept" if total else "")]
    if rate:
        fields.append(f"{rate:,.0f} records/s")
        if total and total > done:
            fields.append(f"ETA {format_duration((total - done) / rate)}")
    if stage == "judge" and len(totals.files.get(stage, {})) == len(input_sizes):
        fields.append(f"done in {format_duration(elapsed)}")
    return f"{PASSES[stage]}: " + ", ".join(fields)


def _estimated_records(done: int, input_sizes: Dict[str, Optional[int]], ended: Dict[str, int]) -> Optional[int]:
    """Records in the whole input: what the files that ended held per byte, times every file's size.

    None before a file ended, or where a size is unknown (a remote input: the files count instead).
    """
    if len(ended) >= len(input_sizes):
        return done
    ended_bytes = sum(input_sizes.get(path) or 0 for path in ended)
    if not ended_bytes or any(size is None for size in input_sizes.values()):
        return None
    estimate = int(round(sum(ended.values()) / ended_bytes * sum(input_sizes.values())))
    return max(done, estimate)


class ProgressBoard:
    """Launcher side: a thread that prints the workers' progress at most every ``seconds`` (0: never).

    ``with ProgressBoard(input_files, say, seconds):`` around a local job's run.
    """

    def __init__(self, input_files: Iterable[str], say: Callable[[str], None], seconds: float,
                 poll_seconds: float = 0.25):
        self.input_sizes = {path: _size(path) for path in input_files}
        self.say = say
        self.seconds = seconds
        self.poll_seconds = min(poll_seconds, seconds) if seconds > 0 else poll_seconds
        self.totals = Totals()
        self.offsets: Dict[str, int] = {}
        self.directory: Optional[str] = None
        self.previous_env: Optional[str] = None
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def __enter__(self) -> "ProgressBoard":
        if self.seconds <= 0:
            return self
        self.directory = tempfile.mkdtemp(prefix="alt_text_corpus_progress_")
        self.previous_env = os.environ.get(PROGRESS_DIR_ENV)
        os.environ[PROGRESS_DIR_ENV] = self.directory
        self.thread = threading.Thread(target=self._watch, name="build-progress", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.thread is None:
            return
        self.stop.set()
        self.thread.join()
        if self.previous_env is None:
            os.environ.pop(PROGRESS_DIR_ENV, None)
        else:
            os.environ[PROGRESS_DIR_ENV] = self.previous_env
        shutil.rmtree(self.directory, ignore_errors=True)

    def read(self, now: float) -> None:
        """Adds the workers' new whole lines (a line being written is read next time)."""
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for raw in data[:end].splitlines():
                try:
                    self.totals.add(json.loads(raw), now)
                except (ValueError, TypeError):
                    continue

    def _watch(self) -> None:
        last_line, last_said = None, 0.0
        while not self.stop.wait(self.poll_seconds):
            now = time.monotonic()
            try:
                self.read(now)
            except OSError:
                continue
            line = progress_line(self.totals, self.input_sizes, now)
            if line and line != last_line and now - last_said >= self.seconds:
                self.say(line)
                logging.getLogger(__name__).info(line)
                last_line, last_said = line, now
