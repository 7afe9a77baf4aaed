"""Whether a corpus directory can be used: complete, and its files whole.

A build that was killed or failed leaves shards (and perhaps stats) but no
``COMPLETED``; the trainer, ``trainer.vocab`` and ``pipeline.audit`` refuse
such a directory unless told otherwise (``allow_incomplete``), because
training on or auditing half a corpus looks exactly like using a whole one.
A file of a complete corpus can still be damaged later (a truncated copy, a
bad disk): the tools then stop with ``DamagedFile``, one line naming it.
"""

from __future__ import annotations

import json
from typing import Union

COMPLETED = "COMPLETED"


class IncompleteCorpus(Exception):
    """The directory holds no ``COMPLETED`` marker."""


class DamagedFile(Exception):
    """A corpus file is truncated or corrupt; the message names it and what to do, in one line."""


def parse_json(data: Union[bytes, str], path: str, remedy: str = "rebuild the corpus"):
    """``json.loads(data)``, or ``DamagedFile`` naming ``path`` (truncated JSON, binary garbage)."""
    try:
        return json.loads(data)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise DamagedFile(f"{path}: not valid JSON ({error}): the file is truncated or corrupt; {remedy}") from None


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
