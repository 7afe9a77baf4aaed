"""What ``--input`` names: its files, and the files inside directories it matches.

A match that is a directory (Spark/Hive-style ``x.parquet/part-*.parquet``,
an img2dataset output folder) is read file by file; the bookkeeping files
inside such a directory (``_SUCCESS``, ``.crc``, ``_temporary/``) are not.
Files are matched on the workers (``fileio.MatchFiles``), never listed in the
job graph, so the same code reads a local glob or ``gs://bucket/shards/*``.
"""

from __future__ import annotations

import os
import re
from typing import List

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems


def is_hidden(relative_path: str) -> bool:
    """Spark/Hadoop bookkeeping inside a dataset directory: ``_SUCCESS``, ``.crc``, ``_temporary/``."""
    return any(part.startswith(("_", ".")) for part in relative_path.replace("\\", "/").split("/") if part)


def directory_members(pattern: str) -> str:
    """The pattern of files inside directories that ``pattern`` matches (``x.parquet/**``)."""
    return pattern.rstrip("/\\") + "/**"


def _matched_directory(path: str, pattern: str) -> str:
    """The part of ``path`` inside the directory ``pattern`` matched (for the hidden-file rule)."""
    base = re.compile(FileSystem.translate_pattern(pattern.rstrip("/\\"))[:-2])  # drop the \Z
    found = base.match(path)
    return path[found.end():] if found else path


def is_directory(path: str) -> bool:
    """A matched path that is a directory (local) or a directory placeholder object (``gs://.../``)."""
    return path.endswith("/") or ("://" not in path and os.path.isdir(path))


def list_input_files(pattern: str) -> List[str]:
    """Every file the job will read: matches of ``pattern`` plus the data files of matched directories."""
    files = set()
    for result in FileSystems.match([pattern, directory_members(pattern)]):
        for meta in result.metadata_list:
            if result.pattern == pattern:
                if not is_directory(meta.path):
                    files.add(meta.path)
            elif not is_hidden(_matched_directory(meta.path, pattern)):
                files.add(meta.path)
    return sorted(files)


def input_patterns(pattern: str) -> tuple:
    """What ``--input`` matches: the pattern and the files inside directories it matches."""
    return pattern, directory_members(pattern)


class MatchInputFiles(beam.PTransform):
    """``--input``'s pattern -> the paths of the files to read, spread over the workers (no file listed in the graph)."""

    def __init__(self, file_pattern: str):
        super().__init__()
        self.file_pattern = file_pattern

    def expand(self, pbegin):
        pattern = self.file_pattern
        files = (
            pbegin
            | "MatchFiles" >> fileio.MatchFiles(pattern, fileio.EmptyMatchTreatment.ALLOW)
            | "SkipDirectories" >> beam.Filter(lambda meta: not is_directory(meta.path))
        )
        members = (
            pbegin
            | "MatchDirectoryMembers" >> fileio.MatchFiles(directory_members(pattern), fileio.EmptyMatchTreatment.ALLOW)
            | "SkipHidden" >> beam.Filter(lambda meta: not is_hidden(_matched_directory(meta.path, pattern)))
        )
        return (
            (files, members)
            | "AllFiles" >> beam.Flatten()
            | "Paths" >> beam.Map(lambda meta: meta.path)
            | "Reshuffle" >> beam.Reshuffle()
        )
