"""The audit's NSFW gallery: the highest-scoring images the build keeps and the NSFW stage rejects, as thumbnails.

    rows to write + rejections decided before the second pass
      --HighestScores (per side, one row per distinct image)--> up to GALLERY_SIZE rows per side
      --ThumbnailGallery (each file of a chosen row read again)--> stats/nsfw_gallery.jsonl

A person auditing the NSFW threshold looks at both ends of the cut: the kept
images the scorer found most pornographic (what the corpus would let
through) and the rejected ones it found most pornographic (what the stage
is sure of; the sampled rejects of ``stats/rejected_samples.jsonl`` show
typical ones, chosen by key hash). "Kept" is what the build writes: the
rows still in the running after every stage but the second pass's late
checks. The score is on each light row (``LightRow.nsfw_score``); an image
on many rows (a placeholder) is shown once. Thumbnails are made from the
source files, read again like the sampled rejects' (the first pass keeps
no bytes): at most ``2 * GALLERY_SIZE`` records, grouped by file.
"""

from __future__ import annotations

import json
import math

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from common.files import write_text
from filters.image import thumbnail_b64
from filters.nsfw import REJECT_REASON
from pipeline.funnel.stats_files import NSFW_GALLERY_FILE
from pipeline.readers.rows import Columns
from pipeline.write.second_pass import records_of, source_matches

#: Images shown per side (kept, rejected).
GALLERY_SIZE = 16
KEPT, REJECTED = "kept", "rejected"


def gallery_side(row):
    """``(side, row)`` for a scored row the build keeps or the NSFW stage rejected; nothing otherwise."""
    if not math.isfinite(row.nsfw_score):
        return
    if not row.reason:
        yield KEPT, row
    elif row.reason == REJECT_REASON:
        yield REJECTED, row


def _rank(row):
    """Highest score first; the smallest key of an image's rows stands for it (the choice is the same in any run)."""
    return -row.nsfw_score, row.key


class HighestScoresFn(beam.CombineFn):
    """Rows -> the ``size`` highest-scoring rows, one per image (sha256).

    The accumulator keeps at most ``size`` images, each by its best row: an
    image outside a part's top ``size`` cannot be in the whole's.
    """

    def __init__(self, size: int = GALLERY_SIZE):
        self.size = size

    def create_accumulator(self):
        return {}

    def add_input(self, best, row):
        image = row.sha256 or row.key
        if image not in best or _rank(row) < _rank(best[image]):
            best[image] = row
            if len(best) > 2 * self.size:
                best = self._trim(best)
        return best

    def _trim(self, best):
        return {image: row for image, row in sorted(best.items(), key=lambda kv: _rank(kv[1]))[:self.size]}

    def merge_accumulators(self, accumulators):
        merged = {}
        for best in accumulators:
            for row in best.values():
                merged = self.add_input(merged, row)
        return self._trim(merged)

    def extract_output(self, best):
        return sorted(self._trim(best).values(), key=_rank)


def entry(side: str, row, record=None) -> dict:
    """A gallery line: the row as the audit shows it, with the thumbnail of the record read again (if it matches)."""
    image = record.image if record is not None and source_matches(row, record) else None
    return {
        "side": side,
        "nsfw_score": round(float(row.nsfw_score), 6),
        "reason": row.reason,
        "key": row.key,
        "url": row.url,
        "alt_text": ((getattr(record, "alt_text", None) if image else None) or row.text)[:500],
        "width": row.width,
        "height": row.height,
        "format": row.format,
        "sha256": row.sha256,
        "thumbnail": thumbnail_b64(image),
    }


class _Thumbnails(beam.DoFn):
    """``(source file, [(side, row)])`` -> a gallery line per row, the file read once up to its last chosen record."""

    def __init__(self, columns: Columns):
        self.columns = columns

    def process(self, element):
        source, chosen = element
        wanted = {}
        for side, row in chosen:
            wanted.setdefault(row.ordinal, []).append((side, row))
        last = max(wanted)
        reader = chosen[0][1].reader
        for ordinal, record in enumerate(records_of(reader, source, self.columns)):
            for side, row in wanted.pop(ordinal, ()):
                yield entry(side, row, record)
            if ordinal >= last:
                break
        for rows in wanted.values():  # the file changed since the first pass: no thumbnail
            for side, row in rows:
                yield entry(side, row)


def _write(entries, path: str) -> None:
    ordered = sorted(entries, key=lambda e: (e["side"], -e["nsfw_score"], e["key"]))
    write_text(path, "".join(json.dumps(e, sort_keys=True) + "\n" for e in ordered))


def _chosen(side_rows):
    side, rows = side_rows
    for row in rows:
        yield row.source, (side, row)


class WriteNsfwGallery(beam.PTransform):
    """``(rows to write, rejections)`` -> ``stats/nsfw_gallery.jsonl`` under ``output_dir``: up to
    ``GALLERY_SIZE`` lines per side, highest score first."""

    def __init__(self, output_dir: str, columns: Columns = Columns(), size: int = GALLERY_SIZE):
        super().__init__()
        self.output_dir = output_dir
        self.columns = columns
        self.size = size

    def expand(self, inputs):
        chosen = (
            inputs
            | "KeptAndRejected" >> beam.Flatten()
            | "GallerySide" >> beam.FlatMap(gallery_side)
            | "HighestScores" >> beam.CombinePerKey(HighestScoresFn(self.size))
            | "ByFile" >> beam.FlatMap(_chosen)
        )
        readable = chosen | "Readable" >> beam.Filter(lambda kv: bool(kv[0]))
        unreadable = (chosen | "Unreadable" >> beam.Filter(lambda kv: not kv[0])
                      | "NoThumbnail" >> beam.MapTuple(lambda _, side_row: entry(*side_row)))
        entries = (
            (readable | "GroupByFile" >> beam.GroupByKey() | "Thumbnails" >> beam.ParDo(_Thumbnails(self.columns)),
             unreadable)
            | "Entries" >> beam.Flatten()
        )
        path = FileSystems.join(self.output_dir, "stats", NSFW_GALLERY_FILE)
        return (entries | "CollectGallery" >> beam.combiners.ToList()
                | "WriteGallery" >> beam.Map(_write, path))
