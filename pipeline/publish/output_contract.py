"""The build's output contract: where it may write, what it owns, what a new build replaces.

- ``--output`` is a literal path. Glob characters in it are characters
  (``escape_glob`` wherever a Beam call would treat them as a pattern).
- The output must not equal, contain or lie inside an input location (the
  directory part of ``--input``, every ``--eval_images`` path).
- A build writes ``MARKER`` (the dataset name) into the output, then
  everything else into its own version directory ``versions/<id>/``
  (``common.corpus_dir``); the version becomes the corpus when the commit
  object (``pipeline.publish.commit``) is written, last. Nothing is copied or
  renamed and nothing is deleted before that commit.
- Without ``--overwrite`` an existing non-empty output is refused, unless
  it holds no corpus yet, only what failed builds left (the marker, their
  uncommitted versions, their downloads): the same command runs again
  there, touching none of it but the downloads it reuses. With it,
  the output must be a corpus of this project (the marker, or for corpora
  built before it, ``COMPLETED`` and ``dataset_info.json``) holding nothing
  but the files a build writes (``owned_by_build``); any other file is
  reported and the build does not start. Once the new version is
  committed, the files of the version it replaced are deleted one by one
  (never a directory tree or a pattern), unless ``--keep_previous``.
- Downloads (``_downloads/``, ``pipeline.download.staging``) are shared by
  the builds of the output: a failed build leaves them to the next, which
  fetches only what they lack. Once a build is committed, the staging files
  of builds that started no later than it are deleted (``consumed_downloads``),
  unless it was asked to keep them.
- There is no lock: concurrent builds write disjoint version directories,
  and of two that started from the same commit only the first commits
  (``pipeline.publish.commit`` compares before it writes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from typing import Iterable, List, Optional

from apache_beam.io.filesystems import FileSystems

from common import state_files as sf
from common.corpus_dir import COMMIT, COMPLETED, MANIFEST, VERSION_ID, VERSIONS
from common.files import escape_glob, is_remote

MARKER = "_ALT_TEXT_CORPUS"
#: What a build asked for (``pipeline.publish`` reads it): written into its version first.
REQUEST = "_BUILD.json"
LOCK = "_BUILD_LOCK"  # left by builds of the lock era: owned, deleted with the corpus it guarded
STAGING = "_staging"  # likewise

#: A dataset name: it becomes the start of every shard file name, and TFDS
#: splits shard names on "-", so letters, digits and underscores only.
DATASET_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,99}$")

_TOP_LEVEL_FILES = {COMPLETED, MARKER, LOCK, COMMIT, "features.json", "vocab.txt"}
_VERSION_FILES = {REQUEST, MANIFEST, COMMIT, "features.json", "vocab.txt"}
_STATS_FILES = re.compile(
    r"^stats/(funnel\.json|distributions\.json|rejected_samples\.jsonl|near_duplicates\.jsonl|report\.html"
    r"|near_duplicates-\d{5,}-of-\d{5,}\.jsonl|read_counts\.json|verdict_counts\.json"
    r"|metrics\.json|_shards\.json|concepts\.json|what_if\.json|rejected/rejected-\d{5,}-of-\d{5,}\.jsonl"
    r"|candidates/_summary\.json|candidates/part-\d{5,}-of-\d{5,}\.parquet|_webdataset\.json|nsfw_gallery\.jsonl)$"
)
_INDEX_FILES = re.compile(r"^near_duplicates/index/(vectors\.npy|rows\.jsonl|centroids\.npy|thumbnails\.jsonl)$")
#: Staging files that builds wrote inside their version before downloads were shared.
_STAGING_FILES = re.compile(r"^downloads/[0-9a-f]{32}\.tfrecord$")
#: The downloads shared by the output's builds (``pipeline.download.staging``): ``<build id>-<32 hex>``.
DOWNLOADS = "_downloads"
_DOWNLOAD_FILES = re.compile(
    rf"^{DOWNLOADS}/(?P<build>\d{{8}}T\d{{6}}Z-[0-9a-f]{{8,32}})-[0-9a-f]{{32}}\.(tfrecord|index\.jsonl)$")


class OutputRefused(Exception):
    """The output cannot be used as asked; nothing was touched."""


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


def _corpus_file(relative: str, name: str) -> bool:
    """A file of one corpus (plain layout, or inside a version), relative to its directory."""
    if re.match(rf"^{re.escape(name)}-(train|validation)\.tfrecord-\d{{5,}}-of-\d{{5,}}$", relative):
        return True
    if re.match(r"^(train|validation)/\d{5,}\.tar$", relative):  # --webdataset's tars (pipeline.write.tar_shards)
        return True
    # The TOnICS class index beside each shard (pipeline.write.concept_tags).
    if re.match(rf"^concepts/{re.escape(name)}-(train|validation)\.tfrecord-\d{{5,}}-of-\d{{5,}}\.json$", relative):
        return True
    return bool(_STATS_FILES.match(relative) or _INDEX_FILES.match(relative) or _STAGING_FILES.match(relative))


def owned_by_build(relative: str, name: str) -> bool:
    """Whether a build of dataset ``name`` writes this file (path relative to the output, '/'-separated)."""
    if relative in _TOP_LEVEL_FILES or relative.startswith(STAGING + "/"):
        return True
    if relative.startswith(".dataset_info.json."):  # a local commit interrupted (pipeline.publish.commit)
        return True
    if _DOWNLOAD_FILES.match(relative):
        return True
    head, _, rest = relative.partition("/")
    if head == VERSIONS:
        version, _, inside = rest.partition("/")
        return bool(VERSION_ID.match(version)) and (inside in _VERSION_FILES or _corpus_file(inside, name))
    return _corpus_file(relative, name)


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
    name = MARKER if MARKER in files else COMMIT if COMPLETED in files and COMMIT in files else None
    if name is None:  # (a corpus built before the marker existed has COMPLETED and its dataset_info.json)
        return None
    path = FileSystems.join(output, name)
    try:
        doc = sf.parse(read_text(path) or "", path, lambda d: sf.text(sf.field(sf.obj(d), "name"), "name"))
    except sf.DamagedFile:
        return None
    return doc["name"]


@dataclasses.dataclass
class OutputPlan:
    """What the output holds before the build: the files of earlier builds (nothing is deleted now)."""

    output: str
    files: List[str]


def plan_output(output: str, overwrite: bool, can_overwrite: bool = True) -> OutputPlan:
    """Decide, touching nothing, whether the build may use ``output``.

    ``can_overwrite``: whether the command has ``--overwrite`` for the refusal to point to.
    """
    if not is_remote(output) and os.path.exists(output) and not os.path.isdir(output):
        raise OutputRefused(f"--output {output} is a file, not a directory")
    files = list_files(output) if (is_remote(output) or os.path.isdir(output)) else []
    if not files:
        return OutputPlan(output, [])
    name = corpus_name(output, files)
    if not overwrite:
        committed = COMMIT in files or COMPLETED in files
        if name is not None and not committed and all(owned_by_build(f, name) for f in files):
            return OutputPlan(output, files)  # only failed builds' remains: nothing to replace
        remedy = "pass --overwrite to replace the corpus in it" if can_overwrite else "choose a new or empty directory"
        raise OutputRefused(f"--output {output} exists and is not empty; {remedy}")
    if name is None:
        raise OutputRefused(
            f"--output {output} is not a corpus built by pipeline.build (no {MARKER}); "
            "--overwrite deletes only a previous build's files, choose an empty directory"
        )
    foreign = [f for f in files if not owned_by_build(f, name)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise OutputRefused(
            f"--output {output} holds files no build wrote ({shown}); move them away, --overwrite replaces only build files"
        )
    return OutputPlan(output, files)


def replaced_files(files: List[str], name: str, replaced: Optional[str]) -> List[str]:
    """The files of the corpus a commit replaced, among ``files`` (relative to the output).

    ``replaced`` is that corpus's version id, or "" for a corpus of the plain
    layout (its files at the top, all but the marker, the commit object and
    ``features.json``, which now belong to the new version).
    """
    if replaced is None:
        return []
    if replaced:
        prefix = f"{VERSIONS}/{replaced}/"
        doomed = [f for f in files if f.startswith(prefix) and owned_by_build(f, name)]
        # The manifest first: a deletion cut short leaves shards without a manifest, never a manifest
        # that lists shards that are gone.
        return sorted(doomed, key=lambda f: f != prefix + MANIFEST)
    return [f for f in files if f not in (MARKER, COMMIT, "features.json")
            and not f.startswith((VERSIONS + "/", DOWNLOADS + "/")) and owned_by_build(f, name)]


def consumed_downloads(files: List[str], version: str) -> List[str]:
    """The staging files (relative to the output) that builds started no later than ``version`` wrote.

    Indexes first: a deletion cut short leaves bodies without an index,
    which no build reads, never an index whose bodies are gone.
    """
    older = [(m.group(2), f) for f in files if (m := _DOWNLOAD_FILES.match(f)) and m.group("build") <= version]
    return sorted(f for kind, f in older if kind != "tfrecord") + sorted(f for kind, f in older if kind == "tfrecord")


def _linked_directory(output: str, relative: str) -> Optional[str]:
    """The first directory on ``relative``'s way down from ``output`` that is a symbolic link, or None."""
    parts = relative.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        candidate = os.path.join(output, *parts[:i])
        if os.path.islink(candidate):
            return candidate
    return None


