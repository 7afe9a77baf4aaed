"""Whether a job's counts add up: the funnel's conservation law, and its input against the files' metadata.

A reader's record for what it could not read (``pipeline.readers.losses``)
carries how many input records it stands for in its ledger detail:
``unread_records`` (rows the file states that were not read, or
``"unknown"``) and ``unstated_records`` (rows read beyond what the file
states). The funnel counts such a record as the rows it stands for
(``records_of``): its input is what the files state, wherever they state it.
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple

from common import state_files as sf
from pipeline.funnel import counts as stats_lib

NS = stats_lib.METRICS_NAMESPACE
#: Beam Metrics namespace of the reader's own accounting, per file (``pipeline.readers.file_records.FileRecords``).
READ_NAMESPACE = "read"
#: Beam Metrics namespace of the verdicts' own accounting: ``emitted/<stage>`` where a key stage hands its
#: verdicts on (``pipeline.stages.verdicts.CountVerdicts``), ``received`` where ``JoinVerdicts`` folds them in;
#: ``verdict_accounting_problems`` checks that they agree: a verdict lost on the way would write a record
#: that should have been rejected, and the funnel's conservation law cannot see that.
VERDICTS_NAMESPACE = "verdicts"


UNREAD = "unread_records"
UNSTATED = "unstated_records"
UNKNOWN = "unknown"


def stands_for(detail: Dict[str, object]) -> int:
    """The input records a record with this ledger detail counts as: a marker its unread rows (one where
    no count is stated), any other record one."""
    unread = detail.get(UNREAD, 1)
    return unread if isinstance(unread, int) and not isinstance(unread, bool) else 1


def loss_of(detail: Dict[str, object]) -> Tuple[int, int, int]:
    """``(unread, unknown, unstated)`` of a marker's ledger detail: what the funnel's ``reading`` sums."""
    if UNREAD not in detail:
        return 0, 0, 0
    unread = detail[UNREAD]
    unstated = detail.get(UNSTATED, 0)
    unstated = unstated if isinstance(unstated, int) else 0
    return (0, 1, unstated) if unread == UNKNOWN else (int(unread), 0, unstated)


def _detail(row) -> Dict[str, object]:
    # Only a reader's markers carry an unread count, and every one is a read/ reason: the detail of the other
    # stages' rows is not parsed.
    if not row.detail or not row.reason.startswith("read/"):
        return {}
    return json.loads(row.detail)


def records_of(row) -> int:
    """The input records a light row counts as in the funnel (``stands_for`` of its ledger detail)."""
    return stands_for(_detail(row))


def losses_of(row) -> Tuple[int, int, int]:
    """``loss_of`` a light row (zeros for a row that is no marker)."""
    return loss_of(_detail(row))


class AccountingError(Exception):
    """The job ran but its counts do not add up; its version is not committed."""


def accounting_problems(funnel: dict, read_counts: Optional[dict]) -> List[str]:
    """Why the funnel cannot be trusted: conservation, and input vs what the files state.

    ``read_counts`` are the reader's counters (``pipeline.readers.file_records``): records
    per file (``parquet_rows``, ``<format>_records``, a marker as the rows it
    stands for), one per unreadable file, and what the files state against
    what was read and counted unread (``read_accounting_problems``).
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


def counters_schema(doc) -> dict:
    """``stats/read_counts.json`` and ``stats/verdict_counts.json`` (``pipeline.build.launcher.save_counters``):
    counter name -> count."""
    return sf.mapping(doc, "", sf.whole, max_len=100_000)


def counters(result, namespace: str = NS) -> Optional[dict]:
    """Beam Metrics counters of ``namespace`` by name, or None if the runner has none."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    except Exception:  # runners without metrics support (e.g. Dask)
        return None
    return {c.key.metric.name: c.committed for c in queried}

