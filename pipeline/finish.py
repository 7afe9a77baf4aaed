"""The finish step after the job: TFDS metadata for its shards, and whether its counts add up."""

from __future__ import annotations

import json
from typing import List, Optional

from apache_beam.io.filesystems import FileSystems

from pipeline import stats as stats_lib
from pipeline import write as write_lib

NS = stats_lib.METRICS_NAMESPACE


class AccountingError(Exception):
    """The job ran but its counts do not add up; COMPLETED is not written."""



def finalize(output: str, name: str, preset, carried=(), version: str = "1.0.0", concepts: bool = False) -> dict:
    """TFDS metadata for the published shards; returns the funnel."""
    with FileSystems.open(FileSystems.join(output, write_lib.SHARDS_FILE)) as handle:
        shard_lengths = json.loads(handle.read())
    description = f"Alt-text corpus built with preset {preset.name!r} by pipeline.build"
    write_lib.write_tfds_metadata(output, name, shard_lengths, description, carried, version, concepts)
    with FileSystems.open(FileSystems.join(output, "stats", "funnel.json")) as handle:
        funnel = json.loads(handle.read())
    return funnel


def accounting_problems(funnel: dict, read_counts: Optional[dict]) -> List[str]:
    """Why the funnel cannot be trusted: conservation, and input vs what the files state.

    ``read_counts`` are the reader's counters (``pipeline.read``): rows per
    file as its metadata states them (``parquet_rows``, ``<format>_records``)
    and one per unreadable file.
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
    return problems


def counters(result, namespace: str = NS) -> Optional[dict]:
    """Beam Metrics counters of ``namespace`` by name, or None if the runner has none."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    except Exception:  # runners without metrics support (e.g. Dask)
        return None
    return {c.key.metric.name: c.committed for c in queried}

