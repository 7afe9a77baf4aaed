"""Whether a job's counts add up: the funnel's conservation law, and its input against the files' metadata."""

from __future__ import annotations

from typing import List, Optional

from pipeline import stats as stats_lib

NS = stats_lib.METRICS_NAMESPACE


class AccountingError(Exception):
    """The job ran but its counts do not add up; its version is not committed."""


def accounting_problems(funnel: dict, read_counts: Optional[dict]) -> List[str]:
    """Why the funnel cannot be trusted: conservation, and input vs what the files state.

    ``read_counts`` are the reader's counters (``pipeline.read``): records
    per file (``parquet_rows``, ``<format>_records``), one per unreadable
    file, and what the files state against what was read and counted
    unread (``pipeline.read.read_accounting_problems``).
    """
    from pipeline.read import read_accounting_problems

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


def verdict_accounting_problems(counts: Optional[dict]) -> List[str]:
    """Why the key stages' verdicts did not all reach the join that applies them (empty when they did).

    ``counts`` are the ``verdicts`` counters (``pipeline.verdicts``): each
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

