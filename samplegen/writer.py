"""The writer: a settled plan -> Parquet parts, manifest, evaluation PNGs, sample_info.json.

Rows are shuffled across the parts; the last part has no ``caption`` column
at all. A recipe used by several rows is rendered once.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.images import open_image
from samplegen import scenes
from samplegen.evalset import EVAL_SET, eval_path
from samplegen.plan import MIN_NGRAM_COUNT, SAMPLE_NUM_CLUSTERS, STREAM_SHUFFLE, Plan, Row, row_key, seeded
from samplegen.render import Workers, render_bytes, render_png


CANDIDATE_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("url", pa.string()),
    ("caption", pa.string()),
    ("status", pa.string()),
    ("error_message", pa.string()),
    ("width", pa.int64()),
    ("height", pa.int64()),
    ("jpg", pa.binary()),
])
MISSING_COLUMN_SCHEMA = pa.schema([f for f in CANDIDATE_SCHEMA if f.name != "caption"])

ROWS_PER_PART = 5000
MIN_PARTS = 3
ROW_GROUP_SIZE = 1000


def _reported_size(row: Row, data: Optional[bytes]):
    if row.reported_size is None or data is None:
        return None, None
    if row.reported_size != "header":
        return row.reported_size
    with open_image(data) as img:
        return img.size


def _oriented_size(row: Row) -> Optional[List[int]]:
    recipe = row.recipe
    if recipe is None or recipe.raw is not None:
        return None
    if recipe.header_size:
        return list(recipe.header_size)
    size = recipe.size
    if recipe.edit and recipe.edit[0] == "resize":
        size = (round(size[0] * recipe.edit[1]), round(size[1] * recipe.edit[1]))
    return list(size)


def write_plan(plan: Plan, out: str, workers: Optional[Workers] = None) -> dict:
    """Render and write a plan's files; returns what sample_info.json holds."""
    seed, evaluation = plan.seed, plan.evaluation
    workers = workers or Workers(1)

    main_rows = [r for r in plan.rows if not r.missing_column]
    extra_rows = [r for r in plan.rows if r.missing_column]
    order = seeded(seed, STREAM_SHUFFLE).permutation(len(main_rows))
    main_rows = [main_rows[i] for i in order]
    num_main_parts = max(MIN_PARTS, math.ceil(len(main_rows) / ROWS_PER_PART))
    num_parts = num_main_parts + 1
    bounds = np.linspace(0, len(main_rows), num_main_parts + 1).round().astype(int)
    parts = [main_rows[bounds[i]:bounds[i + 1]] for i in range(num_main_parts)] + [extra_rows]

    os.makedirs(os.path.join(out, "candidates"), exist_ok=True)
    cache: Dict[int, bytes] = {}  # recipes used by several rows, rendered once
    uses = collections.Counter(id(r.recipe) for r in plan.rows if r.recipe is not None)
    manifest, total_bytes = [], 0
    for part_index, rows in enumerate(parts):
        name = f"part-{part_index:05d}-of-{num_parts:05d}.parquet"
        todo = {id(r.recipe): r.recipe for r in rows if r.recipe is not None and id(r.recipe) not in cache}
        rendered = dict(zip(todo, workers.map(render_bytes, list(todo.values()))))
        columns = collections.defaultdict(list)
        for row_index, row in enumerate(rows):
            data = None
            if row.recipe is not None:
                data = cache[id(row.recipe)] if id(row.recipe) in cache else rendered[id(row.recipe)]
                if uses[id(row.recipe)] > 1:
                    cache[id(row.recipe)] = data
            key = f"{part_index:05d}{row_index:04d}"
            width, height = _reported_size(row, data)
            columns["key"].append(key)
            columns["url"].append(row.url)
            columns["caption"].append(row.caption)
            columns["status"].append(row.status)
            columns["error_message"].append(row.error_message)
            columns["width"].append(width)
            columns["height"].append(height)
            columns["jpg"].append(data)
            manifest.append({
                "pipeline_key": row_key(row), "url": row.url, "case": row.case, "expected": row.expected,
                "note": row.note, "key": key, "file": name, "size": _oriented_size(row), "pairing": row.pairing,
                "expected_with_model_score": row.expected_with_model_score,
            })
        schema = MISSING_COLUMN_SCHEMA if rows is extra_rows else CANDIDATE_SCHEMA
        table = pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema}, schema=schema)
        path = os.path.join(out, "candidates", name)
        pq.write_table(table, path, row_group_size=ROW_GROUP_SIZE, compression="snappy")
        total_bytes += os.path.getsize(path)

    write_manifest(out, manifest)
    pngs = workers.map(render_png, [spec for *_, spec in evaluation], chunksize=8)
    total_bytes += write_eval_images(out, evaluation, pngs)

    fates = collections.Counter(line["expected"] for line in manifest)
    pairings = collections.Counter(line["pairing"] or "none" for line in manifest)
    info = {
        "num_candidates": plan.num_candidates,
        "num_rows": len(manifest),
        "num_planted_rows": len(manifest) - plan.num_candidates,
        "num_cases": len({line["case"] for line in manifest}),
        "num_eval_images": len(evaluation),
        "num_bytes": total_bytes,
        "seed": seed,
        "parts": [f"candidates/part-{i:05d}-of-{num_parts:05d}.parquet" for i in range(num_parts)],
        "eval_images": f"{EVAL_SET}=eval/test",
        "eval_train_images": "eval/train",
        "zeroshot_classes": list(scenes.SHAPES),
        "build_overrides": build_overrides(),
        "expected_fates": dict(sorted(fates.items())),
        "pairings": dict(sorted(pairings.items())),
        "expected_with_model_score": dict(sorted(collections.Counter(
            line["expected_with_model_score"] for line in manifest if line["expected_with_model_score"] != line["expected"]
        ).items())),
        "checks": plan.facts,
    }
    with open(os.path.join(out, "sample_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    return info


def write_manifest(out: str, manifest: List[dict]) -> None:
    """``out/manifest.jsonl``: one JSON line per candidate row, keys sorted."""
    with open(os.path.join(out, "manifest.jsonl"), "w", encoding="utf-8") as f:
        for line in manifest:
            f.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")


def write_eval_images(out: str, evaluation, pngs) -> int:
    """The labelled evaluation images (``samplegen.evalset.eval_specs`` and their PNGs) under ``out``; their
    bytes."""
    written = 0
    for (split, label, index, _), data in zip(evaluation, pngs):
        path = os.path.join(out, eval_path(split, label, index))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        written += len(data)
    return written


def build_overrides() -> List[str]:
    """``--set`` values the build needs for this tiny corpus (see the module doc)."""
    return ["vocab_size=0", f"min_ngram_count={MIN_NGRAM_COUNT}", f"num_clusters={SAMPLE_NUM_CLUSTERS}"]
