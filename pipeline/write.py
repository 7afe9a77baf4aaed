"""Writing a TFDS-compatible directory of TFRecord shards.

Split and shard of a record are functions of its key alone (salted hashes),
records inside a shard are sorted by key, and the Example bytes are encoded
with a fixed feature order: two runs on the same input give byte-identical
files whatever the runner, the number of workers or the bundle boundaries.
The number of shards per split follows from the split's size and
``max_records_per_shard``; hashing keeps shards within a few percent of the
mean. Metadata (``dataset_info.json``, ``features.json``) is written by the
launcher after the job, then ``COMPLETED`` last.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from apache_beam.metrics import Metrics

from common.schema import (
    CARRIED_PREFIX, CONCEPTS_DIR, CONCEPTS_FEATURE, FEATURES, SPLITS, Candidate, carried_features, key_fraction,
    shard_filename,
)
from pipeline import tfrecord
from pipeline.stats import METRICS_NAMESPACE, write_text

SHARDS_FILE = "stats/_shards.json"


def split_of(key: str, validation_fraction: float) -> str:
    return "validation" if key_fraction(key, salt="split") < validation_fraction else "train"


def num_shards_for(count: int, max_records_per_shard: int) -> int:
    # Hash sharding is uneven by ~sqrt(n); aim at 90% of the bound.
    return max(1, math.ceil(count / (0.9 * max_records_per_shard)))


def shard_of(key: str, num_shards: int) -> int:
    return min(num_shards - 1, int(key_fraction(key, salt="shard") * num_shards))


def to_example(record: Candidate, carried: Sequence[str] = ()) -> bytes:
    """The record's Example: ``FEATURES`` in order, ``source_<column>`` for each carried column, then
    ``concepts`` when the record was tagged (``--concepts``)."""
    values = {
        "image": record.image,
        "texts": record.text,
        "key": record.key,
        "url": record.url,
        "width": record.stored_width,
        "height": record.stored_height,
        "original_width": record.width,
        "original_height": record.height,
        "sha256": record.sha256,
        "phash": record.phash,
    }
    assert list(values) == list(FEATURES), "writer and schema.FEATURES disagree"
    have = dict(record.carried)
    for column in carried:
        values[CARRIED_PREFIX + column] = have.get(column, "")
    if record.concepts is not None:
        values[CONCEPTS_FEATURE] = " ".join(record.concepts)
    return tfrecord.encode_example(values)


def concept_offsets(payloads: Sequence[bytes], concepts: Sequence[tuple]) -> Dict[str, List[int]]:
    """``{class: [byte offset of each record of that class]}`` in a shard of these payloads, in order.

    A TFRecord frame is 8 bytes of length, 4 of its CRC, the payload and 4 of
    the payload's CRC: record ``i`` starts at ``sum(len(p) + 16 for p before it)``.
    The trainer seeks there to read one class's records (``trainer.concept_batches``).
    """
    offsets: Dict[str, List[int]] = {}
    position = 0
    for payload, classes in zip(payloads, concepts):
        for name in classes or ():
            offsets.setdefault(name, []).append(position)
        position += len(payload) + 16
    return offsets


def write_contiguous_shards(output_dir: str, name: str, split: str, examples: List[bytes], num_shards: int) -> List[int]:
    """Serialised Examples into ``num_shards`` files in order; returns the shard lengths.

    For small fixtures and benchmarks written outside Beam; the build job
    shards by key hash instead (``WriteShards``).
    """
    base, extra = divmod(len(examples), num_shards)
    lengths = [base + (index < extra) for index in range(num_shards)]  # as numpy.array_split
    start = 0
    for index, length in enumerate(lengths):
        path = FileSystems.join(output_dir, shard_filename(name, split, index, num_shards))
        with FileSystems.create(path) as handle:
            tfrecord.write_records(handle, examples[start : start + length])
        start += length
    return lengths


class _WriteShard(beam.DoFn):
    def __init__(self, output_dir: str, name: str):
        self.output_dir = output_dir
        self.name = name

    def process(self, element, shard_counts):
        (split, index), examples = element
        num_shards = shard_counts[split]
        ordered = sorted(examples, key=lambda e: e[0])  # (key, bytes, concepts): deterministic order
        filename = shard_filename(self.name, split, index, num_shards)
        path = FileSystems.join(self.output_dir, filename)
        with FileSystems.create(path) as handle:
            tfrecord.write_records(handle, (payload for _, payload, _ in ordered))
        if ordered and ordered[0][2] is not None:  # a tagged build: the shard's class index beside it
            offsets = concept_offsets([p for _, p, _ in ordered], [c for _, _, c in ordered])
            index_path = FileSystems.join(self.output_dir, CONCEPTS_DIR, filename + ".json")
            write_text(index_path, json.dumps({"shard": filename, "records": len(ordered), "offsets": offsets},
                                              sort_keys=True))
        Metrics.counter(METRICS_NAMESPACE, f"written/{split}").inc(len(ordered))
        yield split, index, num_shards, len(ordered)


def _fill_empty_shards(output_dir: str, name: str, written: List[tuple]) -> Dict[str, List[int]]:
    """Hashing may leave a shard empty; TFDS expects every index, so write it.

    A build that writes no record at all still gets one empty shard per split:
    an empty corpus is a valid TFDS directory with 0 examples, not a missing one.
    """
    lengths: Dict[str, List[int]] = {}
    for split, index, num_shards, count in written:
        lengths.setdefault(split, [0] * num_shards)[index] = count
    if not lengths:
        lengths = {split: [0] for split in SPLITS}
    present = {(s, i) for s, i, _, _ in written}
    for split, counts in lengths.items():
        for index in range(len(counts)):
            if (split, index) not in present:
                path = FileSystems.join(output_dir, shard_filename(name, split, index, len(counts)))
                FileSystems.create(path).close()
    return lengths


def _write_shard_list(shard_lengths: Dict[str, List[int]], output_dir: str) -> None:
    write_text(FileSystems.join(output_dir, SHARDS_FILE), json.dumps(shard_lengths, sort_keys=True))


class WriteShards(beam.PTransform):
    """Candidates to ``<name>-<split>.tfrecord-NNNNN-of-MMMMM`` files.

    Returns a PCollection with one dict ``{split: [records per shard]}``,
    also written to ``stats/_shards.json`` for the launcher's metadata.
    """

    def __init__(self, output_dir: str, name: str, preset, carried: Sequence[str] = ()):
        super().__init__()
        self.output_dir = output_dir
        self.name = name
        self.preset = preset
        self.carried = tuple(carried)

    def expand(self, records):
        fraction = self.preset.validation_fraction
        bound = self.preset.max_records_per_shard
        carried = self.carried
        by_split = records | "AssignSplit" >> beam.Map(
            lambda r: (split_of(r.key, fraction), (r.key, to_example(r, carried), r.concepts))
        )
        counts = (
            by_split
            | "SplitOnly" >> beam.Map(lambda kv: kv[0])
            | "CountPerSplit" >> beam.combiners.Count.PerElement()
            | "NumShards" >> beam.Map(lambda kv: (kv[0], num_shards_for(kv[1], bound)))
        )
        shard_counts = beam.pvalue.AsDict(counts)
        written = (
            by_split
            | "AssignShard" >> beam.Map(
                lambda kv, shards: ((kv[0], shard_of(kv[1][0], shards[kv[0]])), kv[1]), shards=shard_counts
            )
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(_WriteShard(self.output_dir, self.name), shard_counts)
        )
        output_dir, name = self.output_dir, self.name
        lengths = (
            written
            | "CollectShardList" >> beam.combiners.ToList()
            | "FillEmptyShards" >> beam.Map(lambda items: _fill_empty_shards(output_dir, name, items))
        )
        _ = lengths | "WriteShardList" >> beam.Map(_write_shard_list, output_dir)
        return lengths


class _WriteLedgerFile(beam.DoFn):
    def __init__(self, output_dir: str):
        self.output_dir = output_dir

    def process(self, element, num_files):
        index, lines = element
        name = f"rejected-{index:05d}-of-{num_files:05d}.jsonl"
        path = FileSystems.join(self.output_dir, "stats", "rejected", name)
        with FileSystems.create(path) as handle:
            for _, line in sorted(lines):
                handle.write(line.encode("utf-8") + b"\n")


class WriteRejectionLedger(beam.PTransform):
    """Every rejected record's key and reason, ``stats/rejected/*.jsonl``.

    A line is ``{"key", "reason", "url"}`` plus the rejection's ``detail``
    (a download's ``http_status`` and ``final_url``).

    The per-record ledger behind the funnel: with the shards it accounts for
    every input record. Files are keyed and sorted like the shards, so runs
    agree byte for byte; about ``LEDGER_LINES_PER_FILE`` lines per file.
    """

    LEDGER_LINES_PER_FILE = 500_000

    def __init__(self, output_dir: str):
        super().__init__()
        self.output_dir = output_dir

    def expand(self, inputs):
        rejections, input_count = inputs
        per_file = self.LEDGER_LINES_PER_FILE
        num_files = input_count | "LedgerFiles" >> beam.Map(lambda n: max(1, math.ceil(n / per_file)))
        return (
            rejections
            | "LedgerLine" >> beam.Map(
                lambda r, n: (
                    shard_of(r.key, n),
                    (r.key, json.dumps({"key": r.key, "reason": r.reason, "url": r.url, **dict(r.detail)})),
                ),
                n=beam.pvalue.AsSingleton(num_files),
            )
            | "GroupLedgerFile" >> beam.GroupByKey()
            | "WriteLedgerFile" >> beam.ParDo(_WriteLedgerFile(self.output_dir), beam.pvalue.AsSingleton(num_files))
        )


def write_tfds_metadata(
    output_dir: str, name: str, shard_lengths: Dict[str, List[int]], description: str, carried: Sequence[str] = (),
    version: str = "1.0.0", concepts: bool = False,
) -> None:
    """dataset_info.json + features.json, so tfds.builder_from_directory loads the dir (no TFDS needed here).

    ``concepts``: the build tagged its records (``--concepts``): declare that feature too.
    """
    from pipeline import tfds_metadata

    tfds_metadata.write_metadata(output_dir, name, shard_lengths, description, carried, version, concepts)
