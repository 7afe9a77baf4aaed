"""Whether a corpus directory is complete: the build writes ``COMPLETED`` last.

A build that was killed or failed leaves shards (and perhaps stats) but no
``COMPLETED``; the trainer, ``trainer.vocab`` and ``pipeline.audit`` refuse
such a directory unless told otherwise (``allow_incomplete``), because
training on or auditing half a corpus looks exactly like using a whole one.
"""

from __future__ import annotations

COMPLETED = "COMPLETED"


class IncompleteCorpus(Exception):
    """The directory holds no ``COMPLETED`` marker."""


def is_completed(data_dir: str) -> bool:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.exists(FileSystems.join(data_dir, COMPLETED))


def require_completed(data_dir: str, allow_incomplete: bool = False, flag: str = "--allow_incomplete") -> None:
    """Raise ``IncompleteCorpus`` (a one-line message naming ``flag``) unless ``data_dir`` is complete."""
    if allow_incomplete or is_completed(data_dir):
        return
    raise IncompleteCorpus(
        f"{data_dir} has no {COMPLETED}: the build that wrote it did not finish (killed or failed); "
        f"rebuild it, or pass {flag} to use it anyway"
    )
