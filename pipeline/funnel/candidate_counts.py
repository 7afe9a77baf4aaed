"""The candidate table's own count, and the check that it holds one row per input record, each with its fate.

The job that writes the table (``pipeline.write.candidate_table``) also
writes ``stats/candidates/_summary.json``: the files it wrote with their
rows and bytes, the input records the rows stand for (one each, but a
reader's marker of unreadable rows stands for the rows its file states, as
in the funnel), and those records per fate (a split, or a first reason),
counted from the rows as they were written. The publication compares that summary
with the funnel (``table_problems``) and with one listing of the directory
(``file_problems``): a row lost or counted twice, a fate that disagrees with
the funnel, or a file missing or of another size stops the commit, as a
shard would.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

from common import state_files as sf

#: Where a version keeps its candidate table, and the table's summary.
CANDIDATES_DIR = "stats/candidates"
SUMMARY_FILE = f"{CANDIDATES_DIR}/_summary.json"
FORMAT_VERSION = 1


def table_file(index: int, count: int) -> str:
    """A table file's path inside the version: ``stats/candidates/part-00000-of-00004.parquet``."""
    return f"{CANDIDATES_DIR}/part-{index:05d}-of-{count:05d}.parquet"


def summary_schema(doc) -> dict:
    """``_summary.json`` as the job writes it, checked (``common.state_files``): rows, rows per fate, files."""
    sf.obj(doc)
    sf.whole(sf.field(doc, "rows"), "rows")
    sf.optional(doc, "records", sf.whole)
    sf.mapping(sf.field(doc, "fates"), "fates", sf.whole, max_len=100_000)
    files = sf.mapping(sf.field(doc, "files"), "files", sf.obj, max_len=10_000_000)
    for name, entry in files.items():
        sf.whole(sf.field(entry, "bytes", f"files.{name}"), f"files.{name}.bytes")
    return doc


def funnel_fates(funnel: Mapping) -> Dict[str, int]:
    """``{split or reason: records}`` as the funnel counts them."""
    fates = {split: int(n) for split, n in (funnel.get("written") or {}).items() if int(n)}
    for stage in funnel.get("stages") or []:
        for reason, n in (stage.get("rejected") or {}).items():
            if int(n):
                fates[reason] = fates.get(reason, 0) + int(n)
    return fates


def table_problems(summary: Optional[Mapping], funnel: Mapping) -> List[str]:
    """Why the table does not account for the funnel's records (empty when it does)."""
    if summary is None:
        return [f"the job wrote no {SUMMARY_FILE}: the candidate table is incomplete"]
    problems = []
    # A reader's marker of unreadable rows is one row standing for the rows its file states (``records``).
    rows, expected = int(summary.get("records", summary.get("rows", -1))), int(funnel.get("input", 0))
    if rows != expected:
        problems.append(f"the candidate table's rows stand for {rows:,} records, the funnel's input is "
                        f"{expected:,}")
    have, want = {k: int(v) for k, v in (summary.get("fates") or {}).items() if int(v)}, funnel_fates(funnel)
    wrong = sorted(fate for fate in set(have) | set(want) if have.get(fate, 0) != want.get(fate, 0))
    if wrong:
        shown = ", ".join(f"{fate}: table {have.get(fate, 0):,}, funnel {want.get(fate, 0):,}" for fate in wrong[:3])
        problems.append(f"the candidate table's fates disagree with the funnel for {len(wrong)} fate(s) ({shown})")
    return problems


def file_problems(summary: Mapping, listed: Mapping[str, int]) -> List[str]:
    """Files the summary names that ``listed`` (path inside the version -> bytes) lacks or sizes otherwise."""
    files = summary.get("files") or {}
    wrong = [name for name, entry in sorted(files.items()) if listed.get(name) != int(entry["bytes"])]
    if not wrong:
        return []
    have = listed.get(wrong[0])
    what = "missing" if have is None else f"{have:,} bytes"
    return [f"{len(wrong)} candidate table file(s) do not match the job's summary, e.g. {wrong[0]}: {what}, "
            f"reported {int(files[wrong[0]]['bytes']):,} bytes"]
