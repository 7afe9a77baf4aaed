"""The build's second pass: the kept records read again from their files and written as TFDS shards.

    kept light rows --(by source file)--> read the file again --> shards <name>-<split>.tfrecord-NNNNN-of-MMMMM

The first pass decided on light rows (``pipeline.stages.judge``); only their
source file and ordinal (the record's position in what the file's reader
yields) cross the shuffle here, never image bytes. ``WriteShards`` groups the
kept rows by file with the file's place in the shard plan
(``pipeline.write.shards.shard_plan``), reads each file once more and writes its
records, in file order, into shards it alone writes: one open shard per
split at a time, whatever the number of shards. A record is written with
its stored picture (``filters.image.stored_picture``: the source JPEG as it
came, or a re-encode). A record that cannot be written after all (its
bytes changed since the first pass, or its full decode fails where the
reduced one did not) is rejected here with its reason, and counted like
any other.

With ``--webdataset`` the same records also go, in the same order, to
img2dataset-layout tars (``pipeline.write.tar_shards``), tar ``i`` of a split
holding what shard ``i`` holds. Each record written is reported with its
split, shard and offset (the candidate table's). A selection's rows name
the picture the source corpus stored (``LightRow.stored_at``): it is copied
from there (``pipeline.write.stored_copies``), not made again. A rebuild's
(``--reuse``) rows name the old corpus's picture only where its own first
pass found the bytes the old build's: a file all of whose kept rows are
copied is read again only for the audit's samples (``WriteShards``'
``read_once``).

The same pass reads the rejections chosen as the audit's samples in the
files it opens anyway and makes their thumbnails: the ledger and the
report carry thumbnails and references, never the bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from common import allocator
from common.corpus_dir import SHARDS_FILE
from common.files import write_text
from common.once import once
from common.optional_inputs import OptionalInputs
from common.schema import CONCEPTS_DIR, SPLITS, Candidate, shard_filename, split_of
from filters import stages
from filters.image import Stored, read_header, stored_picture
from pipeline.download import staging
from pipeline.funnel import progress
from pipeline.funnel.counts import METRICS_NAMESPACE
from pipeline.funnel.stats_files import sample_row
from pipeline.readers.file_records import file_records
from pipeline.readers.rows import Columns
from pipeline.stages.light_rows import LightRow, holding_rows, rejected
from pipeline.write import tar_shards
from pipeline.write.concept_tags import PAIRS, TAGGED
from pipeline.write.shards import ShardWriter, chunk_sizes, shard_list, shard_plan, to_example, write_empty_shard
from pipeline.write.stored_copies import StoredCopies
from pipeline.write.tar_shards import TFRECORD, WEBDATASET, TarShardWriter

SHARDS, SAMPLES, LATE, CONCEPT_COUNTS = "shards", "samples", "late_rejections", "concept_counts"
#: ``(key, source, ordinal, split, shard, offset)`` of each record written (the candidate table's); the tars' infos.
PLACEMENTS, TARS = "placements", "tars"
SOURCE_CHANGED = stages.reason("read", "source_changed")


def records_of(reader: str, path: str, columns: Columns):
    """A file's records as the first pass read them (``pipeline.readers.file_records.file_records``; the download's staging files)."""
    if reader == staging.READER:
        return staging.read_file(path, columns)
    return file_records(reader, path, columns)


def source_matches(row: LightRow, record) -> bool:
    """Whether what the second pass read at the row's ordinal is the record the first pass judged."""
    if not isinstance(record, Candidate) or record.image is None:
        return False
    if row.reader != staging.READER and record.key != row.key:
        return False
    return hashlib.sha256(record.image).hexdigest() == row.sha256


