"""Which directory holds a corpus, and whether its build finished.

A build writes into its own version directory, ``<output>/versions/<id>/``,
and commits it by writing one object last: ``<output>/dataset_info.json``,
whose shard paths (``filepathTemplate``) name that version. So
``tfds.builder_from_directory(output)`` reads the committed version, and
every reader of this project reads it through ``resolve``: the directory
of the committed version (its shards, ``stats/``, ``concepts/``,
``vocab.txt``). A version that was never committed (a build killed or
failed before its commit) is invisible unless asked for.

Corpora of the plain layout (shards beside ``dataset_info.json``, complete
when ``COMPLETED`` exists) and a version directory given directly
(complete when its ``manifest.json`` exists) are read as they are.
Training on or auditing half a corpus looks exactly like using a whole
one, so an uncommitted corpus is refused unless ``allow_incomplete``.

A file of a complete corpus can still be damaged later (a truncated copy, a
bad disk): the tools then stop with ``DamagedFile``, one line naming it.
"""

from __future__ import annotations

import re
from typing import List, Optional, Union

from common.state_files import DamagedFile, parse  # noqa: F401  (DamagedFile: the corpus readers' name for it)

COMPLETED = "COMPLETED"
COMMIT = "dataset_info.json"
MANIFEST = "manifest.json"
VERSIONS = "versions"
#: A version's list of its shards and their lengths, written by the job's second pass, read by the publication.
SHARDS_FILE = "stats/_shards.json"
#: Likewise for ``--webdataset``'s tars.
TARS_FILE = "stats/_webdataset.json"
#: A version's id: when its build started (UTC), then the run's id; ids sort by start time.
VERSION_ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{8,32}$")
_TEMPLATE_VERSION = re.compile(rf"^{VERSIONS}/(?P<version>[^/]+)/[^/]+$")


class IncompleteCorpus(Exception):
    """The directory holds no committed (or completed) corpus."""


def _fs():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def _join(directory: str, *parts: str) -> str:
    return _fs().join(directory.rstrip("/") or "/", *parts)


def _read_json(path: str) -> Optional[dict]:
    try:
        with _fs().open(path) as handle:
            return parse(handle.read(), path)
    except Exception:  # absent, unreadable or not JSON: the caller says what that means
        return None


def committed_version(info) -> Optional[str]:
    """The version a top-level ``dataset_info.json`` commits, or None for the plain layout (or a damaged one)."""
    splits = info.get("splits") if isinstance(info, dict) else None
    if not isinstance(splits, list):
        return None
    found = {m["version"] for split in splits
             if isinstance(split, dict) and isinstance(split.get("filepathTemplate"), str)
             and (m := _TEMPLATE_VERSION.match(split["filepathTemplate"]))}
    return found.pop() if len(found) == 1 else None


def version_dir(output: str, version: str) -> str:
    return _join(output, VERSIONS, version)


def list_versions(output: str) -> List[str]:
    """The version ids under ``<output>/versions/``, oldest first (one listing)."""
    from apache_beam.io.filesystems import FileSystems

    base = _join(output, VERSIONS) + "/"
    pattern = re.sub(r"([*?\[])", r"[\1]", base) + "*/*"
    found = set()
    try:
        for match in FileSystems.match([pattern])[0].metadata_list:
            relative = match.path[len(base):] if match.path.startswith(base) else ""
            version = relative.split("/", 1)[0]
            if VERSION_ID.match(version):
                found.add(version)
    except Exception:  # no such directory
        return []
    return sorted(found)


def resolve(data_dir: str, allow_incomplete: bool = False, flag: Optional[str] = "--allow_incomplete") -> str:
    """The directory to read the corpus in ``data_dir`` from; ``IncompleteCorpus`` (one line) if there is none.

    ``data_dir`` may be a build's output (the committed version is read), a
    version directory, or a corpus of the plain layout. With
    ``allow_incomplete`` an output with no commit yields its newest version.
    The refusal names ``flag`` as the way to read it anyway; ``None`` for a
    command that has no such way.
    """
    data_dir = data_dir.rstrip("/") or "/"
    commit = _join(data_dir, COMMIT)
    info = _read_json(commit)
    version = committed_version(info)
    if version is not None:
        return version_dir(data_dir, version)
    fs = _fs()
    if fs.exists(_join(data_dir, COMPLETED)):
        return data_dir  # the plain layout, complete
    if fs.exists(_join(data_dir, MANIFEST)):
        return data_dir  # a version directory whose build finished
    versions = list_versions(data_dir)
    if allow_incomplete:
        return version_dir(data_dir, versions[-1]) if versions else data_dir
    if versions:
        why = (f"its {COMMIT} is damaged (not the JSON a publication writes)" if info is None and fs.exists(commit)
               else "its build did not commit (killed, failed, or its job is still running)")
        anyway = f"; or pass {flag} to read its newest version anyway" if flag else ""
        raise IncompleteCorpus(
            f"{data_dir} has no committed corpus: {why}; if the job finished, run 'python -m pipeline.publish {data_dir}'"
            f"{anyway}")
    anyway = f", or pass {flag} to use it anyway" if flag else ""
    raise IncompleteCorpus(
        f"{data_dir} has no {COMPLETED}: the build that wrote it did not finish (killed or failed); rebuild it{anyway}")


def read_dir(data_dir: str) -> str:
    """The directory a reader opens (``resolve`` without refusing): the entry points decided on completeness."""
    return resolve(data_dir, allow_incomplete=True)


def parse_json(data: Union[bytes, str], path: str, remedy: str = "rebuild the corpus"):
    """``data`` parsed within ``common.state_files``' bounds, or ``DamagedFile`` naming ``path``."""
    return parse(data, path, remedy=remedy)


def is_completed(data_dir: str) -> bool:
    try:
        resolve(data_dir)
    except IncompleteCorpus:
        return False
    return True


def require_completed(data_dir: str, allow_incomplete: bool = False, flag: str = "--allow_incomplete") -> str:
    """The corpus directory to read (``resolve``); raises ``IncompleteCorpus`` naming ``flag`` if it is not complete."""
    return resolve(data_dir, allow_incomplete, flag)
