"""A noisy benchmark pool for the model-score stage: web-like pairs with a stated share of mismatched ones.

    python -m benchmarks.noisy_pool --out P [--pairs 6000] [--mismatched_share 0.3] \\
        [--heldout_pairs 500] [--seed 0] [--processes N]

A test-data tool (the demo's sample, ``samplegen``, stays as it is): the
pictures and alt-texts are drawn with samplegen's code (scenes of coloured
shapes and crops of the photographs shipped in scikit-image / scikit-learn,
worded by ``samplegen.content``), but the pool is shaped like a DataComp
pool rather than like a test of every filter: most pairs are ordinary, and
``--mismatched_share`` of them do not match, in three kinds (shares of the
mismatched pairs, ``MISMATCH_KINDS``):

- ``another_image`` (2/3): the alt-text of another drawn scene, one that
  shows none of the picture's shapes (``samplegen.cases.describe_another_scene``);
  every ALIGN rule keeps it;
- ``boilerplate`` (1/6): the alt-texts a crawl finds on many images
  ("click here to enlarge", "image", ...), each on far more than 10 images,
  so ALIGN's images-per-text rule (and, for the short ones, its word count)
  removes them;
- ``wrong_detail`` (1/6): a drawn scene described with the right shapes but
  a wrong count (``wrong_count``) or a wrong colour named (``wrong_colour``):
  ALIGN keeps it, and only a model that reads counts and colours tells.

Of the clean pairs, ``SMALL_SHARE`` have a picture whose shorter side is
under ALIGN's 200 px (its image rule drops them: the rules also cost
clean pairs).

Written under ``--out``::

    candidates/part-0000K-of-0000N.parquet   the pool (img2dataset columns, samplegen.writer.CANDIDATE_SCHEMA)
    heldout/part-00000-of-00001.parquet     --heldout_pairs clean pairs drawn apart from the pool:
                                            held-out retrieval, the same for every corpus built from the pool
    eval/{train,test}/<class>/*.png          labelled drawn shapes (samplegen.evalset): kNN and zero-shot
    manifest.jsonl                           one line per row: pipeline_key, key, url, caption, part
                                            ("pool" or "heldout"), pairing ("clean" or "mismatched"), kind
    pool_info.json                           counts per kind and pairing, the seed, the arguments

Deterministic: row ``i`` of a part draws from
``numpy.random.default_rng([seed, stream, i, attempt])``.
"""

from __future__ import annotations

import collections
import json
import math
import os
import sys
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import cli
from common.schema import make_key
from samplegen import scenes
from samplegen.cases import BOILERPLATE, SHORT_BOILERPLATE, describe_another_scene
from samplegen.drawers import content_with_caption, draw_caption, draw_content
from samplegen.evalset import eval_specs
from samplegen.plan import CLEAN, MISMATCHED, Recipe, seeded
from samplegen.render import Workers, render_bytes, render_png
from samplegen.writer import CANDIDATE_SCHEMA, write_eval_images, write_manifest

#: Shares of the mismatched pairs, by kind (wrong_detail splits evenly into wrong_count and wrong_colour).
MISMATCH_KINDS = {"another_image": 4 / 6, "boilerplate": 1 / 6, "wrong_detail": 1 / 6}
#: Clean pairs whose picture is under ALIGN's minimum shorter side.
SMALL_SHARE = 0.05
SMALL_SIDES = (120, 200)
BOILERPLATE_TEXTS = tuple(BOILERPLATE) + tuple(SHORT_BOILERPLATE)
ROWS_PER_PART = 2000
# Random streams, apart from samplegen's (1-4).
STREAM_POOL, STREAM_HELDOUT, STREAM_ORDER = 11, 12, 13


