"""Read hostile files the way a build does, in a child process with its memory and time bounded.

``read_bounded(paths, ...)`` runs ``python read_harness.py`` on the files:
the child imports the readers, then limits its own address space to what it
holds at that point plus ``headroom`` (``RLIMIT_AS``), and reads each file
with ``pipeline.readers.file_records.file_records`` (the reader, then the count's
reconciliation, as the build's ``ParseRows`` does) twice, under a per-file
alarm.
What each file gave comes back as JSON: every record's fate, url and
ledger detail, or the exception that stopped it (a ``MemoryError`` from
the limit, a ``TimeoutError`` from the alarm), and the child's peak RSS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

#: The child may hold this much above its size after importing the readers.
HEADROOM_BYTES = 256 << 20
#: Each file must be read within this many seconds (on a loaded 2-core machine).
SECONDS_PER_FILE = 60
#: Records kept per file in the report; the hostile files hold far fewer.
KEPT_RECORDS = 10_000
#: Caps for these tests: small, so a hostile file's size can be far beyond them and still be quick to write.
TEST_LIMITS = {"max_record_bytes": 4 << 20, "max_line_bytes": 64 << 10}


def read_bounded(paths, fmt=None, limits=None, headroom=HEADROOM_BYTES, seconds=SECONDS_PER_FILE, download=False,
                 formats=None):
    """``{"files": {path: {"records": [[fate, url, detail, note], ...]} or {"error": ...}}, "peak_rss": bytes, "limit": bytes}``.

    ``fmt``: every file's format (None: from its name, as the build's ``--input`` does); ``formats``: a
    format for some of the paths (``{path: format}``), the others' is ``fmt``.
    """
    spec = {"paths": [str(p) for p in paths], "format": fmt, "limits": limits or TEST_LIMITS,
            "headroom": headroom, "seconds": seconds, "download": download,
            "formats": {str(path): value for path, value in (formats or {}).items()}}
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, os.path.join(HERE, "read_harness.py"), json.dumps(spec)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=seconds * len(spec["paths"]) + 120)
    if done.returncode != 0:
        raise AssertionError(f"the reading child failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def fates(outcome):
    """A file's records as ``[fate, ...]`` (``written`` or the reason); raises what stopped the file,
    or a second reading that gave other records (a second pass re-reads files and picks records by ordinal)."""
    if "error" in outcome:
        raise AssertionError(f"reading stopped: {outcome['error']}")
    assert outcome["same_twice"], "the same bytes read twice gave other records"
    return [record[0] for record in outcome["records"]]


def _read(read, fmt, path, columns):
    records = []
    for record in read.file_records(fmt, path, columns):
        if len(records) >= KEPT_RECORDS:  # a runaway reader: count on, keep nothing
            records[-1][3] = f"and more than {KEPT_RECORDS:,} records"
            continue
        fate = getattr(record, "reason", None) or "written"
        detail = dict(getattr(record, "detail", ()) or ())
        note = getattr(record, "alt_text", "")[:160] if fate != "written" else ""
        records.append([fate, record.url, {k: v for k, v in detail.items() if isinstance(v, (int, str))}, note])
    return records


def _child(spec):
    import resource
    import signal
    import time

    from pipeline.readers import file_records as read
    from pipeline import readers
    from pipeline.readers.limits import ReadLimits
    from pipeline.readers.rows import Columns

    columns = Columns(download=spec["download"])._replace(limits=ReadLimits(**spec["limits"]))
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = size + spec["headroom"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def alarm(signum, frame):
        raise TimeoutError(f"not read within {spec['seconds']} s")

    signal.signal(signal.SIGALRM, alarm)
    results = {}
    for path in spec["paths"]:
        fmt = readers.format_of(path, spec["formats"].get(path, spec["format"]))
        started = time.monotonic()
        signal.alarm(spec["seconds"])
        try:
            first = _read(read, fmt, path, columns)
            results[path] = {"records": first, "same_twice": _read(read, fmt, path, columns) == first}
        except BaseException as error:  # a reader's crash: reported, not fatal to the other files
            results[path] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        finally:
            signal.alarm(0)
        results[path]["seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps({"files": results, "peak_rss": own_peak_rss(), "limit": limit}))


def own_peak_rss() -> int:
    """This process's peak resident bytes since it started (VmHWM).

    Not ``ru_maxrss``: Linux carries the parent's high-water mark across fork
    and exec into it, so a child of a large test worker would report the
    worker's size.
    """
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
