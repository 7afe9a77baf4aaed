"""Whether a job's counts add up: the funnel's conservation law, and its input against the files' metadata."""

from __future__ import annotations

from typing import List, Optional

from pipeline.funnel import counts as stats_lib

NS = stats_lib.METRICS_NAMESPACE
#: Beam Metrics namespace of the reader's own accounting, per file (``pipeline.readers.file_records.FileRecords``).
READ_NAMESPACE = "read"
#: Beam Metrics namespace of the verdicts' own accounting: ``emitted/<stage>`` where a key stage hands its
#: verdicts on (``pipeline.stages.verdicts.CountVerdicts``), ``received`` where ``JoinVerdicts`` folds them in;
#: ``verdict_accounting_problems`` checks that they agree: a verdict lost on the way would write a record
#: that should have been rejected, and the funnel's conservation law cannot see that.
VERDICTS_NAMESPACE = "verdicts"


class AccountingError(Exception):
    """The job ran but its counts do not add up; its version is not committed."""


def accounting_problems(funnel: dict, read_counts: Optional[dict]) -> List[str]:
    """Why the funnel cannot be trusted: conservation, and input vs what the files state.

    ``read_counts`` are the reader's counters (``pipeline.readers.file_records``): records
    per file (``parquet_rows``, ``<format>_records``), one per unreadable
    file, and what the files state against what was read and counted
    unread (``read_accounting_problems``).
    """
    problems = []
    if not funnel.get("conserved", False):
        problems.append("conservation law violated: input != written + rejected")
    if read_counts is not None:
        rows = sum(v for k, v in read_counts.items() if k == "parquet_rows" or k.endswith("_records"))
        unreadable = read_counts.get("unreadable_files", 0)
        if funnel["input"] != rows + unreadable:
            problems.append(
                f"input count {funnel['input']:,} differs from the files' metadata: {rows:,} rows "
                f"+ {unreadable:,} unreadable files"
            )
        problems += read_accounting_problems(read_counts)
    return problems


#: ``read`` counters of the files that state a count: stated + unstated == read + unread.
STATED_COUNTERS = ("stated", "stated_read", "stated_unread", "unstated")


def read_accounting_problems(counts: dict) -> List[str]:
    """Why the ``read`` counters do not add up to what the files state (empty when they do)."""
    stated, read, unread, unstated = (counts.get(name, 0) for name in STATED_COUNTERS)
    if stated + unstated != read + unread:
        return [f"the files state {stated:,} records (+{unstated:,} found beyond that); "
                f"{read:,} read and {unread:,} counted unread"]
    return []


def verdict_accounting_problems(counts: Optional[dict]) -> List[str]:
    """Why the key stages' verdicts did not all reach the join that applies them (empty when they did).

    ``counts`` are the ``verdicts`` counters (``pipeline.stages.verdicts``): each
    stage's ``emitted/<stage>`` and the join's ``received``.
    """
    if counts is None:
        return []
    emitted = {name.split("/", 1)[1]: n for name, n in counts.items() if name.startswith("emitted/")}
    received = counts.get("received", 0)
    if sum(emitted.values()) == received:
        return []
    shown = ", ".join(f"{stage} {n:,}" for stage, n in sorted(emitted.items()))
    return [f"the key stages emitted {sum(emitted.values()):,} verdicts ({shown}) but the join received "
            f"{received:,}: the runner lost data"]


def counters(result, namespace: str = NS) -> Optional[dict]:
    """Beam Metrics counters of ``namespace`` by name, or None if the runner has none."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    except Exception:  # runners without metrics support (e.g. Dask)
        return None
    return {c.key.metric.name: c.committed for c in queried}

