"""TFDS shards as the second pass writes them: the plan, the Example bytes, a streaming shard writer.

Records are written per source file: each file's kept records of a split go,
in the file's own order, into ``ceil(n / max_records_per_shard)`` shards of
that file, sized as evenly as they can be (so ``max_records_per_shard`` is a
true maximum). The shards of a split are numbered over the files in path
order (``shard_plan``): the numbering is a function of the input and the
verdicts alone, so two runs on the same input write the same files whatever
the runner, the number of workers or the bundle boundaries. Example bytes
are encoded with a fixed feature order (``to_example``).
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple

import google_crc32c
from apache_beam.io.filesystems import FileSystems

from common import tfrecord_io as tfrecord
from common.schema import CARRIED_PREFIX, FEATURES, Candidate, shard_filename


def shards_for(count: int, max_records_per_shard: int) -> int:
    return math.ceil(count / max_records_per_shard)


def chunk_sizes(count: int, max_records_per_shard: int) -> List[int]:
    """Records per shard of one file's ``count`` records: each at most the bound, as even as they can be."""
    shards = shards_for(count, max_records_per_shard)
    base, extra = divmod(count, shards) if shards else (0, 0)
    return [base + (i < extra) for i in range(shards)]


def shard_plan(counts: Iterable[Tuple[str, str, int]], max_records_per_shard: int):
    """``(source, split, kept records)`` -> ``({source: {split: first shard}}, {split: shards})``.

    Files in path order; a file's shards of a split follow each other.
    """
    firsts: Dict[str, Dict[str, int]] = {}
    totals: Dict[str, int] = {}
    for source, split, count in sorted(counts):
        firsts.setdefault(source, {})[split] = totals.get(split, 0)
        totals[split] = totals.get(split, 0) + shards_for(count, max_records_per_shard)
    return firsts, totals


def to_example(record: Candidate, carried: Sequence[str] = ()) -> bytes:
    """The record's Example: ``FEATURES`` in order, ``source_<column>`` for each carried column, then
    ``concepts`` when the record was tagged (``--concepts``)."""
    from common.schema import CONCEPTS_FEATURE

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


class ShardWriter:
    """One shard file, written as its records come: frames, the file's crc32c and size, class offsets.

    Holds one open file and the offsets of tagged records, never the records.
    """

    def __init__(self, path: str):
        self.path = path
        self.handle = FileSystems.create(path)
        self.records = 0
        self.bytes = 0
        self.crc = 0
        self.offsets: Dict[str, List[int]] = {}
        self.tagged = 0  # records that name at least one class

    def write(self, payload: bytes, concepts: Sequence[str] = ()) -> None:
        self.tagged += bool(concepts)
        for name in concepts or ():
            self.offsets.setdefault(name, []).append(self.bytes)
        frame = tfrecord.frame_record(payload)
        self.handle.write(frame)
        self.crc = google_crc32c.extend(self.crc, frame)
        self.bytes += len(frame)
        self.records += 1

    def close(self) -> dict:
        self.handle.close()
        return {"records": self.records, "bytes": self.bytes, "crc32c": f"{self.crc:08x}"}


def write_empty_shard(output_dir: str, name: str, split: str) -> dict:
    """The one shard of a split without records: TFDS wants a file, an empty corpus is still a corpus."""
    return ShardWriter(FileSystems.join(output_dir, shard_filename(name, split, 0, 1))).close()


def shard_list(written: Iterable[Tuple[str, int, dict]], kind: str = "shard") -> Dict[str, Dict[str, list]]:
    """``(split, index, {"records", "bytes", "crc32c"})`` per shard -> ``stats/_shards.json``'s document (also the
    WebDataset tars', ``kind="tar"``)."""
    by_split: Dict[str, Dict[int, dict]] = {}
    for split, index, info in written:
        by_split.setdefault(split, {})[index] = info
    document = {}
    for split, shards in sorted(by_split.items()):
        if sorted(shards) != list(range(len(shards))):
            raise ValueError(f"split {split}: {kind} indices {sorted(shards)[:5]}... are not 0..{len(shards) - 1}")
        ordered = [shards[i] for i in range(len(shards))]
        document[split] = {field: [s[field] for s in ordered] for field in ("records", "bytes", "crc32c")}
    return document


def shard_lengths(document: Mapping[str, Mapping[str, list]]) -> Dict[str, List[int]]:
    """``{split: [records per shard]}`` of a ``stats/_shards.json`` document."""
    return {split: list(entry["records"]) for split, entry in document.items()}


def write_contiguous_shards(output_dir: str, name: str, split: str, examples: List[bytes], num_shards: int) -> List[int]:
    """Serialised Examples into ``num_shards`` files in order; returns the shard lengths.

    For small fixtures and benchmarks written outside Beam.
    """
    base, extra = divmod(len(examples), num_shards)
    lengths = [base + (index < extra) for index in range(num_shards)]  # as numpy.array_split
    start = 0
    for index, length in enumerate(lengths):
        writer = ShardWriter(FileSystems.join(output_dir, shard_filename(name, split, index, num_shards)))
        for payload in examples[start : start + length]:
            writer.write(payload)
        writer.close()
        start += length
    return lengths
