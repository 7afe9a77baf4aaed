"""A shard's records with every checksum checked: damage is named by file, or skipped and counted.

TensorFlow's own reader stops at a damaged frame with ``DataLossError:
corrupted record at 12345``, naming neither the file nor what to do, and
tf.data's ``ignore_errors`` drops the rest of the shard without saying how
much. This reader reads the TFRecord frames itself (length, masked CRC32C of
the length, payload, masked CRC32C of the payload, with the project's codec,
``common.tfrecord_io``) and, on damage, either
raises ``DamagedShard`` (one line: the file, the byte, the record, what to
do) or, with ``skip_corrupt``, skips and counts:

* a payload whose checksum fails (the frame's length is intact): that one
  record is skipped, reading goes on with the next frame;
* a frame that cannot be located (its length's checksum fails, or the file
  ends inside it): the rest of the file is lost; how many records that is
  comes from ``dataset_info.json``'s shard lengths when it describes the
  file, and is reported as unknown otherwise.

``ShardReader.dataset(path)`` is the reader as a ``tf.data`` source (the
trainer's input pipeline reads every shard through it); ``report()`` says
what was skipped so far. Errors raised inside tf.data reach the caller
wrapped in a TensorFlow error; ``damage_in(error)`` takes the
``DamagedShard`` back out.
"""

from __future__ import annotations

import itertools
import re
import threading
from typing import Dict, Iterator, Mapping, Optional

from common.corpus_dir import DamagedFile
from common.tfrecord_io import FOOTER_BYTES, HEADER_BYTES, CorruptPayload, FrameError, read_frames

#: A longer length is taken for damage, not read: no shard record is near it.
MAX_RECORD_BYTES = 1 << 30
CHUNK_RECORDS = 64
#: How each way a frame breaks is said to the person.
FRAME_PROBLEMS = {
    "header_truncated": "the file ends inside a record header",
    "length_corrupt": "a record header is corrupt (its length fails its checksum)",
    "payload_truncated": "the file ends inside a record (truncated)",
}


class DamagedShard(DamagedFile):
    """A shard that cannot be read whole; the message is the one line the person sees."""


def _open(path: str):
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.GFile(path, "rb")
    return open(path, "rb", buffering=1 << 20)


class ShardReader:
    """Reads shard files; raises ``DamagedShard`` on damage, or with ``skip_corrupt`` skips and counts.

    ``expected``: records per shard path (``dataset_info.json``), to count
    what a lost tail held. ``remedy``: what the error tells the person to do
    besides restoring the file (e.g. the option that skips damaged records).
    Thread-safe: tf.data reads several shards at once.
    """

    def __init__(self, skip_corrupt: bool = False, expected: Optional[Mapping[str, int]] = None,
                 remedy: str = ""):
        self.skip_corrupt = skip_corrupt
        self.expected = dict(expected or {})
        self.remedy = remedy
        self._lock = threading.Lock()
        self._damage: Dict[str, Dict[int, tuple]] = {}  # path -> byte offset -> (lost, line)
        self._said: set = set()

    def records(self, path: str) -> Iterator[bytes]:
        """The payloads of ``path`` in file order (damaged ones skipped, or ``DamagedShard``)."""
        expected = self.expected.get(path)
        index = offset = 0
        with _open(path) as handle:
            try:
                for frame in read_frames(handle, MAX_RECORD_BYTES, skip_too_large=False):
                    if isinstance(frame, CorruptPayload):  # the frame holds: only this record is lost
                        self._damaged(path, offset, index, expected, "a record is corrupt (its checksum fails)", lost=1)
                        length = frame.length
                    else:
                        yield frame
                        length = len(frame)
                    index, offset = index + 1, offset + HEADER_BYTES + length + FOOTER_BYTES
            except FrameError as error:
                problem = (f"a record header claims {error.length:,} bytes" if error.kind == "too_large"
                           else FRAME_PROBLEMS[error.kind])
                lost = None if expected is None else max(expected - index, 0)
                self._damaged(path, offset, index, expected, problem, lost=lost)

    def _damaged(self, path, offset, index, expected, problem, lost):
        of = f" of {expected:,}" if expected is not None else ""
        where = f"{path}: {problem} at byte {offset:,} (record {index + 1:,}{of})"
        if not self.skip_corrupt:
            remedy = f", or {self.remedy}" if self.remedy else ""
            raise DamagedShard(f"{where}: the shard is damaged; copy it again or rebuild the corpus{remedy}")
        what = (f"{lost:,} record(s) skipped" if lost is not None else
                "the rest of the shard skipped (how many records: unknown without dataset_info.json)")
        with self._lock:  # keyed by place: the next epoch meets the same damage, counted once
            self._damage.setdefault(path, {})[offset] = (lost, f"{where}: {what}")

    def report(self) -> Dict[str, dict]:
        """Per damaged file: ``skipped`` (records known lost), ``unknown_tail`` (a lost tail of
        unknown size) and ``problems`` (one line each)."""
        with self._lock:
            return {path: {"skipped": sum(lost or 0 for lost, _ in found.values()),
                           "unknown_tail": any(lost is None for lost, _ in found.values()),
                           "problems": [line for _, line in found.values()]}
                    for path, found in self._damage.items()}

    def new_problems(self) -> list:
        """The damage found since the last call, one line each (so that each is said once)."""
        with self._lock:
            new = [line for found in self._damage.values() for _, line in found.values() if line not in self._said]
            self._said.update(new)
        return new

    def records_skipped(self) -> int:
        """Damaged records found so far (each counted once, however often it is read)."""
        with self._lock:
            return sum(lost or 0 for found in self._damage.values() for lost, _ in found.values())

    def count(self, path: str) -> int:
        """Readable records of ``path`` (a full read)."""
        return sum(1 for _ in self.records(path))

    def dataset(self, path):
        """The records of ``path`` (a string tensor, e.g. inside ``flat_map``) as a ``tf.data.Dataset``.

        The Python reader hands tf.data ``CHUNK_RECORDS`` records per call: a
        call per record costs more CPU than the reading itself, in chunks it
        keeps up with ``TFRecordDataset`` (``benchmarks.input_pipeline``).
        """
        import numpy as np
        import tensorflow as tf

        def chunks(name):
            records = self.records(name.decode("utf-8"))
            while chunk := list(itertools.islice(records, CHUNK_RECORDS)):
                yield np.array(chunk, dtype=object)

        return tf.data.Dataset.from_generator(
            chunks, args=(path,), output_signature=tf.TensorSpec([None], tf.string)).unbatch()


_WRAPPED = re.compile(rf"\b{DamagedShard.__name__}: ([^\n]*)")


def damage_in(error: BaseException) -> Optional[DamagedShard]:
    """The ``DamagedShard`` inside a TensorFlow error raised while iterating a dataset, if any."""
    if isinstance(error, DamagedShard):
        return error
    found = _WRAPPED.search(str(error))
    if not found:
        return None
    damage = DamagedShard(found.group(1))
    damage.__cause__ = error  # the log keeps where it was raised
    return damage
