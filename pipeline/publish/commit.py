"""The commit object: ``<output>/dataset_info.json``, written last, in one write, if nobody else committed.

A build is visible once this one object names its version (``common.corpus_dir``).
Writing it is a compare-and-swap against what the build saw when it started:

- on ``gs://``, an upload with ``if_generation_match`` (0: "only if it does
  not exist"), through the storage client Beam itself uses (its credentials,
  ``STORAGE_EMULATOR_HOST``); GCS replaces an object atomically, so a reader
  gets the old bytes or the new ones, never a mix;
- on local files, under ``flock`` on the output directory, the current
  bytes are compared and the new ones land by ``os.replace`` from a
  temporary file in the same directory.

A concurrent build whose commit would replace a version it never saw gets
``CommitConflict`` instead, and its own version stays intact for
``python -m pipeline.publish --replace``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import tempfile
from typing import Optional

from common.corpus_dir import COMMIT

#: A local commit in progress writes here first; a crash leaves it behind, harmless.
TEMPORARY_PREFIX = ".dataset_info.json."


class CommitConflict(Exception):
    """Another build committed since this one started; nothing was written."""


@dataclasses.dataclass(frozen=True)
class Committed:
    """The commit object as read: its bytes (None if absent) and the token a later commit compares against."""

    data: Optional[bytes]
    token: str  # GCS generation, or sha256 of the local bytes; "0" when absent


def _split_gcs(path: str):
    from apache_beam.io.gcp.gcsio import parse_gcs_path

    return parse_gcs_path(path)


def _gcs_client():
    from apache_beam.io.gcp.gcsio import GcsIO

    return GcsIO().client


def _token(data: Optional[bytes]) -> str:
    return "0" if data is None else hashlib.sha256(data).hexdigest()


def read(output: str) -> Committed:
    """The commit object of ``output`` now."""
    path = os.path.join(output, COMMIT) if "://" not in output else output.rstrip("/") + "/" + COMMIT
    if path.startswith("gs://"):
        from google.api_core import exceptions

        bucket, name = _split_gcs(path)
        blob = _gcs_client().bucket(bucket).get_blob(name)
        if blob is None:
            return Committed(None, "0")
        generation = blob.generation  # before the download, which may reset it from the response's headers
        try:  # the bytes of exactly the generation whose number we keep
            return Committed(blob.download_as_bytes(if_generation_match=generation), str(generation))
        except exceptions.PreconditionFailed:
            return read(output)  # replaced between the two requests: read again
    if "://" in path:
        raise ValueError(f"{output}: commits are supported on local files and gs:// only")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return Committed(None, "0")
    return Committed(data, _token(data))


def write(output: str, data: bytes, expected: str) -> None:
    """Replace the commit object of ``output`` by ``data`` if it is still ``expected`` (a ``Committed.token``)."""
    if output.startswith("gs://"):
        _write_gcs(output.rstrip("/") + "/" + COMMIT, data, expected)
    else:
        _write_local(output, data, expected)


def _write_gcs(path: str, data: bytes, expected: str) -> None:
    from google.api_core import exceptions

    bucket_name, name = _split_gcs(path)
    bucket = _gcs_client().bucket(bucket_name)
    current = bucket.get_blob(name)
    # Checked before the write so that a conflict is reported even by a store
    # that ignores preconditions; the precondition closes the remaining race.
    if str(current.generation if current is not None else 0) != expected:
        raise CommitConflict(_conflict(path))
    try:
        bucket.blob(name).upload_from_string(data, content_type="application/json",
                                             if_generation_match=int(expected))
    except exceptions.PreconditionFailed:
        # A retried upload whose first attempt landed fails its precondition
        # too: that is our own commit, not a conflict.
        latest = bucket.get_blob(name)
        if latest is None or latest.download_as_bytes() != data:
            raise CommitConflict(_conflict(path)) from None


def _write_local(output: str, data: bytes, expected: str) -> None:
    import fcntl

    path = os.path.join(output, COMMIT)
    directory = os.open(output, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)  # released when the descriptor closes, also on a crash
        if read(output).token != expected:
            raise CommitConflict(_conflict(path))
        handle, temporary = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, dir=output)
        try:
            # mkstemp makes it 0600; the commit is read by whoever may read the other files (the umask's mode).
            os.fchmod(handle, 0o666 & ~_umask())
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
            raise
        os.fsync(directory)
    finally:
        os.close(directory)


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask sets it: put it back at once
    os.umask(mask)
    return mask


def _conflict(path: str) -> str:
    return f"{path} changed since this build started: another build committed its version first"