class _SplitShards:
    """One split's shards of one file: the shard each of its rows goes to, and the one open shard of each format."""

    def __init__(self, split: str, rows: List[LightRow], first: int, bound: int, count: int, output_dir: str, name: str,
                 formats: Sequence[str] = (TFRECORD,)):
        self.split, self.first, self.count = split, first, count
        self.output_dir, self.name, self.formats = output_dir, name, tuple(formats)
        self.shard_of_row: Dict[int, int] = {}
        at = 0
        sizes = chunk_sizes(len(rows), bound)
        for offset, size in enumerate(sizes):
            for row in rows[at : at + size]:
                self.shard_of_row[id(row)] = first + offset
            at += size
        self.last = first + len(sizes) - 1
        self.index: Optional[int] = None
        self.writers: Dict[str, object] = {}

    def write(self, row: LightRow, record: Candidate, carried: Sequence[str], concepts) -> Tuple[List[tuple], str, int]:
        """Writes the record in every format; returns the shards closed on the way, and the shard (relative to
        the version) and offset where the first format holds it."""
        closed = self._advance_to(self.shard_of_row[id(row)])
        where = None
        for fmt in self.formats:
            writer = self.writers[fmt]
            if fmt == TFRECORD:
                offset = writer.bytes
                writer.write(to_example(record, carried), concepts)
                placed = shard_filename(self.name, self.split, self.index, self.count), offset
            else:
                placed = tar_shards.tar_name(self.split, self.index), writer.write(record, carried)
            where = where or placed
        return closed, where[0], where[1]

    def finish(self) -> List[tuple]:
        """Closes the open shard; a shard whose every row was rejected in this pass is still written, empty."""
        return self._advance_to(self.last) + self._close()

    def _advance_to(self, index: int) -> List[tuple]:
        closed = []
        while self.index is None or self.index < index:
            closed += self._close()
            self.index = self.first if self.index is None else self.index + 1
            for fmt in self.formats:
                if fmt == TFRECORD:
                    path = FileSystems.join(self.output_dir, shard_filename(self.name, self.split, self.index, self.count))
                    self.writers[fmt] = ShardWriter(path)
                else:
                    self.writers[fmt] = TarShardWriter(
                        FileSystems.join(self.output_dir, tar_shards.tar_name(self.split, self.index)))
        return closed

    def _close(self) -> List[tuple]:
        """``(format, split, index, info, writer)`` of each open shard, closed."""
        writers, self.writers = self.writers, {}
        return [(fmt, self.split, self.index, writer.close(), writer) for fmt, writer in writers.items()]


class _WriteFileShards(beam.DoFn):
    """``(source file, its light rows)`` -> the file's shards: kept rows written, audit samples thumbnailed."""

    def __init__(self, output_dir: str, name: str, preset, columns: Columns, carried: Sequence[str],
                 ontology=None, labels_column: str = "", formats: Sequence[str] = (TFRECORD,), read_once: bool = False):
        self.read_once = read_once
        self.output_dir = output_dir
        self.name = name
        self.preset = preset
        self.columns = columns
        self.carried = tuple(carried)
        self.ontology = ontology
        self.labels_column = labels_column
        self.formats = tuple(formats)

    def setup(self):
        allocator.keep_freed_buffers()  # a re-encode's buffers, reused instead of faulted in per record
        self.copies = StoredCopies()
        self.tagger = None
        if self.ontology is not None:
            from filters.concepts import Tagger

            self.tagger = Tagger(self.ontology)

    def process(self, element, firsts_per_file, totals):
        source, file_rows = element
        rows, samples = [], []
        for row in file_rows:  # a kept record has no reason; an audit sample has its rejection's
            (samples if row.reason else rows).append(row)
        rows.sort(key=lambda r: (r.ordinal, r.key))
        samples.sort(key=lambda r: (r.ordinal, r.key, r.reason))
        firsts = firsts_per_file.get(source, {})
        fraction = self.preset.validation_fraction
        by_split: Dict[str, List[LightRow]] = {}
        for row in rows:
            by_split.setdefault(split_of(row.key, fraction), []).append(row)
        splits = {split: _SplitShards(split, split_rows, firsts[split], self.preset.max_records_per_shard,
                                      totals[split], self.output_dir, self.name, self.formats)
                  for split, split_rows in by_split.items()}
        copied = 0
        if self.read_once:
            # Nothing of the source is needed where the old corpus holds the picture: this build's first pass
            # read these bytes, found them the old build's (their sha256) and put the source's columns on the row.
            # The file is read again only as far as the audit's samples and the records not copied.
            for row in rows:
                copy = self.copies.read(row.stored_at) if row.stored_at and row.carried else None
                if copy is None or copy[0] != row.key:
                    break  # this record and the rest: from the source, as in any build
                carried = tuple(tuple(kv) for kv in json.loads(row.carried))
                yield from self._written(row, Stored(*copy[1:]), carried, splits[split_of(row.key, fraction)])
                copied += 1
        wanted: Dict[int, list] = {}
        for row in rows[copied:]:
            wanted.setdefault(row.ordinal, []).append(("write", row))
        for row in samples:
            wanted.setdefault(row.ordinal, []).append(("sample", row))
        last = max(wanted, default=-1)
        for ordinal, record in enumerate(records_of((rows or samples)[0].reader, source, self.columns)
                                         if wanted else ()):
            for kind, row in wanted.pop(ordinal, ()):
                if kind == "sample":
                    yield beam.pvalue.TaggedOutput(SAMPLES, _sample(row, record))
                else:
                    yield from self._write(row, record, splits[split_of(row.key, fraction)])
            if ordinal >= last:
                break
        for entries in wanted.values():  # the file ends before the ordinal: it changed since the first pass
            for kind, row in entries:
                if kind == "sample":
                    yield beam.pvalue.TaggedOutput(SAMPLES, _sample(row, None))
                else:
                    yield self._late(row, SOURCE_CHANGED)
        for _, shards in sorted(splits.items()):
            yield from self._shards(shards.finish())
        self.copies.close()
        progress.tally("write", file=source)  # what this process wrote reaches the console now

    def _late(self, row: LightRow, reason: str):
        Metrics.counter(METRICS_NAMESPACE, reason).inc()
        return beam.pvalue.TaggedOutput(LATE, rejected(row, reason))

    def _write(self, row: LightRow, record, shards: _SplitShards):
        if not source_matches(row, record):
            yield self._late(row, SOURCE_CHANGED)
            return
        copy = self.copies.read(row.stored_at) if row.stored_at else None
        if copy is not None and copy[0] == row.key:  # a selection: the picture its source corpus wrote
            stored = Stored(*copy[1:])
        elif row.stored_width:  # the first pass found it storable as it came: no header, no decode
            stored = Stored(record.image, row.stored_width, row.stored_height)
        else:
            header, reason = read_header(record.image, self.preset)
            stored, reason = stored_picture(record.image, header, self.preset) if header else (None, reason)
            if reason:
                yield self._late(row, reason)
                return
        carried = tuple(tuple(kv) for kv in json.loads(row.carried)) if row.carried else record.carried
        yield from self._written(row, stored, carried, shards)

    def _written(self, row: LightRow, stored: Stored, carried, shards: _SplitShards):
        """Writes the row's record with its stored picture (and ``carried``: its source columns)."""
        concepts = None
        if self.tagger is not None:
            from pipeline.write.concept_tags import concepts_of

            concepts = concepts_of(row.text, carried, self.tagger, self.labels_column)
        written = Candidate(
            key=row.key, url=row.url, alt_text="", image=stored.image, carried=carried, text=row.text,
            format=row.format, width=row.width, height=row.height, stored_width=stored.width,
            stored_height=stored.height, sha256=row.sha256, phash=row.phash, concepts=concepts)
        Metrics.counter(METRICS_NAMESPACE, f"written/{shards.split}").inc()
        progress.tally("write", records=1)
        closed, shard, offset = shards.write(row, written, self.carried, concepts)
        yield beam.pvalue.TaggedOutput(PLACEMENTS, (row.key, row.source, row.ordinal, shards.split, shard, offset))
        yield from self._shards(closed)

    def _shards(self, closed):
        for fmt, split, index, info, writer in closed:
            if fmt == WEBDATASET:
                yield beam.pvalue.TaggedOutput(TARS, (split, index, info))
                continue
            if self.tagger is not None:  # the shard's class index beside it, and its share of stats/concepts.json
                filename = writer.path.rstrip("/").rsplit("/", 1)[-1]
                write_text(FileSystems.join(self.output_dir, CONCEPTS_DIR, filename + ".json"),
                           json.dumps({"shard": filename, "records": info["records"], "offsets": writer.offsets},
                                      sort_keys=True))
                for name, count in concept_counts(writer).items():
                    yield beam.pvalue.TaggedOutput(CONCEPT_COUNTS, ((split, name), count))
            yield beam.pvalue.TaggedOutput(SHARDS, (split, index, info))


