"""``WriteRejectionLedger``: every rejected record's key and reason, ``stats/rejected/*.jsonl``.

The per-record ledger behind the funnel: with the shards it accounts for
every input record.
"""

from __future__ import annotations

import json
import math

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from common.schema import shard_of
from pipeline.funnel.stats_files import scored
from pipeline.stages.light_rows import LightRow, detail_items


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


def ledger_line(row: LightRow) -> str:
    return json.dumps({"key": row.key, "reason": row.reason, "url": row.url, **detail_items(row), **scored(row)})


class WriteRejectionLedger(beam.PTransform):
    """Every rejected record's key and reason, ``stats/rejected/*.jsonl``.

    A line is ``{"key", "reason", "url"}`` plus the rejection's ``detail``
    (a download's ``http_status`` and ``final_url``) and its scores: the
    ``nsfw_score`` of an image the NSFW stage scored (every ``nsfw/pornographic``
    rejection has one), the ``model_score`` of a pair the model-score stage scored.

    The per-record ledger behind the funnel: with the shards it accounts for
    every input record (a reader's line with ``unread_records`` for the rows
    it stands for). Files are keyed and sorted by key hash, so runs agree
    byte for byte; about ``LEDGER_LINES_PER_FILE`` lines per file (of the
    ``row_count`` rows: a line each, whatever it stands for).
    """

    LEDGER_LINES_PER_FILE = 500_000

    def __init__(self, output_dir: str):
        super().__init__()
        self.output_dir = output_dir

    def expand(self, inputs):
        rejections, row_count = inputs
        per_file = self.LEDGER_LINES_PER_FILE
        # No row count (a job that counted none may hand on an empty one) is one file, as a count of 0 is.
        num_files = beam.pvalue.AsSingleton(
            row_count | "LedgerFiles" >> beam.Map(lambda n: max(1, math.ceil(n / per_file))), default_value=1)
        return (
            rejections
            | "LedgerLine" >> beam.Map(
                lambda r, n: (shard_of(r.key, n), (r.key, ledger_line(r))), n=num_files)
            | "GroupLedgerFile" >> beam.GroupByKey()
            | "WriteLedgerFile" >> beam.ParDo(_WriteLedgerFile(self.output_dir), num_files)
        )
