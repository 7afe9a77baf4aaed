"""The build's output contract: where it may write, what ``--overwrite`` deletes, the lock.

- ``--output`` is a literal path. Glob characters in it are characters
  (``escape_glob`` wherever a Beam call would treat them as a pattern).
- The output must not equal, contain or lie inside an input location (the
  directory part of ``--input``, every ``--eval-images`` path).
- A build starts by writing ``MARKER`` (the dataset name); a directory is a
  corpus of this project only if it holds the marker (or, for corpora built
  before the marker existed, ``COMPLETED`` and ``dataset_info.json``).
- Without ``--overwrite`` an existing non-empty output is refused. With it,
  the output must be such a corpus holding nothing but the files a build
  writes (``owned_by_build``: its shards, metadata, ``stats/``, ``concepts/``,
  ``near_duplicates/``, the vocabulary, leftovers of a killed run); those
  files, one by one, are deleted, never a directory tree or a pattern. Any
  other file is reported and nothing is deleted.
- ``LOCK`` is created if absent with the run's id and read back (create-if-
  absent works on ``gs://`` too, where there is no O_EXCL); a second build
  into the same output fails fast while it is there. It is removed after
  ``COMPLETED``, which is written last.
- The job writes shards and stats under ``STAGING`` and they are moved to
  their final names only once the job has succeeded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import time
from typing import Iterable, List, Optional

from apache_beam.io.filesystems import FileSystems

COMPLETED = "COMPLETED"
MARKER = "_ALT_TEXT_CORPUS"
LOCK = "_BUILD_LOCK"
STAGING = "_staging"

#: A dataset name: it becomes the start of every shard file name, and TFDS
#: splits shard names on "-", so letters, digits and underscores only.
DATASET_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,99}$")

_TOP_LEVEL_FILES = {COMPLETED, MARKER, "dataset_info.json", "features.json", "vocab.txt"}
_STATS_FILES = re.compile(
    r"^stats/(funnel\.json|distributions\.json|rejected_samples\.jsonl|near_duplicates\.jsonl|report\.html"
    r"|near_duplicates-\d{5}-of-\d{5}\.jsonl"
    r"|metrics\.json|_shards\.json|concepts\.json|rejected/rejected-\d{5}-of-\d{5}\.jsonl)$"
)
_INDEX_FILES = re.compile(r"^near_duplicates/index/(vectors\.npy|rows\.jsonl|centroids\.npy|thumbnails\.jsonl)$")
#: The download's staging files (``pipeline.download.staging``).
_STAGING_FILES = re.compile(r"^downloads/[0-9a-f]{32}\.tfrecord$")


class OutputRefused(Exception):
    """The output cannot be used as asked; nothing was touched."""


class OutputLocked(Exception):
    """Another build holds the output's lock."""


def is_remote(path: str) -> bool:
    return "://" in path


