"""A quiet console for the command-line tools: people read the terminal, libraries write to a log file.

TensorFlow, XLA and absl write from C++ straight to file descriptor 2 (CUDA
probing, oneDNN notices), before and regardless of Python's logging, so
silencing Python loggers is not enough. ``route_library_output`` points
descriptor 2 at a log file (worker subprocesses inherit it), sends Python
logging and warnings there too, and gives Python's ``sys.stderr`` a copy of
the original terminal, so the tool's own one-line errors still reach the
person. Call it from a ``main()`` only, never from library code or tests.

The log directory is ``$ALT_TEXT_CORPUS_LOG_DIR`` (``scripts/demo.sh`` sets
``out/logs``), else ``<tmp>/alt_text_corpus_logs``; one file per tool.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import Optional

LOG_DIR_ENV = "ALT_TEXT_CORPUS_LOG_DIR"


def log_path(tool: str) -> str:
    directory = os.environ.get(LOG_DIR_ENV) or os.path.join(tempfile.gettempdir(), "alt_text_corpus_logs")
    return os.path.join(directory, f"{tool}.log")


def route_library_output(tool: str, path: Optional[str] = None, level: int = logging.INFO) -> str:
    """Send descriptor 2, Python logging and warnings to ``path`` (default ``log_path(tool)``); returns it."""
    path = path or log_path(tool)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    log = open(path, "a", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(log.fileno(), 2)
    sys.stderr = terminal
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    return path


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
