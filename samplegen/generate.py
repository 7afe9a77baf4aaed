"""Generate the sample: plant every case, settle, assign URLs, verify, write.

``build_plan`` makes the checked plan; ``write_sample`` plans and writes it
with a pool of worker processes (the number never changes the output).
"""

from __future__ import annotations

import os
import time
from typing import Optional

from filters.text import normalize_text, words
from samplegen.cases import (
    plant_decode_cases, plant_exif_cases, plant_format_cases, plant_frequency_cases, plant_header_cases,
    plant_mismatched, plant_missing_column, plant_near_duplicates, plant_ordinary, plant_read_cases,
    plant_size_cases, plant_text_cases,
)
from samplegen.checks import NearDuplicateGuard, settle, verify_plan
from samplegen.evalset import eval_path, eval_specs
from samplegen.plan import NEAR_DUPLICATE_EMBEDDER, STREAM_URL, Plan, seeded
from samplegen.render import Workers, render_png
from samplegen.writer import write_plan


def _slug(caption: Optional[str]) -> str:
    ascii_words = [w for w in words(normalize_text(caption or "")) if w.isascii() and w.isalnum()]
    return "-".join(ascii_words[:5]) or "image"


def assign_urls(plan: Plan) -> None:
    for row in plan.rows:
        if row.url:
            continue
        rng = seeded(plan.seed, STREAM_URL, row.slot)
        token = rng.bytes(5).hex()
        slug = _slug(row.caption)
        form = int(rng.integers(0, 4))
        if form == 0:
            path = f"uploads/{int(rng.integers(2012, 2024))}/{int(rng.integers(1, 13)):02d}/{slug}-{token}"
        elif form == 1:
            path = f"products/{int(rng.integers(10000, 999999))}/{slug}-{token}"
        elif form == 2:
            path = f"photos/{token[:2]}/{token}"
        else:
            path = f"blog/images/{slug}_{token}"
        row.url = f"https://img.example.com/{path}.{row.url_ext}"


def build_plan(num_candidates: int, seed: int, workers: Optional[Workers] = None) -> Plan:
    """Every row with its picture recipe, alt-text, URL and expected fate; checked."""
    plan = Plan(seed)
    plan.num_candidates = num_candidates
    plan.evaluation = eval_specs(seed)
    plan.eval_test = [(eval_path(split, label, index), spec) for split, label, index, spec in plan.evaluation
                      if split == "test"]
    plant_read_cases(plan)
    plant_header_cases(plan)
    plant_format_cases(plan)
    plant_size_cases(plan)
    plant_exif_cases(plan)
    plant_decode_cases(plan)
    plant_text_cases(plan)
    plant_frequency_cases(plan)
    workers = workers or Workers(1)
    pngs = workers.map(render_png, [spec for _, spec in plan.eval_test], chunksize=8)
    guard = NearDuplicateGuard([(path, png) for (path, _), png in zip(plan.eval_test, pngs)], workers)
    plant_near_duplicates(plan, guard)
    plant_missing_column(plan)
    plant_ordinary(plan, num_candidates)
    plant_mismatched(plan, num_candidates)
    rounds = settle(plan, guard)
    assign_urls(plan)
    plan.facts = verify_plan(plan)
    plan.facts.update({
        "settle_rounds": rounds,
        "near_duplicate_embedder": NEAR_DUPLICATE_EMBEDDER,
        "near_duplicate_limit": round(guard.limit, 4),
        "max_ordinary_eval_similarity": round(guard.final_max(plan), 4),
    })
    return plan


def write_sample(out: str, num_candidates: int = 3000, seed: int = 0, processes: int = 0, log=print) -> dict:
    """Plan and write the sample under ``out``; returns what sample_info.json holds."""
    started, cpu_started = time.time(), _cpu_seconds()
    processes = processes or os.cpu_count() or 1
    with Workers(processes) as workers:
        plan = build_plan(num_candidates, seed, workers)
        planned = time.time()
        info = write_plan(plan, out, workers)
    elapsed = time.time() - started
    fates = info["expected_fates"]
    log(f"sample: {info['num_rows']} rows ({num_candidates} ordinary + {info['num_planted_rows']} planted) "
        f"in {len(info['parts'])} parts, {info['num_cases']} cases, {info['num_eval_images']} eval images")
    log("sample: expected fates: " + ", ".join(f"{k} {v}" for k, v in sorted(fates.items())))
    log("sample: pairings: " + ", ".join(f"{k} {v}" for k, v in info["pairings"].items()))
    cpu = _cpu_seconds() - cpu_started
    log(f"sample: {info['num_bytes'] / 1e6:.1f} MB in {elapsed:.1f} s (planning {planned - started:.1f} s), "
        f"{info['num_rows'] / elapsed:.0f} rows/s, {processes} processes, {cpu:.1f} CPU-s -> {out}")
    return info


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the pool's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
