"""Reading a build's stats for the audit: every file optional, every damage said, nothing fatal but the funnel.

Every file is read through ``common.state_files`` with the schema its
writer declares (bounded in size and depth; types, finite numbers, ranges):
a damaged file is one line in the report naming it and what is wrong, and
the report shows what the other files hold. A damaged entry of
``distributions.json`` leaves out that plot only; a damaged line of a
``.jsonl`` file is skipped and counted. Paths may be local or anything
Beam's FileSystems reads (``gs://``).
"""

from __future__ import annotations

import heapq
from typing import Dict, List, Optional

from common import files
from common import state_files as sf
from pipeline.funnel.counts import funnel_schema
from pipeline.funnel.stats_files import (
    DISTRIBUTIONS_FILE, NSFW_GALLERY_FILE, SAMPLES_FILE, concepts_schema, distributions_schema, gallery_schema,
    pair_schema, sample_schema,
)
from pipeline.funnel.table import FUNNEL_FILE
from pipeline.what_if.rules import WHAT_IF_FILE

STATS_DIR = "stats"
NEAR_DUPLICATES_FILE = "near_duplicates.jsonl"  # the report's name for the pairs; read as one file without shards
NEAR_DUPLICATES_SHARDS = "near_duplicates-[0-9]*-of-[0-9]*.jsonl"  # pipeline.stages.near_duplicates.PAIRS_FILE_PATTERN
REPORT_FILE = "report.html"
CONCEPTS_FILE = "concepts.json"
#: Pairs kept with their thumbnails (the report shows the most similar); every pair's cosine is kept.
KEPT_PAIRS = 200
#: Sampled rejects kept (a build writes at most 20 per reason); the rest of a longer file is counted.
KEPT_SAMPLES = 20_000

#: What to do about a damaged stats file.
REMEDY = "restore it, or rebuild the corpus (python -m pipeline.build ... --overwrite)"


def stats_dir_of(data_dir: str) -> str:
    """``<corpus>/stats`` for a build output (its committed version) or a corpus; ``DIR`` itself if it is a stats dir."""
    nested = files.join(data_dir, STATS_DIR)
    if files.exists(files.join(nested, FUNNEL_FILE)):
        return nested
    if files.exists(files.join(data_dir, FUNNEL_FILE)):
        return data_dir
    from common.corpus_dir import read_dir

    return files.join(read_dir(data_dir), STATS_DIR)  # a build's output: its committed version


def what_is_wrong(error: sf.DamagedFile, path: str) -> str:
    """A ``DamagedFile`` line without the path it starts with (the report names the file itself)."""
    return str(error).removeprefix(f"{path}: ")


def read_funnel(stats_dir: str) -> Optional[dict]:
    """The checked funnel, None if absent; ``DamagedFile`` (one line) if damaged."""
    return sf.read_json(files.join(stats_dir, FUNNEL_FILE), funnel_schema, REMEDY)


class _Pairs:
    """The near-duplicate pairs as the report uses them: every cosine, and the most similar pairs whole."""

    def __init__(self):
        self.cosines: List[float] = []
        self.top: List[tuple] = []  # a heap of (cosine, order, row)

    def keep(self, rows: List[dict], row: dict) -> None:
        self.cosines.append(float(row["cosine"]))
        item = (float(row["cosine"]), len(self.cosines), row)
        if len(self.top) < KEPT_PAIRS:
            heapq.heappush(self.top, item)
        elif item[:2] > self.top[0][:2]:
            heapq.heapreplace(self.top, item)


def load_stats(data_dir: str) -> dict:
    """Everything the audit reads; a missing file is ``None`` (samples and pairs: ``[]``)."""
    from pipeline.what_if.collect import what_if_schema

    stats_dir = stats_dir_of(data_dir)
    loaded = {"stats_dir": stats_dir, "missing": [], "unreadable": {}}
    unreadable: Dict[str, str] = loaded["unreadable"]

    def read_json(name, check, optional=False):
        path = files.join(stats_dir, name)
        try:
            value = sf.read_json(path, check, REMEDY)
        except sf.DamagedFile as error:
            unreadable[name] = what_is_wrong(error, path)
            return None
        if value is None and not optional:
            loaded["missing"].append(name)
        return value

    def note_skipped(name, skipped, first):
        if skipped:
            unreadable[name] = f"{skipped:,} unreadable line(s) skipped (e.g. {first})"

    def read_samples():
        extra = [0]

        def keep(rows, row):
            if len(rows) < KEPT_SAMPLES:
                rows.append(row)
            else:
                extra[0] += 1

        lines = sf.read_jsonl(files.join(stats_dir, SAMPLES_FILE), sample_schema, keep=keep)
        if lines is None:
            loaded["missing"].append(SAMPLES_FILE)
            return []
        note_skipped(SAMPLES_FILE, lines.skipped, lines.first_problem)
        if extra[0]:
            unreadable[SAMPLES_FILE] = (unreadable.get(SAMPLES_FILE, "") + f" {extra[0]:,} sample(s) beyond "
                                        f"the first {KEPT_SAMPLES:,} not shown").strip()
        return lines.rows

    def read_gallery():
        # Only a build that ran the NSFW stage writes it: absent is not "missing".
        lines = sf.read_jsonl(files.join(stats_dir, NSFW_GALLERY_FILE), gallery_schema)
        if lines is None:
            return []
        note_skipped(NSFW_GALLERY_FILE, lines.skipped, lines.first_problem)
        return lines.rows

    def read_pairs():
        # The build writes the pairs in files by key hash, each sorted on its own; merged into one sorted
        # list, the page does not depend on the sharding.
        shards = files.match(files.join(files.escape_glob(stats_dir), NEAR_DUPLICATES_SHARDS))
        paths = shards or [files.join(stats_dir, NEAR_DUPLICATES_FILE)]
        pairs, skipped, first, found = _Pairs(), 0, "", False
        for path in paths:
            lines = sf.read_jsonl(path, pair_schema, keep=pairs.keep)
            if lines is not None:
                found = True
                skipped, first = skipped + lines.skipped, first or lines.first_problem
        if not found:
            loaded["missing"].append(NEAR_DUPLICATES_FILE)
        note_skipped(NEAR_DUPLICATES_FILE, skipped, first)
        loaded["near_duplicate_cosines"] = pairs.cosines
        rows = [row for _, _, row in pairs.top]
        return sorted(rows, key=lambda r: (r["key"], r["index_set"], r["index_key"]))

    def read_distributions():
        doc = read_json(DISTRIBUTIONS_FILE, sf.obj)
        if doc is None:
            return None
        good, damaged = distributions_schema(doc)
        if damaged:
            loaded["distribution_problems"] = damaged
            unreadable[DISTRIBUTIONS_FILE] = (f"{len(damaged)} damaged entr{'y' if len(damaged) == 1 else 'ies'} "
                                              f"not shown ({'; '.join(damaged.values())})")
        return good

    loaded["funnel"] = read_json(FUNNEL_FILE, funnel_schema)
    loaded["distributions"] = read_distributions()
    loaded["samples"] = read_samples()
    loaded["near_duplicates"] = read_pairs()
    # Only a build with --concepts (TOnICS) writes it: absent is not "missing".
    loaded["concepts"] = read_json(CONCEPTS_FILE, concepts_schema, optional=True)
    loaded["what_if"] = read_json(WHAT_IF_FILE, what_if_schema, optional=True)  # a build before the what-if has none
    loaded["nsfw_gallery"] = read_gallery()
    return loaded
