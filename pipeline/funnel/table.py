"""The funnel as the build prints it: the conservation checks and the text table.

``check_funnel`` recomputes the law ``input == written + rejected`` and the
stage-by-stage arithmetic from the numbers in ``stats/funnel.json``;
``format_funnel`` is the table that ``python -m pipeline.build`` and
``python -m pipeline.audit`` print. Nothing here draws or writes: the
launcher needs none of the HTML report (``pipeline.audit``) to print its
funnel.
"""

from __future__ import annotations

import json
from typing import List

from filters import stages

#: The funnel's file in a build's ``stats/`` directory.
FUNNEL_FILE = "funnel.json"
TOP_REASONS = 3


def as_int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def stage_rejected(row: dict) -> int:
    return sum(as_int(c) for c in (row.get("rejected") or {}).values())


def check_funnel(funnel: dict) -> List[str]:
    """Every way the funnel breaks the conservation law; ``[]`` when it holds.

    The law is recomputed from the numbers, never taken from the file's own
    ``conserved`` flag (which is checked against it too).
    """
    problems = []
    total_in = as_int(funnel.get("input"))
    written = sum(as_int(v) for v in (funnel.get("written") or {}).values())
    rows = funnel.get("stages") or []
    by_stage = sum(stage_rejected(row) for row in rows)
    rejected_total = as_int(funnel.get("rejected_total", by_stage))
    if total_in != written + rejected_total:
        diff = total_in - written - rejected_total
        what = f"{diff:,} record(s) unaccounted for" if diff > 0 else f"{-diff:,} record(s) counted twice"
        problems.append(
            f"CONSERVATION CHECK FAILED: input {total_in:,} != written {written:,} + rejected {rejected_total:,} ({what})"
        )
    if rejected_total != by_stage:
        problems.append(f"rejected_total {rejected_total:,} != sum of stage rejections {by_stage:,}")
    if "conserved" in funnel and bool(funnel["conserved"]) != (total_in == written + rejected_total):
        problems.append(f"funnel.json says conserved={funnel['conserved']} but the numbers say otherwise")
    expected = total_in
    for row in rows:
        name = row.get("stage", "?")
        if name not in stages.STAGE_INDEX and not row.get("extra"):
            problems.append(f"unknown stage {name!r}")
        n_in, n_out = as_int(row.get("in")), as_int(row.get("out"))
        if n_in != expected:
            problems.append(f"stage {name}: in {n_in:,} != previous stage's out {expected:,}")
        if n_in - stage_rejected(row) != n_out:
            problems.append(f"stage {name}: in {n_in:,} - rejected {stage_rejected(row):,} != out {n_out:,}")
        if not row.get("ran", True) and stage_rejected(row):
            problems.append(f"stage {name}: marked not run but rejected {stage_rejected(row):,}")
        expected = n_out
    if rows and expected != written:
        problems.append(f"last stage's out {expected:,} != written {written:,}")
    order = [row.get("stage") for row in rows if row.get("stage") in stages.STAGE_INDEX]
    if order != sorted(order, key=stages.STAGE_INDEX.get):
        problems.append("stages are not in the order of filters/stages.py")
    reading = funnel.get("reading") or {}
    if reading:
        accounted = sum(as_int(reading.get(name)) for name in ("read", "unread", "unknown_losses"))
        if accounted != total_in:
            problems.append(f"reading: {accounted:,} records read, unread or lost != input {total_in:,}")
    return problems


def reading_line(funnel: dict) -> str:
    """What the files state against what was read, when they differ ("" when every stated record was read).

    A reader counts a row it could not read as input, rejected under its
    marker's reason (``pipeline.readers.losses``), so the input is what the
    files state; this line says how much of it was never read.
    """
    reading = funnel.get("reading") or {}
    unread, unknown, beyond = (as_int(reading.get(n)) for n in ("unread", "unknown_losses", "beyond_stated"))
    if not (unread or unknown or beyond):
        return ""
    total_in = as_int(funnel.get("input"))
    parts = [f"{as_int(reading.get('read')):,} read", f"{unread:,} stated but unreadable (rejected under read/)"]
    if unknown:
        parts.append(f"{unknown:,} file(s) cut short after an unknown number of records (one read/ record each)")
    if beyond:
        parts.append(f"{beyond:,} read beyond what their files state")
    return f"input: the files state {total_in - beyond:,} records; " + ", ".join(parts)


def percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _top_reasons(row: dict, limit: int = TOP_REASONS) -> str:
    reasons = sorted((row.get("rejected") or {}).items(), key=lambda kv: (-as_int(kv[1]), kv[0]))
    reasons = [(r, as_int(c)) for r, c in reasons if as_int(c)]
    shown = [f"{r.split('/', 1)[-1]} {c:,}" for r, c in reasons[:limit]]
    if len(reasons) > limit:
        shown.append(f"+{len(reasons) - limit} more")
    return ", ".join(shown)


def _override(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return json.dumps(value)


def format_funnel(funnel: dict) -> str:
    """The funnel as an aligned text table, then written/rejected totals and checks."""
    total_in = as_int(funnel.get("input"))
    rows = funnel.get("stages") or []
    header = ("#", "stage", "in", "rejected", "out", "% of input", "top reasons")
    table = []
    for i, row in enumerate(rows, 1):
        ran = row.get("ran", True)
        rejected = stage_rejected(row)
        table.append(
            (
                str(i),
                str(row.get("stage", "?")),
                f"{as_int(row.get('in')):,}",
                f"{rejected:,}" if ran else "-",
                f"{as_int(row.get('out')):,}",
                percent(as_int(row.get("out")), total_in),
                _top_reasons(row) if ran else "(not run)",
            )
        )
    widths = [max(len(r[c]) for r in table + [header]) for c in range(len(header))]
    left = {1, 6}  # stage names and reasons read left to right, numbers right-aligned

    def line(cells):
        parts = [cell.ljust(w) if c in left else cell.rjust(w) for c, (cell, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    dataset = funnel.get("dataset") or "?"
    preset = repr(funnel.get("preset_name") or "?")
    overrides = funnel.get("preset_overrides") or {}
    if overrides:
        preset += " with " + ", ".join(f"{k}={_override(v)}" for k, v in overrides.items())
    out = [f"funnel of {dataset!r} (preset {preset}): {total_in:,} input records"]
    out += [reading_line(funnel)] if reading_line(funnel) else []
    out.append(line(header))
    out.append("  ".join("-" * w for w in widths))
    out += [line(cells) for cells in table]
    notes = [(row.get("stage", "?"), row["note"]) for row in rows if row.get("note")]
    if notes:
        out.append("notes:")
        out += [f"  {name}: {note}" for name, note in notes]
    written = {k: as_int(v) for k, v in (funnel.get("written") or {}).items()}
    written_total = sum(written.values())
    rejected_total = as_int(funnel.get("rejected_total", sum(stage_rejected(r) for r in rows)))
    splits = ", ".join(f"{k} {v:,}" for k, v in written.items()) or "nothing"
    out.append(f"written: {splits} ({written_total:,} total, {percent(written_total, total_in)} of input)")
    out.append(f"rejected: {rejected_total:,} ({percent(rejected_total, total_in)} of input)")
    problems = check_funnel(funnel)
    if problems:
        bar = "!" * 78
        out += [bar] + [f"!!! {p}" for p in problems] + [bar]
    else:
        out.append(f"conservation: input {total_in:,} == written {written_total:,} + rejected {rejected_total:,}  OK")
    return "\n".join(out)
