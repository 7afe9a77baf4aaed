"""What a reader will hold of one input record, and reading a stream within those bounds.

A file's lengths, counts and sizes are claims made by whoever wrote it. The
readers never allocate or loop on a claim beyond what the bytes hold: a
stream is read in chunks of at most ``CHUNK_BYTES``, a member or record
larger than its cap is skipped (read through, not kept) and becomes one
``read/too_large`` record, and a line is cut at its cap. The caps are build
options (``--read_max_record_bytes``, ``--read_max_line_bytes``), like the
download's ``--download_max_bytes``; with them a worker's reading holds a
few records at a time whatever a file claims.
"""

from __future__ import annotations

from typing import NamedTuple

# The stream's lines within a cap, and JSON within a depth: the same bounds as the project's own state files.
from common.files import TooLong, lines  # noqa: F401  (the readers' names for them)
from common.state_files import MAX_JSON_DEPTH, TooDeep, json_depth  # noqa: F401
from common.state_files import loads as load_json  # noqa: F401


class ReadLimits(NamedTuple):
    """The caps on one input record (``--read_max_*``)."""

    #: One record as stored: a TFRecord payload, a tar or folder sample's members together, a Parquet row's cells.
    max_record_bytes: int = 32 << 20
    #: One line of a TSV/JSONL URL list, and a sample's ``.json``/``.txt`` member (parsed as text).
    max_line_bytes: int = 1 << 20

    def check(self) -> "ReadLimits":
        for name, value in self._asdict().items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--read_{name} {value}: must be a whole number >= 1")
        return self


_FLAGS = (
    ("max_record_bytes", "largest input record kept, in bytes: a TFRecord payload, a tar or folder sample's members "
                         "together, a Parquet row's cells; a larger one is read/too_large, read through and never held"),
    ("max_line_bytes", "largest URL-list line (TSV, JSONL) and sample .json/.txt member kept, in bytes; a longer one "
                       "is read/too_large"),
)


def add_arguments(parser) -> None:
    """The ``--read_max_*`` flags, with ``ReadLimits``' defaults."""
    for name, text in _FLAGS:
        default = ReadLimits._field_defaults[name]
        parser.add_argument(f"--read_{name}", dest=f"read_{name}", type=int, default=default,
                            help=f"{text} (default {default:,})")


def from_options(opts) -> ReadLimits:
    """``ReadLimits`` from parsed flags; ``ValueError`` names a flag out of range."""
    return ReadLimits(**{name: getattr(opts, f"read_{name}") for name, _ in _FLAGS}).check()
