"""Which records a selection names: the checks before anything is written, and the table rows read back as light rows.

A selection picks among the records the build wrote (the candidate table's
rows with a ``split``). ``check_where`` and ``check_keys`` run on the
launcher, before the output is touched; ``ReadSelection`` runs on the
workers, one table file at a time, and turns each selected row back into
the light row the second pass writes from, with ``stored_at`` pointing at
its stored picture in the source corpus (``pipeline.write.stored_copies``).
"""

from __future__ import annotations

from typing import FrozenSet, Optional

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline.build.options import UsageError
from pipeline.stages.light_rows import LightRow
from pipeline.stages.verdicts import REPEAT
from pipeline.write.candidate_table import SCHEMA
from pipeline.write.stored_copies import stored_at


def read_keys(path: str) -> FrozenSet[str]:
    try:
        with FileSystems.open(path) as handle:
            text = handle.read().decode("utf-8")
    except Exception as error:  # a missing or unreadable file: one line
        raise UsageError(f"--keys {path}: cannot be read ({type(error).__name__})") from None
    keys = frozenset(line.strip() for line in text.splitlines() if line.strip())
    if not keys:
        raise UsageError(f"--keys {path}: holds no key")
    return keys


def _frame(table: pa.Table):
    return table.to_pandas()


def where_mask(frame, where: str):
    """The rows of ``frame`` that ``where`` keeps, among the written ones."""
    kept = frame.eval(where, engine="python")
    return kept & frame["split"].notna()


def check_where(where: str) -> None:
    """One line if ``where`` is not a truth value per row of the table's columns."""
    frame = _frame(pa.Table.from_pylist([_EXAMPLE_ROW], schema=SCHEMA))
    try:
        result = frame.eval(where, engine="python")
    except Exception as error:  # pandas' UndefinedVariableError, SyntaxError, TypeError...
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"--where {where!r}: {message} (columns: {', '.join(SCHEMA.names)})") from None
    if getattr(result, "dtype", None) != bool:
        raise UsageError(f"--where {where!r}: not a condition (it gives {getattr(result, 'dtype', type(result))}, "
                         "not true or false per row)")


_EXAMPLE_ROW = {"key": "0" * 24, "url": "https://e.x/a.jpg", "text": "a photo", "split": "train", "reason": None,
                "words": 2, "repetition": 0.0, "width": 1, "height": 1, "format": "JPEG", "sha256": "0" * 64,
                "phash": "0" * 16, "nsfw_score": 0.0, "model_score": 0.0, "lowest_ngram_count": 1,
                "eval_match": None, "counted": True, "stored_width": 0, "stored_height": 0, "source": "s",
                "reader": "parquet", "ordinal": 0, "shard": "s", "offset": 0}


def check_keys(keys: FrozenSet[str], version_dir: str, summary: dict) -> None:
    """One line if a key is not a record the corpus wrote (reads the table's key, split and reason columns)."""
    fates = {}
    for relative in sorted(summary["files"]):
        with FileSystems.open(FileSystems.join(version_dir, relative)) as handle:
            table = pq.read_table(pa.BufferReader(handle.read()), columns=["key", "split", "reason"])
        for key, split, reason in zip(*(table.column(c).to_pylist() for c in ("key", "split", "reason"))):
            if key in keys and (split or key not in fates):
                fates[key] = split or reason
    missing = sorted(keys - set(fates))
    if missing:
        raise UsageError(f"--keys: {len(missing):,} key(s) are not in the corpus's candidate table, e.g. {missing[0]}")
    rejected = sorted(key for key, fate in fates.items() if "/" in fate)
    if rejected:
        raise UsageError(f"--keys: {len(rejected):,} key(s) were rejected by the build, e.g. {rejected[0]} "
                         f"({fates[rejected[0]]}); a selection picks among the written records")


def light_row(entry: dict, version_dir: str) -> LightRow:
    """A table row (written, or a repeat of a written pair) -> the light row the second pass writes it from;
    a written one names its stored picture in the source corpus."""
    score = entry["model_score"]
    nsfw = entry["nsfw_score"]
    return LightRow(
        entry["key"], entry["url"], entry["text"], "", bool(entry["counted"]), entry["sha256"], entry["phash"],
        int(entry["width"]), int(entry["height"]), entry["format"], entry["source"], entry["reader"],
        int(entry["ordinal"]), eval_match=entry["eval_match"] or "", stored_width=int(entry["stored_width"]),
        stored_height=int(entry["stored_height"]), lowest_ngram_count=int(entry["lowest_ngram_count"] or 0),
        model_score=float("-inf") if score is None else float(score),
        nsfw_score=float("-inf") if nsfw is None else float(nsfw),
        stored_at=stored_at(FileSystems.join(version_dir, entry["shard"]), int(entry["offset"])) if entry["shard"]
        else "")


class _ReadSelection(beam.DoFn):
    def __init__(self, version_dir: str, where: Optional[str], keys_path: Optional[str], measured: bool = False):
        self.version_dir, self.where, self.keys_path, self.measured = version_dir, where, keys_path, measured

    def setup(self):
        from pipeline.select.chosen import read_keys

        self.keys = read_keys(self.keys_path) if self.keys_path else None

    def process(self, path):
        with FileSystems.open(path) as handle:
            frame = _frame(pq.read_table(pa.BufferReader(handle.read())))
        if self.measured:  # --set: the written records and their repeats, with the measures the rules compare
            frame = frame[frame["split"].notna() | (frame["reason"] == REPEAT)]
        elif self.keys is not None:
            frame = frame[frame["key"].isin(self.keys) & frame["split"].notna()]
        else:
            frame = frame[where_mask(frame, self.where)]
        for entry in frame.astype(object).where(frame.notna(), None).to_dict("records"):
            row = light_row(entry, self.version_dir)
            yield (row, int(entry["words"]), float(entry["repetition"])) if self.measured else row


class ReadSelection(beam.PTransform):
    """Table file paths -> the selected records' light rows (``where``, or the keys in the file ``keys_path``);
    with ``measured`` (``--set``), ``(light row, words, repetition)`` of every written record and repeat."""

    def __init__(self, version_dir: str, where: Optional[str] = None, keys_path: Optional[str] = None,
                 measured: bool = False):
        super().__init__()
        self.version_dir, self.where, self.keys_path, self.measured = version_dir, where, keys_path, measured

    def expand(self, paths):
        return paths | "SelectedRows" >> beam.ParDo(
            _ReadSelection(self.version_dir, self.where, self.keys_path, self.measured))