def concept_counts(writer: ShardWriter) -> Dict[str, int]:
    """A tagged shard's pairs, tagged pairs and pairs per class, as ``pipeline.write.concept_tags.concept_stats`` counts them."""
    return {PAIRS: writer.records, TAGGED: writer.tagged, **{name: len(at) for name, at in writer.offsets.items()}}


def _sample(row: LightRow, record) -> dict:
    """An audit sample: the rejection as its light row has it, with the thumbnail and alt-text read again."""
    image = getattr(record, "image", None)
    alt_text = getattr(record, "alt_text", None) or row.text
    return sample_row(row, image, alt_text)


def _keyed_by_source(row: LightRow):
    return row.source, row


FILE_AND_ROW = Tuple[str, LightRow]


class ShardsWritten(NamedTuple):
    """What ``WriteShards`` hands on (see there)."""

    shards: beam.PCollection
    samples: beam.PCollection
    late_rejections: beam.PCollection
    concept_counts: beam.PCollection
    placements: beam.PCollection
    tars: Optional[beam.PCollection]


class WriteShards(OptionalInputs):
    """``(kept light rows, sampled rejections or None)`` -> ``ShardsWritten``.

    ``shards``: one ``(split, index, {"records", "bytes", "crc32c"})`` per
    shard file; the list is also written to ``stats/_shards.json`` for the
    launcher (``pipeline.write.shards.shard_list``). ``samples``: audit sample
    rows with thumbnails (none without sampled rejections). ``late_rejections``:
    records the pass could not write. ``concept_counts``: ``((split, class),
    records)`` per shard with ``--concepts``. ``placements``: ``(key, source,
    ordinal, split, shard, offset)`` of each record written (the candidate
    table's, ``pipeline.write.candidate_table``). ``formats``
    (``pipeline.write.tar_shards.FORMATS``): the TFRecord shards always; with
    ``webdataset`` the same records also go to tars, listed in
    ``stats/_webdataset.json`` (``tars``: their infos; None without).
    ``read_once``: a row's ``stored_at`` names a copy of bytes this job's
    first pass read and checked, and its ``carried`` the source's columns
    (``--reuse``): a file whose kept rows are all copied is read again only
    as far as its audit samples, if any (a selection's rows come from a
    table: their sources are read and checked).
    """

    def __init__(self, output_dir: str, name: str, preset, columns: Columns = Columns(), carried: Sequence[str] = (),
                 ontology=None, labels_column: str = "", formats: Sequence[str] = (TFRECORD,), read_once: bool = False):
        super().__init__()
        self.read_once = read_once
        if TFRECORD not in formats:
            raise ValueError("the TFRecord shards are always written: the trainer and the publication read them")
        self.formats = tuple(formats)
        self.output_dir = output_dir
        self.name = name
        self.preset = preset
        self.columns = columns
        self.carried = tuple(carried)
        self.ontology = ontology
        self.labels_column = labels_column

    def expand(self, inputs):
        rows, samples = inputs
        fraction, bound = self.preset.validation_fraction, self.preset.max_records_per_shard
        output_dir, name = self.output_dir, self.name
        kept = (
            rows
            | "FileAndSplit" >> beam.Map(lambda r: ((r.source, split_of(r.key, fraction)), 1))
            | "KeptPerFileAndSplit" >> beam.CombinePerKey(sum)
        )
        plan = once(rows.pipeline, "ShardPlan", lambda counts: shard_plan([(f, s, n) for (f, s), n in counts], bound),
                    beam.pvalue.AsList(kept))
        # One entry per input file: small beside the rows, read by every writer.
        firsts = beam.pvalue.AsSingleton(plan | "FirstShards" >> beam.Map(lambda p: p[0]))
        totals = beam.pvalue.AsSingleton(plan | "ShardsPerSplit" >> beam.Map(lambda p: p[1]))
        to_read = [] if samples is None else [
            samples
            | "SamplesToReadAgain" >> beam.Filter(lambda r: bool(r.source))
            | "SamplesByFile" >> beam.Map(_keyed_by_source).with_output_types(FILE_AND_ROW)]
        outputs = (
            [rows | "ByFile" >> beam.Map(_keyed_by_source).with_output_types(FILE_AND_ROW), *to_read]
            | "RowsToReadAgain" >> beam.Flatten()
            | "GroupByFile" >> beam.GroupByKey()
            | "WriteFileShards" >> beam.ParDo(
                _WriteFileShards(output_dir, name, self.preset, self.columns, self.carried, self.ontology,
                                 self.labels_column, self.formats, self.read_once), firsts, totals)
            .with_outputs(SHARDS, SAMPLES, LATE, CONCEPT_COUNTS, PLACEMENTS, TARS)
        )
        tars = None
        empty = plan | "EmptyCorpusShards" >> beam.FlatMap(
            lambda p: [] if p[1] else [(split, 0, write_empty_shard(output_dir, name, split)) for split in SPLITS])
        shards = (outputs[SHARDS], empty) | "AllShards" >> beam.Flatten()
        _ = once(rows.pipeline, "WriteShardList",
                 lambda infos: write_text(FileSystems.join(output_dir, SHARDS_FILE),
                                          json.dumps(shard_list(infos), sort_keys=True)),
                 beam.pvalue.AsList(shards))
        if WEBDATASET in self.formats:
            empty_tars = plan | "EmptyCorpusTars" >> beam.FlatMap(
                lambda p: [] if p[1] else [(split, 0, tar_shards.write_empty_tar(output_dir, split)) for split in SPLITS])
            tars = (outputs[TARS], empty_tars) | "AllTars" >> beam.Flatten()
            _ = once(rows.pipeline, "WriteTarList",
                     lambda infos: write_text(FileSystems.join(output_dir, tar_shards.TARS_FILE),
                                              json.dumps(tar_shards.tar_list(infos), sort_keys=True)),
                     beam.pvalue.AsList(tars))
        samples_out = outputs[SAMPLES]
        if samples is not None:
            unread = samples | "SamplesWithoutSource" >> beam.Filter(lambda r: not r.source) | "SampleRows" >> (
                beam.Map(_sample, None))
            samples_out = (samples_out, unread) | "AllSamples" >> beam.Flatten()
        return ShardsWritten(shards=shards, samples=samples_out, late_rejections=holding_rows(outputs[LATE]),
                             concept_counts=outputs[CONCEPT_COUNTS], placements=outputs[PLACEMENTS], tars=tars)
