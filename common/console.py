"""A quiet console for the command-line tools: people read the terminal, libraries write to a log file.

TensorFlow, XLA and absl write from C++ straight to file descriptor 2 (CUDA
probing, oneDNN notices), before and regardless of Python's logging, so
silencing Python loggers is not enough. ``route_library_output`` points
descriptor 2 at a log file (worker subprocesses inherit it), sends Python
logging and warnings there too, and gives Python's ``sys.stderr`` a copy of
the original terminal, so the tool's own one-line errors still reach the
person. Call it from a ``main()`` only, never from library code or tests.
``library_output_to_log`` does the same for the duration of a block, and can
send descriptor 1 there too (the trainer: XLA and gloo write to both).

The log directory is ``$ALT_TEXT_CORPUS_LOG_DIR`` (``scripts/demo.sh`` sets
``out/logs``), else ``<tmp>/alt_text_corpus_logs``; one file per tool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from typing import Iterator, Optional, TextIO

LOG_DIR_ENV = "ALT_TEXT_CORPUS_LOG_DIR"


def log_path(tool: str) -> str:
    directory = os.environ.get(LOG_DIR_ENV) or os.path.join(tempfile.gettempdir(), "alt_text_corpus_logs")
    return os.path.join(directory, f"{tool}.log")


def route_library_output(tool: str, path: Optional[str] = None, level: int = logging.INFO) -> str:
    """Send descriptor 2, Python logging and warnings to ``path`` (default ``log_path(tool)``); returns it.

    For the rest of the process: a command's ``main`` calls it once.
    """
    path = path or log_path(tool)
    _route(path, stdout=False, level=level)
    return path


@contextlib.contextmanager
def library_output_to_log(path: str, *, stdout: bool = False, level: int = logging.INFO) -> Iterator[TextIO]:
    """``route_library_output`` for the duration of a block; yields the terminal's stdout.

    With ``stdout``, descriptor 1 goes to the log as well (libraries that
    print, C++ code writing to stdout): the command then prints its own
    progress to the yielded stream. Everything is put back on exit, so a
    command can be run more than once in one process (tests, drivers).
    """
    terminal_out, restore = _route(path, stdout=stdout, level=level)
    try:
        yield terminal_out
    finally:
        restore()


def _route(path: str, *, stdout: bool, level: int):
    """Points the descriptors and Python logging at ``path``; returns (terminal stdout, undo)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    log = open(path, "a", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    descriptors = (1, 2) if stdout else (2,)
    saved = {fd: os.dup(fd) for fd in descriptors}
    terminal_err = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    terminal_out = (os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
                    if stdout else sys.stdout)
    for fd in descriptors:
        os.dup2(log.fileno(), fd)
    previous_stderr, sys.stderr = sys.stderr, terminal_err
    root = logging.getLogger()
    previous_handlers, previous_level = list(root.handlers), root.level
    for handler in previous_handlers:
        root.removeHandler(handler)
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)

    def restore():
        logging.captureWarnings(False)
        root.removeHandler(handler)
        for previous in previous_handlers:
            root.addHandler(previous)
        root.setLevel(previous_level)
        sys.stdout.flush()
        sys.stderr = previous_stderr
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        terminal_err.close()
        if terminal_out is not sys.stdout:
            terminal_out.close()
        log.close()

    return terminal_out, restore


def error(message: str) -> None:
    """One line for the person at the terminal."""
    print(f"error: {message}", file=sys.stderr)


def failure(error_: BaseException, action: str, log: str, expected=()) -> int:
    """A command's failure as one line (the traceback goes to the log); returns exit status 1.

    ``expected`` are the exception types whose message is the whole story (a
    missing file, malformed input): their first line is printed as it is;
    anything else also names its type and where the details are.
    """
    logging.getLogger(__name__).error("%s failed", action, exc_info=error_)
    first = (str(error_).splitlines() or [""])[0]
    if isinstance(error_, tuple(expected)):
        error(first)
    else:
        error(f"{type(error_).__name__}: {first} (details: {log})")
    return 1
