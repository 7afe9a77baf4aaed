"""What the NSFW benchmarks share: the pictures they score and how two sets of scores differ."""

from __future__ import annotations

import glob
import hashlib
import os

import numpy as np
import pyarrow.parquet as pq

from filters import open_nsfw

CUTS = (0.2, 0.8)  # Yahoo's "likely safe" and "highly probable" marks, beside the preset's threshold


def read_images(directory: str, column: str = "jpg"):
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "**", "*.parquet"), recursive=True)):
        rows += pq.read_table(path).to_pylist()
    return [row for row in rows if row.get(column)]


def sample_images(directory: str, num_candidates: int, seed: int):
    """Distinct decodable images of the sample as ``{"photograph": [...], "drawing": [...], "other": [...]}``."""
    import json

    from samplegen.generate import build_plan
    from samplegen.plan import row_key

    plan = build_plan(num_candidates, seed)
    kind_of_row = {}
    for row in plan.rows:
        content = row.recipe.content if row.recipe is not None else None
        kind_of_row[row_key(row)] = {"photo": "photograph", "scene": "drawing"}.get((content or {}).get("kind"), "other")
    with open(os.path.join(directory, "manifest.jsonl"), encoding="utf-8") as handle:
        kind_of = {line["key"]: kind_of_row[line["pipeline_key"]] for line in map(json.loads, handle)}
    groups = {"photograph": [], "drawing": [], "other": []}
    for row, _ in distinct_decodable(read_images(os.path.join(directory, "candidates"))):
        groups[kind_of[row["key"]]].append(row["jpg"])
    return groups


def distinct_decodable(rows):
    """``(row, the model's input)`` of each distinct picture the stage can decode, in order.

    The sample's planted corrupt files are left out: the stage rejects them as undecodable.
    """
    seen = set()
    for row in rows:
        digest = hashlib.sha256(row["jpg"]).digest()
        if digest in seen:
            continue
        seen.add(digest)
        try:
            prepared = open_nsfw.model_input(row["jpg"])
        except Exception:
            continue
        yield row, prepared


def differences(scores, reference, threshold: float) -> dict:
    gap = np.abs(np.asarray(scores, np.float64) - np.asarray(reference, np.float64))
    changed = {f"{cut:g}": int(((np.asarray(scores) >= cut) != (np.asarray(reference) >= cut)).sum())
               for cut in (threshold, *CUTS)}
    return {"images": len(gap), "max": float(gap.max()), "p99": float(np.quantile(gap, 0.99)),
            "median": float(np.median(gap)), "over_1e-3": int((gap > 1e-3).sum()), "decisions_changed": changed}