def delete_files(output: str, relatives: List[str], batch: int = 1000) -> List[str]:
    """Delete exactly these files (never a pattern or a tree), in batches on GCS.

    Locally, a file reached through a directory that is a symbolic link is
    not deleted (it lives elsewhere): the link itself is removed instead.
    Returns those links.
    """
    paths = [FileSystems.join(output, relative) for relative in relatives]
    if not is_remote(output):
        links = set()
        for relative, path in zip(relatives, paths):
            link = _linked_directory(output, relative)
            if link is not None:
                links.add(link)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        for link in sorted(links):
            os.unlink(link)
        for root, dirs, _ in sorted(os.walk(output, topdown=False), reverse=True):  # emptied directories
            for d in dirs:
                path = os.path.join(root, d)
                if not os.path.islink(path) and not os.listdir(path):
                    os.rmdir(path)
        return sorted(links)
    for start in range(0, len(paths), batch):
        FileSystems.delete([escape_glob(path) for path in paths[start:start + batch]])
    return []


def new_version_id(run_id: str) -> str:
    """A version id: the build's start (UTC, so ids sort by it) and its run id."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + run_id


def write_marker(output: str, name: str) -> None:
    _write_text(FileSystems.join(output, MARKER), json.dumps({"built_by": "pipeline.build", "name": name}) + "\n")
