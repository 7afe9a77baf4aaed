"""A keyed join that never holds a hot key's rows in one list.

Beam's Python ``CoGroupByKey`` (and ``GroupByKey`` on the portable runner)
hands a key's values to one DoFn call as a list. The corpus stages join many
rows per key against one decision per key (a group's verdict, a record's
rejection), and their keys are exactly the hot ones: one boilerplate caption
on 10M rows, one placeholder image, one logo repeated on every page of a
site. ``JoinDecisions`` splits the keys by how many rows they have:

- **hot** keys (more than ``max_rows`` rows; at most ``rows / max_rows`` of
  them, so a small table) get their decision by a side input: each row is
  decided where it is, and nothing is grouped;
- the other keys join by ``CoGroupByKey``, each group at most ``max_rows``
  rows.

Row counts per key and decisions per key are combines (lifted: partial per
bundle before the shuffle), so no step holds more than ``max_rows`` rows of
one key, however hot it is. The result equals a plain join's
(``tests/common/test_hot_keys.py``).

Counter (namespace ``hot_keys``): ``<label>/hot_rows``, rows decided by the
side input; distribution ``<label>/grouped_rows``: rows per grouped key.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

NAMESPACE = "hot_keys"
#: Rows of one key that may meet in one list (light rows: ~100 bytes each).
DEFAULT_MAX_ROWS = 10_000


class _DecideHotRows(beam.DoFn):
    """``(key, row)`` -> ``(row, decision)`` for hot keys (side input); the rest, keyed, to the join."""

    GROUPED = "grouped"

    def __init__(self, label: str):
        self.label = label
        self.hot = Metrics.counter(NAMESPACE, f"{label}/hot_rows")

    def process(self, element, hot, hot_decisions):
        key, row = element
        if key in hot:
            self.hot.inc()
            yield row, hot_decisions.get(key)
        else:
            yield beam.pvalue.TaggedOutput(self.GROUPED, element)


class _DecideGroupedRows(beam.DoFn):
    def __init__(self, label: str):
        self.rows = Metrics.distribution(NAMESPACE, f"{label}/grouped_rows")

    def process(self, element):
        _, grouped = element
        decision = next(iter(grouped["decision"]), None)
        rows = grouped["row"]
        if rows:
            self.rows.update(len(rows))
        for row in rows:
            yield row, decision


def _hot_decision(entry, hot):
    if entry[0] in hot:
        yield entry


class JoinDecisions(beam.PTransform):
    """``{"rows": (key, row), "decisions": (key, decision)}`` -> ``(row, decision or None)`` per row.

    ``combine`` reduces several decisions of one key to one (default
    ``min``); a key without decision gives ``None``. ``max_rows``: keys with
    more rows than this are decided by side input, never grouped.
    """

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS, combine=min, label: str = "join"):
        super().__init__()
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = int(max_rows)
        self.combine = combine
        self.name_in_metrics = label

    def expand(self, inputs):
        rows, decisions = inputs["rows"], inputs["decisions"]
        max_rows, label = self.max_rows, self.name_in_metrics
        decided = decisions | "OneDecisionPerKey" >> beam.CombinePerKey(self.combine)
        hot_counts = (
            rows
            | "RowKeys" >> beam.Map(lambda kv: (kv[0], 1))
            | "RowsPerKey" >> beam.CombinePerKey(sum)
            | "HotKeys" >> beam.Filter(lambda kv: kv[1] > max_rows)
        )
        # The hot keys and their decisions are two small side inputs (a hot key may have none): a lookup, not a
        # CoGroupByKey of the two (five transforms).
        hot = beam.pvalue.AsDict(hot_counts)
        hot_decisions = beam.pvalue.AsDict(decided | "HotTable" >> beam.FlatMap(_hot_decision, hot))
        split = rows | "DecideHotRows" >> beam.ParDo(_DecideHotRows(label), hot, hot_decisions).with_outputs(
            _DecideHotRows.GROUPED, main="hot")
        grouped = (
            {"row": split[_DecideHotRows.GROUPED], "decision": decided}
            | "GroupRowsWithDecision" >> beam.CoGroupByKey()
            | "DecideGroupedRows" >> beam.ParDo(_DecideGroupedRows(label))
        )
        return (split["hot"], grouped) | "AllRows" >> beam.Flatten()
