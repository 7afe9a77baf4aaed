"""Reading candidates: img2dataset-style Parquet files into ``Candidate`` records.

Files are matched (``fileio.MatchFiles``), never embedded in the job graph, so
the same code reads a local glob or ``gs://bucket/shards/*.parquet``. Each
file is read one row group at a time; a row that cannot become a candidate
(missing column, no bytes, failed download, caption that is not text) is
rejected with a ``read/...`` reason, and a file that cannot be opened at all
counts as one rejected input so nothing disappears silently.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from filters import stages
from filters.text import decode_caption
from pipeline.schema import Candidate, make_key
from pipeline.stats import METRICS_NAMESPACE

URL_COLUMNS = ("url",)
CAPTION_COLUMNS = ("caption", "alt_text", "text", "texts")
IMAGE_COLUMNS = ("jpg", "image", "png", "webp")
META_COLUMNS = ("key", "width", "height", "status", "error_message")


class Rejection(NamedTuple):
    """A record that will not be written, and the first reason why.

    ``image`` is carried only so the audit sampler can draw a thumbnail; the
    sampler keeps a few per reason before any shuffle.
    """

    key: str
    reason: str
    url: str = ""
    alt_text: str = ""
    width: int = 0
    height: int = 0
    format: str = ""
    image: Optional[bytes] = None


def _first_present(names, columns):
    for name in names:
        if name in columns:
            return name
    return None


def rows_to_candidates(path: str, table_batches, columns) -> Iterator[object]:
    """Yield ``Candidate`` or ``Rejection`` per row of one file (pure, no Beam)."""
    url_col = _first_present(URL_COLUMNS, columns)
    caption_col = _first_present(CAPTION_COLUMNS, columns)
    image_col = _first_present(IMAGE_COLUMNS, columns)
    missing = [n for n, c in (("url", url_col), ("caption", caption_col), ("image", image_col)) if c is None]
    row_index = 0
    for batch in table_batches:
        data = batch.to_pydict()
        for i in range(batch.num_rows):
            row = {name: values[i] for name, values in data.items()}
            row_index += 1
            url = str(row.get(url_col) or "") if url_col else ""
            if missing:
                key = make_key(url or f"{path}#{row_index}", "")
                yield Rejection(key, stages.reason("read", "missing_column"), url=url)
                continue
            caption, caption_reason = decode_caption(row.get(caption_col))
            key = make_key(url, caption)
            source = tuple((k, row[k]) for k in META_COLUMNS if k in row and row[k] is not None)
            image = row.get(image_col)
            status = row.get("status")
            if caption_reason:
                yield Rejection(key, caption_reason, url=url, alt_text=caption, image=image)
            elif status not in (None, "success"):
                yield Rejection(key, stages.reason("read", "bad_status"), url=url, alt_text=caption)
            elif not image:
                yield Rejection(key, stages.reason("read", "no_image"), url=url, alt_text=caption)
            else:
                yield Candidate(key=key, url=url, alt_text=caption, image=bytes(image), source=source)


class _ReadParquetFile(beam.DoFn):
    def __init__(self):
        self.input_records = Metrics.counter(METRICS_NAMESPACE, "input")

    def process(self, readable: fileio.ReadableFile):
        for element in self._rows(readable):
            self.input_records.inc()
            if isinstance(element, Rejection):
                Metrics.counter(METRICS_NAMESPACE, element.reason).inc()
            yield element

    def _rows(self, readable: fileio.ReadableFile):
        import pyarrow.parquet as pq

        path = readable.metadata.path
        try:
            # Streamed one row group at a time; the file is never read whole.
            with FileSystems.open(path) as handle:
                parquet = pq.ParquetFile(handle)
                columns = set(parquet.schema_arrow.names)
                batches = parquet.iter_batches(batch_size=256)
                yield from rows_to_candidates(path, batches, columns)
        except Exception as error:  # unreadable file: one rejected input, named
            key = make_key(path, "")
            yield Rejection(key, stages.reason("read", "unreadable_file"), url=path, alt_text=repr(error)[:200])


class ReadCandidates(beam.PTransform):
    """Glob of Parquet files -> PCollection of ``Candidate`` | ``Rejection``."""

    def __init__(self, file_pattern: str):
        super().__init__()
        self.file_pattern = file_pattern

    def expand(self, pbegin):
        return (
            pbegin
            | "MatchFiles" >> fileio.MatchFiles(self.file_pattern)
            | "ReadMatches" >> fileio.ReadMatches()
            | "Reshuffle" >> beam.Reshuffle()
            | "ParseRows" >> beam.ParDo(_ReadParquetFile())
        )