def escape_glob(path: str) -> str:
    """``path`` as a Beam match pattern that matches only itself (``*`` -> ``[*]``)."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def _normal(path: str) -> str:
    if is_remote(path):
        return path.rstrip("/")
    return os.path.realpath(os.path.abspath(path))


def _contains(outer: str, inner: str) -> bool:
    outer, inner = _normal(outer), _normal(inner)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def input_location(pattern: str) -> str:
    """The directory an input pattern reads from: its part before the first glob character."""
    head = re.match(r"^[^*?\[]*", pattern).group(0)
    if head == pattern:
        return pattern  # a literal file or directory
    return head.rsplit("/", 1)[0] if "/" in head else "."


def check_location(output: str, inputs: Iterable[str]) -> None:
    """Refuse an output equal to, containing, or inside an input location."""
    for location in inputs:
        if _contains(output, location) or _contains(location, output):
            relation = "is" if _normal(output) == _normal(location) else (
                "contains" if _contains(output, location) else "is inside")
            raise OutputRefused(f"--output {output} {relation} the input location {location}; choose another directory")


def valid_dataset_name(name: str) -> Optional[str]:
    """None if ``name`` is a plain dataset name, else why not."""
    if DATASET_NAME.match(name or ""):
        return None
    return f"--name {name!r} is not a plain dataset name (letters, digits and '_', starting with a letter)"


def owned_by_build(relative: str, name: str) -> bool:
    """Whether a build of dataset ``name`` writes this file (path relative to the output, '/'-separated)."""
    if relative in _TOP_LEVEL_FILES:
        return True
    if re.match(rf"^{re.escape(name)}-(train|validation)\.tfrecord-\d{{5}}-of-\d{{5}}$", relative):
        return True
    # The TOnICS class index beside each shard (pipeline.concepts).
    if re.match(rf"^concepts/{re.escape(name)}-(train|validation)\.tfrecord-\d{{5}}-of-\d{{5}}\.json$", relative):
        return True
    if relative.startswith(STAGING + "/"):
        return True
    return bool(_STATS_FILES.match(relative) or _INDEX_FILES.match(relative) or _STAGING_FILES.match(relative))


def list_files(directory: str) -> List[str]:
    """Every file under ``directory``, relative, '/'-separated; the path is taken literally."""
    if not is_remote(directory):
        found = []
        for root, _, files in os.walk(directory):
            for file_name in files:
                found.append(os.path.relpath(os.path.join(root, file_name), directory).replace(os.sep, "/"))
        return sorted(found)
    base = directory.rstrip("/") + "/"
    (result,) = FileSystems.match([escape_glob(base) + "**"])
    return sorted(m.path[len(base):] for m in result.metadata_list if m.path.startswith(base) and not m.path.endswith("/"))


def read_text(path: str) -> Optional[str]:
    try:
        with FileSystems.open(path) as handle:
            return handle.read().decode("utf-8")
    except Exception:
        return None


def _write_text(path: str, text: str) -> None:
    with FileSystems.create(path) as handle:
        handle.write(text.encode("utf-8"))


def corpus_name(output: str, files: List[str]) -> Optional[str]:
    """The dataset name of the corpus in ``output``, or None if it is not one this project built."""
    if MARKER in files:
        try:
            return json.loads(read_text(FileSystems.join(output, MARKER)) or "")["name"]
        except (ValueError, KeyError, TypeError):
            return None
    if COMPLETED in files and "dataset_info.json" in files:  # built before the marker existed
        try:
            return json.loads(read_text(FileSystems.join(output, "dataset_info.json")) or "")["name"]
        except (ValueError, KeyError, TypeError):
            return None
    return None


@dataclasses.dataclass
class OutputPlan:
    """What preparing the output will do: the files of an earlier build to delete."""

    output: str
    to_delete: List[str]


def plan_output(output: str, overwrite: bool) -> OutputPlan:
    """Decide, touching nothing, whether the build may use ``output`` and what it must delete."""
    if not is_remote(output) and os.path.exists(output) and not os.path.isdir(output):
        raise OutputRefused(f"--output {output} is a file, not a directory")
    files = list_files(output) if (is_remote(output) or os.path.isdir(output)) else []
    if not files:
        return OutputPlan(output, [])
    if not overwrite:
        raise OutputRefused(f"--output {output} exists and is not empty; pass --overwrite to replace the corpus in it")
    name = corpus_name(output, files)
    if name is None:
        raise OutputRefused(
            f"--output {output} is not a corpus built by pipeline.build (no {MARKER}); "
            "--overwrite deletes only a previous build's files, choose an empty directory"
        )
    foreign = [f for f in files if f != LOCK and not owned_by_build(f, name)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise OutputRefused(
            f"--output {output} holds files no build wrote ({shown}); move them away, --overwrite deletes only build files"
        )
    return OutputPlan(output, [f for f in files if f != LOCK])


def delete_file(path: str) -> None:
    """Delete exactly one file, never a pattern or a directory tree."""
    if not is_remote(path):
        os.remove(path)
        return
    FileSystems.delete([escape_glob(path)])


def delete_planned(plan: OutputPlan) -> None:
    for relative in plan.to_delete:
        delete_file(FileSystems.join(plan.output, relative))
    if not is_remote(plan.output):  # empty directories the deleted files leave behind
        for root, dirs, _ in sorted(os.walk(plan.output, topdown=False), reverse=True):
            for d in dirs:
                path = os.path.join(root, d)
                if not os.listdir(path):
                    os.rmdir(path)


def write_marker(output: str, name: str) -> None:
    _write_text(FileSystems.join(output, MARKER), json.dumps({"built_by": "pipeline.build", "name": name}) + "\n")


class Lock:
    """The output's lock: a file created if absent, holding the run's id."""

    def __init__(self, output: str, run_id: str):
        self.path = FileSystems.join(output, LOCK)
        self.run_id = run_id
        self.held = False

    def describe(self, text: Optional[str]) -> str:
        try:
            holder = json.loads(text or "")
            return f"run {holder['run_id']} on {holder['host']} (pid {holder['pid']}), started {holder['started']}"
        except (ValueError, KeyError, TypeError):
            return "an unknown run"

    def acquire(self) -> None:
        body = json.dumps({"run_id": self.run_id, "host": socket.gethostname(), "pid": os.getpid(),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        if not is_remote(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._drop_if_stale()
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                raise OutputLocked(self._locked_message()) from None
            with os.fdopen(fd, "w") as handle:
                handle.write(body)
        else:
            if FileSystems.exists(self.path):
                raise OutputLocked(self._locked_message())
            _write_text(self.path, body)
            time.sleep(1.0)  # let a racing writer's object land, then see who won
        self.held = True
        self.check()

    def ensure_free(self) -> None:
        """Fail fast, before any slow work, if another build holds the lock (``acquire`` decides)."""
        if not is_remote(self.path):
            self._drop_if_stale()
        if FileSystems.exists(self.path):
            raise OutputLocked(self._locked_message())

    def _drop_if_stale(self) -> None:
        """A lock left by a killed build on this machine (its process is gone) is removed."""
        try:
            holder = json.loads(read_text(self.path) or "")
            if holder["host"] != socket.gethostname():
                return
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            os.remove(self.path)
        except (OSError, ValueError, KeyError, TypeError):
            return

    def _locked_message(self) -> str:
        return (
            f"another build is writing {os.path.dirname(self.path) or '.'}: {self.describe(read_text(self.path))}. "
            f"If no build is running, delete {self.path}"
        )

    def check(self) -> None:
        """Raise ``OutputLocked`` unless the lock still holds this run's id."""
        try:
            holder = json.loads(read_text(self.path) or "")["run_id"]
        except (ValueError, KeyError, TypeError):
            holder = None
        if holder != self.run_id:
            self.held = False
            raise OutputLocked(self._locked_message())

    def release(self) -> None:
        if self.held:
            delete_file(self.path)
            self.held = False


def staging_dir(output: str, run_id: str) -> str:
    return FileSystems.join(output, STAGING, run_id)


def publish(staging: str, output: str) -> List[str]:
    """Move every file the job wrote under ``staging`` to its final name in ``output``."""
    moved = list_files(staging)
    sources = [FileSystems.join(staging, relative) for relative in moved]
    targets = [FileSystems.join(output, relative) for relative in moved]
    if is_remote(output):
        # One call: GCS batches the copies and deletes (10^5 shards at 1B rows).
        if sources:
            FileSystems.rename(sources, targets)
    else:
        for source, target in zip(sources, targets):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(source, target)
    if not is_remote(staging):
        for root, _, _ in sorted(os.walk(FileSystems.join(output, STAGING), topdown=False), reverse=True):
            if not os.listdir(root):
                os.rmdir(root)
    return moved
