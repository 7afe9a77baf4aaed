"""Reading a build's stats for the audit: every file optional, every damage said, nothing fatal but the funnel.

Any stats file may be missing (its stage did not run) or damaged: the
report says so, and counts the lines of a ``.jsonl`` file it could not
read. Paths may be local or anything Beam's FileSystems reads (``gs://``).
"""

from __future__ import annotations

import json
from typing import List, Optional, Tuple

from common import files
from pipeline.funnel.stats_files import NSFW_GALLERY_FILE
from pipeline.funnel.table import FUNNEL_FILE
from pipeline.what_if.rules import WHAT_IF_FILE

STATS_DIR = "stats"
SAMPLES_FILE = "rejected_samples.jsonl"
DISTRIBUTIONS_FILE = "distributions.json"
NEAR_DUPLICATES_FILE = "near_duplicates.jsonl"  # the report's name for the pairs; read as one file without shards
NEAR_DUPLICATES_SHARDS = "near_duplicates-[0-9]*-of-[0-9]*.jsonl"  # pipeline.stages.near_duplicates.PAIRS_FILE_PATTERN
REPORT_FILE = "report.html"
CONCEPTS_FILE = "concepts.json"

#: What to do about a damaged stats file.
REMEDY = "restore it, or rebuild the corpus (python -m pipeline.build ... --overwrite)"


def _read_text(path: str) -> Optional[str]:
    """The file's text (bytes that are not UTF-8 become U+FFFD: a damaged file still parses as far as it can)."""
    return files.read_bytes(path).decode("utf-8", "replace") if files.exists(path) else None


def stats_dir_of(data_dir: str) -> str:
    """``<corpus>/stats`` for a build output (its committed version) or a corpus; ``DIR`` itself if it is a stats dir."""
    nested = files.join(data_dir, STATS_DIR)
    if files.exists(files.join(nested, FUNNEL_FILE)):
        return nested
    if files.exists(files.join(data_dir, FUNNEL_FILE)):
        return data_dir
    from common.corpus_dir import read_dir

    return files.join(read_dir(data_dir), STATS_DIR)  # a build's output: its committed version


def _read_jsonl(text: Optional[str]) -> Tuple[List[dict], int]:
    """Rows and the number of unreadable lines (counted, not fatal)."""
    if text is None:
        return [], 0
    rows, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def load_stats(data_dir: str) -> dict:
    """Everything the audit reads; a missing file is ``None`` (samples: ``[]``)."""
    stats_dir = stats_dir_of(data_dir)
    loaded = {"stats_dir": stats_dir, "missing": [], "unreadable": {}}

    def read_json(name, optional=False):
        text = _read_text(files.join(stats_dir, name))
        if text is None:
            if not optional:
                loaded["missing"].append(name)
            return None
        try:
            value = json.loads(text)
        except ValueError as err:
            loaded["unreadable"][name] = f"not valid JSON ({err}): truncated or corrupt"
            return None
        if not isinstance(value, dict):
            loaded["unreadable"][name] = f"a JSON {type(value).__name__}, not an object"
            return None
        return value

    def read_jsonl(name, optional=False):
        text = _read_text(files.join(stats_dir, name))
        if text is None and not optional:
            loaded["missing"].append(name)
        rows, bad = _read_jsonl(text)
        if bad:
            loaded["unreadable"][name] = f"{bad} unreadable line(s) skipped"
        return rows

    def read_pairs():
        # The build writes the pairs in files by key hash, each sorted on its
        # own; merged into one sorted list, the page does not depend on the sharding.
        from common.files import escape_glob

        shards = files.match(files.join(escape_glob(stats_dir), NEAR_DUPLICATES_SHARDS))
        if not shards:
            return read_jsonl(NEAR_DUPLICATES_FILE)
        rows, bad = [], 0
        for path in shards:
            shard_rows, shard_bad = _read_jsonl(files.read_text(path))
            rows.extend(shard_rows)
            bad += shard_bad
        if bad:
            loaded["unreadable"][NEAR_DUPLICATES_FILE] = f"{bad} unreadable line(s) skipped"
        return sorted(rows, key=lambda r: (str(r.get("key")), str(r.get("index_set")), str(r.get("index_key"))))

    loaded["funnel"] = read_json(FUNNEL_FILE)
    loaded["distributions"] = read_json(DISTRIBUTIONS_FILE)
    loaded["samples"] = read_jsonl(SAMPLES_FILE)
    loaded["near_duplicates"] = read_pairs()
    # Only a build with --concepts (TOnICS) writes it: absent is not "missing".
    loaded["concepts"] = read_json(CONCEPTS_FILE, optional=True)
    loaded["what_if"] = read_json(WHAT_IF_FILE, optional=True)  # a build before the what-if has none
    loaded["nsfw_gallery"] = read_jsonl(NSFW_GALLERY_FILE, optional=True)  # only a build that ran the NSFW stage
    return loaded
