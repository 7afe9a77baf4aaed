"""A build's output as the tests read it: the directory of its committed version."""

import pathlib

from common.corpus_dir import resolve


def committed(output) -> pathlib.Path:
    """``common.corpus_dir.resolve``: raises ``IncompleteCorpus`` if nothing is committed."""
    return pathlib.Path(resolve(str(output)))
