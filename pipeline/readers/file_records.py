"""Every record of one input file, of any supported format, counted against what the file states.

The files come from ``pipeline.readers.input_files``. Files that are not data
(``*_stats.json``, ``_SUCCESS``, hidden files, TFDS metadata) are skipped and
never counted. Each file is read by the reader of its format
(``pipeline.readers``: by name, or ``--input_format``), which accounts for
every row: each becomes one ``Candidate`` or one ``Rejection`` with its
reason, and what it could not read is one marker record saying how many
records it stands for (``pipeline.readers.losses``). Where the file states
its own count (a Parquet footer, a TFDS shard length) the records read are
reconciled with it (``reconcile``): a count they do not explain adds one
``read/inconsistent_metadata`` record, never a failed job. The ``read``
Metrics counters let the launcher reconcile the funnel's input with the
files' metadata: ``parquet_rows`` and ``<format>_records`` (records read,
a marker as the rows it stands for) plus ``unreadable_files`` equal the
input, which is what the files state wherever they state it; over the files
that state a count, ``stated + unstated == stated_read + stated_unread``
(``pipeline.funnel.accounting.read_accounting_problems``); ``unknown_loss_files`` counts markers whose
loss no count can tell, and ``skipped_files`` the files that are not data.

A record's ordinal in its file (its origin) is its place in ``file_records``:
the reader's records in the reader's order, then at most one marker added
here, so re-reading a file gives the same ordinals.

img2dataset's WebDataset output is read shard by shard: ``00000.tar`` with
its ``00000.parquet`` (which lists the failed downloads). A metadata-only
Parquet file beside a tar is therefore read with its tar, once, whichever of
the two the input pattern matched.

Like every stage of the build, ``ReadCandidates`` returns ``{"survivors":
Candidate, "rejected": Rejection}`` (``pipeline.stages.verdicts``).
"""

from __future__ import annotations

import re
from typing import Iterator, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from common.schema import make_key
from filters import stages
from filters.stages import REJECTED, SURVIVORS
from pipeline import readers
from pipeline.funnel.accounting import READ_NAMESPACE, STATED_COUNTERS
from pipeline.funnel.counts import METRICS_NAMESPACE
from pipeline.readers import folders, losses
from pipeline.readers import parquet as parquet_reader
from pipeline.readers.input_files import MatchInputFiles, input_patterns
from pipeline.readers.rows import Columns, Rejection


def _matches(path: str, patterns) -> bool:
    return any(re.match(FileSystem.translate_pattern(p), path) for p in patterns)


def plan_file(path: str, override: Optional[str], patterns) -> Optional[tuple]:
    """``(format, path to read)`` for one matched file, or None to skip it.

    Skipped: non-data files, img2dataset's metadata Parquet beside a ``.tar``
    shard that the pattern also matched (the shard reads it), and the sample
    files of its ``files`` output when their shard's Parquet is matched. A
    metadata Parquet whose tar was not matched reads the pair by the tar; one
    beside a folder of samples reads that folder (``readers.folders``).
    """
    if readers.is_non_data(path):
        return None
    shard = folders.metadata_of_member(path)
    if shard and _matches(shard, patterns) and FileSystems.exists(shard) and parquet_reader.has_image_column(shard) is False:
        return None  # a sample file of img2dataset's files output: read with its shard
    fmt = readers.format_of(path, override)
    if readers.format_by_name(path) == "parquet" and fmt in ("parquet", "webdataset", "files"):
        tar = re.sub(r"\.parquet$", ".tar", path)
        images = parquet_reader.has_image_column(path)  # None: not readable Parquet
        if images is not True and FileSystems.exists(tar):
            # the shard's metadata (or its unreadable remains): the tar reads and reports it
            return None if _matches(tar, patterns) else ("webdataset", tar)
        if images is False and folders.has_folder(path):
            return "files", path
    return fmt, path


def unknown_format(path: str) -> Rejection:
    return Rejection(
        make_key(path, ""), stages.reason("read", "unknown_format"), url=path,
        alt_text=f"no reader for this file name; pass --input_format ({', '.join(readers.FORMATS)})",
    )


class FileTally:
    """What one file's records add up to (``pipeline.readers.losses``)."""

    def __init__(self):
        self.records = self.markers = self.unread = self.unstated = self.unknown = self.unreadable = 0
        self.counted = 0  # the input records the funnel counts: a marker as the rows it stands for
        self.stated: Optional[int] = None  # the count the file states, once read

    def add(self, record) -> None:
        self.records += 1
        self.counted += losses.records_of(record)
        if not isinstance(record, Rejection):
            return
        self.unreadable += record.reason == "read/unreadable_file"
        if losses.is_marker(record):
            self.markers += 1
            unread = losses.unread_of(record)
            if unread == losses.UNKNOWN:
                self.unknown += 1
            else:
                self.unread += unread
            self.unstated += losses.unstated_of(record)

    @property
    def read(self) -> int:
        """Records that stand for one input record each (markers excluded)."""
        return self.records - self.markers


def reconcile(path: str, stated: Optional[int], tally: FileTally) -> Optional[Rejection]:
    """The marker for a count the file states that its records do not explain, or None.

    Explained: ``stated + unstated == read + unread``. A reader's own markers
    explain what it knew; this catches what none did (a reader stopped by an
    error, a TFDS shard holding another number of records than stated).
    """
    if stated is None:
        return None
    difference = stated + tally.unstated - tally.read - tally.unread
    if difference == 0:
        return None
    return losses.marker(
        f"{path}#count", "inconsistent_metadata",
        f"the file states {stated:,} records; {tally.read:,} read, {tally.unread:,} stated as unread",
        unread=max(difference, 0), unstated=max(-difference, 0),
    )