def kind_counts(pairs: int, mismatched_share: float) -> Dict[str, int]:
    """Rows per kind of a pool of ``pairs``; the mismatched kinds sum to ``round(share * pairs)``."""
    mismatched = round(mismatched_share * pairs)
    another = round(MISMATCH_KINDS["another_image"] * mismatched)
    boilerplate = round(MISMATCH_KINDS["boilerplate"] * mismatched)
    detail = mismatched - another - boilerplate
    clean = pairs - mismatched
    small = round(SMALL_SHARE * clean)
    return {"clean": clean - small, "small": small, "another_image": another, "boilerplate": boilerplate,
            "wrong_count": detail - detail // 2, "wrong_colour": detail // 2}


def _ordinary(rng) -> dict:
    spec, caption = content_with_caption(rng)
    return {"spec": spec, "caption": caption}


def _small(rng) -> dict:
    shorter = int(rng.integers(*SMALL_SIDES))
    longer = int(round(shorter * rng.uniform(1.0, 1.6)))
    spec, caption = content_with_caption(rng, size=(longer, shorter) if rng.random() < 0.6 else (shorter, longer))
    return {"spec": spec, "caption": caption}


def _another_image(rng) -> dict:
    spec = draw_content(rng)
    return {"spec": spec, "caption": describe_another_scene(rng, spec)}


def _boilerplate(rng) -> dict:
    return {"spec": draw_content(rng), "caption": BOILERPLATE_TEXTS[int(rng.integers(len(BOILERPLATE_TEXTS)))]}


def _names(caption: str, word: str) -> bool:
    return f" {word} " in f" {caption.lower()} "


def _wrong_count(rng) -> Optional[dict]:
    """A scene worded with its first group's count changed (the wording must say the wrong number)."""
    spec = draw_content(rng, photo_share=0)
    group = spec["groups"][0]
    count = int(rng.choice([c for c in range(1, 6) if c != group["count"]]))
    told = dict(spec, groups=[dict(group, count=count)] + spec["groups"][1:])
    said = scenes.NUMBER_WORDS.get(count)
    accept = (lambda c: _names(c, said)) if said else (lambda c: not _names(c, scenes.PLURALS[group["shape"]]))
    caption = draw_caption(told, rng, lambda c: 3 <= len(c.split()) <= 20 and accept(c))
    return {"spec": spec, "caption": caption} if caption else None


def _wrong_colour(rng) -> Optional[dict]:
    """A scene worded with its first group's colour changed, the wrong colour named."""
    spec = draw_content(rng, photo_share=0)
    group = spec["groups"][0]
    options = [c for c in scenes.VISIBLE_ON[spec["background"]] if c != group["colour"]]
    colour = options[int(rng.integers(len(options)))]
    told = dict(spec, groups=[dict(group, colour=colour)] + spec["groups"][1:])
    for _ in range(10):
        caption = draw_caption(told, rng, lambda c: 3 <= len(c.split()) <= 20 and _names(c, colour))
        if caption:
            return {"spec": spec, "caption": caption}
    return None


DRAWERS = {"clean": _ordinary, "small": _small, "another_image": _another_image, "boilerplate": _boilerplate,
           "wrong_count": _wrong_count, "wrong_colour": _wrong_colour}
PAIRING = {"clean": CLEAN, "small": CLEAN}


def draw_rows(counts: Dict[str, int], seed: int, stream: int) -> List[dict]:
    """Every row of one part (kinds in a seeded random order), each with its spec and alt-text."""
    kinds = [kind for kind, count in counts.items() for _ in range(count)]
    order = seeded(seed, STREAM_ORDER, stream).permutation(len(kinds))
    rows = []
    for index, position in enumerate(order):
        kind = kinds[position]
        for attempt in range(100):
            drawn = DRAWERS[kind](seeded(seed, stream, index, attempt))
            if drawn is not None:
                break
        else:
            raise RuntimeError(f"no {kind} row drawn at {index}")
        token = seeded(seed, stream, index, 999).bytes(5).hex()
        part = "pool" if stream == STREAM_POOL else "heldout"
        url = f"https://img.example.com/{part}/{index:06d}-{token}.jpg"
        rows.append({"kind": kind, "pairing": PAIRING.get(kind, MISMATCHED), "url": url, **drawn})
    return rows


def _render(spec: dict) -> bytes:
    return render_bytes(Recipe(content=spec, size=tuple(spec["size"]), encode=("jpeg", 88)))


def write_part(rows: List[dict], directory: str, name: str, part: str, workers: Workers) -> List[dict]:
    """One Parquet file of ``rows``; their manifest lines."""
    images = workers.map(_render, [row["spec"] for row in rows])
    manifest = []
    columns = collections.defaultdict(list)
    for index, (row, data) in enumerate(zip(rows, images)):
        key = f"{part[0]}{index:07d}"
        width, height = row["spec"]["size"]
        for column, value in (("key", key), ("url", row["url"]), ("caption", row["caption"]), ("status", "success"),
                              ("error_message", None), ("width", width), ("height", height), ("jpg", data)):
            columns[column].append(value)
        manifest.append({"pipeline_key": make_key(row["url"], row["caption"]), "key": key, "url": row["url"],
                         "caption": row["caption"], "part": part, "pairing": row["pairing"], "kind": row["kind"]})
    table = pa.table({f.name: pa.array(columns[f.name], f.type) for f in CANDIDATE_SCHEMA}, schema=CANDIDATE_SCHEMA)
    os.makedirs(directory, exist_ok=True)
    pq.write_table(table, os.path.join(directory, name), row_group_size=500, compression="snappy")
    return manifest


def write_pool(out: str, pairs: int = 6000, mismatched_share: float = 0.3, heldout_pairs: int = 500,
               seed: int = 0, processes: int = 0) -> dict:
    """Draw, render and write the pool under ``out``; returns what pool_info.json holds."""
    counts = kind_counts(pairs, mismatched_share)
    manifest = []
    with Workers(processes or os.cpu_count() or 1) as workers:
        rows = draw_rows(counts, seed, STREAM_POOL)
        parts = max(1, math.ceil(len(rows) / ROWS_PER_PART))
        bounds = np.linspace(0, len(rows), parts + 1).round().astype(int)
        for i in range(parts):
            manifest += write_part(rows[bounds[i]:bounds[i + 1]], os.path.join(out, "candidates"),
                                   f"part-{i:05d}-of-{parts:05d}.parquet", "pool", workers)
        held = draw_rows({"clean": heldout_pairs}, seed, STREAM_HELDOUT)
        manifest += write_part(held, os.path.join(out, "heldout"), "part-00000-of-00001.parquet", "heldout", workers)
        evaluation = eval_specs(seed)
        pngs = workers.map(render_png, [spec for *_, spec in evaluation], chunksize=8)
    write_eval_images(out, evaluation, pngs)
    write_manifest(out, manifest)
    pool = [m for m in manifest if m["part"] == "pool"]
    info = {"pairs": pairs, "mismatched_share": mismatched_share, "heldout_pairs": heldout_pairs, "seed": seed,
            "kinds": dict(collections.Counter(m["kind"] for m in pool)),
            "pairings": dict(collections.Counter(m["pairing"] for m in pool)),
            "eval_images": len(evaluation), "zeroshot_classes": list(scenes.SHAPES)}
    with open(os.path.join(out, "pool_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    return info


def main(argv=None) -> int:
    parser = cli.ArgumentParser(prog="python -m benchmarks.noisy_pool", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--pairs", type=int, default=6000, help="pairs in the pool")
    parser.add_argument("--mismatched_share", type=float, default=0.3, help="share of the pool that is mismatched")
    parser.add_argument("--heldout_pairs", type=int, default=500, help="clean held-out pairs, drawn apart")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=0, help="worker processes (0: one per CPU)")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.heldout_pairs < 0:
        parser.error("--pairs must be >= 1 and --heldout_pairs >= 0")
    if not 0.0 <= args.mismatched_share <= 1.0:
        parser.error("--mismatched_share must be in [0, 1]")
    info = write_pool(args.out, args.pairs, args.mismatched_share, args.heldout_pairs, args.seed, args.processes)
    print(f"noisy pool: {args.pairs} pairs ({', '.join(f'{k} {v}' for k, v in sorted(info['kinds'].items()))}), "
          f"{args.heldout_pairs} held out, {info['eval_images']} eval images -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