def _data_errors() -> tuple:
    """What a file's bytes can make a parser raise; anything else (the file system's ``OSError``, a storage
    client's own errors, ``MemoryError``) is not the file's doing and is raised, for the runner to retry."""
    import struct
    import zlib

    from pyarrow.lib import ArrowException

    return (ValueError, TypeError, LookupError, AttributeError, ArithmeticError, RecursionError, EOFError,
            struct.error, zlib.error, ArrowException)


def file_records(fmt: str, path: str, columns: Columns = Columns(), tally: Optional[FileTally] = None) -> Iterator[object]:
    """Every record of one file, in order: the reader's, then at most one marker of this function.

    Nothing a file holds stops the job: a reader that raises what bytes can
    provoke (``_data_errors``) part-way ends the file with one
    ``read/truncated_file`` record.
    """
    reader = readers.FORMATS[fmt]
    tally = tally if tally is not None else FileTally()
    try:
        for record in reader.read_file(path, columns):
            tally.add(record)
            yield record
    except _data_errors() as error:  # a reader's last resort; each reader handles what it knows
        if isinstance(error, OSError):  # pyarrow's IO errors are ArrowExceptions and OSErrors
            raise
        tally.stated = reader.expected_records(path, columns)
        unread = None if tally.stated is None else max(tally.stated - tally.read - tally.unread, 0)
        stopped = losses.marker(f"{path}#after-{tally.records}", "truncated_file",
                                f"reading stopped: {type(error).__name__}: {error}", unread)
        tally.add(stopped)
        yield stopped
    else:
        tally.stated = reader.expected_records(path, columns)
    extra = reconcile(path, tally.stated, tally)
    if extra is not None:
        tally.add(extra)
        yield extra


class FileRecords:
    """Every record of one matched file, counted for the launcher's reconciliation.

    ``read(path)`` yields ``(reader, path read, record)`` for each record in
    the order ``file_records`` gives them (a record's position in that
    sequence is its ordinal: the second pass reads the file again the same
    way and picks records by it), and counts them: ``funnel/input`` per
    record (a marker as the rows it stands for), the ``read`` counters per file (``parquet_rows`` /
    ``<format>_records``, ``unreadable_files``, ``skipped_files``, and the
    stated counts of ``STATED_COUNTERS``).
    """

    def __init__(self, patterns, input_format: Optional[str] = None, columns: Columns = Columns()):
        self.patterns = tuple(patterns)
        self.input_format = input_format
        self.columns = columns
        self.input_records = Metrics.counter(METRICS_NAMESPACE, "input")
        self.unreadable_files = Metrics.counter(READ_NAMESPACE, "unreadable_files")
        self.skipped_files = Metrics.counter(READ_NAMESPACE, "skipped_files")
        self.unknown_losses = Metrics.counter(READ_NAMESPACE, "unknown_loss_files")
        self.stated = {name: Metrics.counter(READ_NAMESPACE, name) for name in STATED_COUNTERS}

    def read(self, path: str) -> Iterator[Tuple[str, str, object]]:
        plan = plan_file(path, self.input_format, self.patterns)
        if plan is None:
            self.skipped_files.inc()
            return
        fmt, path = plan
        tally = FileTally()
        if fmt is None:
            records = [unknown_format(path)]
            tally.add(records[0])
        else:
            records = file_records(fmt, path, self.columns, tally)
        for element in records:
            self.input_records.inc(losses.records_of(element))
            yield fmt or "", path, element
        # rows + unreadable files == input records (pipeline.funnel.accounting.accounting_problems checks it)
        self.unreadable_files.inc(tally.unreadable)
        name = "parquet_rows" if fmt == "parquet" else f"{fmt or 'unknown_format'}_records"
        Metrics.counter(READ_NAMESPACE, name).inc(tally.counted - tally.unreadable)
        self.unknown_losses.inc(tally.unknown)
        if tally.stated is not None:
            for counter, value in zip(STATED_COUNTERS, (tally.stated, tally.read, tally.unread, tally.unstated)):
                self.stated[counter].inc(value)


class _ReadFile(beam.DoFn):
    def __init__(self, patterns, input_format: Optional[str] = None, columns: Columns = Columns()):
        self.records = FileRecords(patterns, input_format, columns)

    def process(self, path: str):
        for _, _, element in self.records.read(path):
            if isinstance(element, Rejection):
                Metrics.counter(METRICS_NAMESPACE, element.reason).inc(losses.records_of(element))
                yield beam.pvalue.TaggedOutput(REJECTED, element)
            else:
                yield element


class ReadCandidates(beam.PTransform):
    """Glob of input files (and directories) -> ``{"survivors": Candidate, "rejected": Rejection}``.

    Every record with its image bytes: for tools and tests that want the
    input as records. The build reads files in its first pass instead
    (``pipeline.stages.judge``), where image bytes never leave the step that read them.
    """

    decides = ("read",)

    def __init__(self, file_pattern: str, input_format: Optional[str] = None, columns: Columns = Columns()):
        super().__init__()
        if input_format and input_format not in readers.FORMATS:
            raise ValueError(f"unknown --input_format {input_format!r}; one of {', '.join(readers.FORMATS)}")
        self.file_pattern = file_pattern
        self.input_format = input_format or None
        self.columns = columns

    def expand(self, pbegin):
        rows = (
            pbegin
            | "MatchInputFiles" >> MatchInputFiles(self.file_pattern)
            | "ParseRows" >> beam.ParDo(_ReadFile(input_patterns(self.file_pattern), self.input_format, self.columns))
            .with_outputs(REJECTED, main=SURVIVORS)
        )
        return {SURVIVORS: rows[SURVIVORS], REJECTED: rows[REJECTED]}


