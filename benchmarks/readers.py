"""Reader throughput per input format, records per CPU-second (one process, no Beam).

    python -m benchmarks.readers [--records 2000] [--repeats 3] [--json PATH]

The same records (distinct 256x256 JPEGs, as img2dataset stores them by
default, with captions and img2dataset's metadata) are written in every
format the build reads: img2dataset-style Parquet with image bytes, a
WebDataset tar with its metadata Parquet, the ``files`` folder with its
Parquet, this project's TFRecord shards, and TSV/JSONL URL lists (no
images). Each is then read with its ``pipeline.readers`` module into
``Candidate``/``Rejection`` records; the figure is records per CPU-second of
this process (``time.process_time``), the median over ``--repeats``, so it is
stable on a shared machine. Writes ``benchmarks/results/readers.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tarfile
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from benchmarks import harness, record
from common.schema import Candidate, make_key
from pipeline import readers
from pipeline.write import shards
from common import tfrecord_io as tfrecord
from pipeline.readers.rows import Columns


def make_rows(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).resize((256, 256), Image.BILINEAR).save(out, format="JPEG", quality=90)
        url = f"https://images.example/{i}.jpg"
        caption = f"a photograph number {i} of a scene with things"
        rows.append({
            "key": f"{i:09d}", "url": url, "caption": caption, "status": "success", "error_message": None,
            "width": 256, "height": 256, "original_width": 640, "original_height": 480,
            "sha256": f"{i:064x}", "jpg": out.getvalue(),
        })
    return rows


def write_formats(rows, directory: str) -> dict:
    """Every format's file(s) for the same rows; returns ``{format: path to read}``."""
    paths = {}
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(directory, "parquet.parquet"))
    paths["parquet"] = os.path.join(directory, "parquet.parquet")

    meta_rows = [{k: v for k, v in r.items() if k != "jpg"} for r in rows]
    wds = os.path.join(directory, "wds")
    os.makedirs(wds)
    pq.write_table(pa.Table.from_pylist(meta_rows), os.path.join(wds, "00000.parquet"))
    with tarfile.open(os.path.join(wds, "00000.tar"), "w") as tar:
        for r in rows:
            for field, data in (("jpg", r["jpg"]), ("txt", r["caption"].encode()),
                                ("json", json.dumps({k: v for k, v in r.items() if k != "jpg"}).encode())):
                info = tarfile.TarInfo(f"{r['key']}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    paths["webdataset"] = os.path.join(wds, "00000.tar")

    files = os.path.join(directory, "files")
    os.makedirs(os.path.join(files, "00000"))
    pq.write_table(pa.Table.from_pylist(meta_rows), os.path.join(files, "00000.parquet"))
    for r in rows:
        base = os.path.join(files, "00000", r["key"])
        for field, data in (("jpg", r["jpg"]), ("txt", r["caption"].encode()),
                            ("json", json.dumps({k: v for k, v in r.items() if k != "jpg"}).encode())):
            with open(f"{base}.{field}", "wb") as f:
                f.write(data)
    paths["files"] = os.path.join(files, "00000.parquet")

    examples = []
    for r in rows:
        candidate = Candidate(
            key=make_key(r["url"], r["caption"]), url=r["url"], alt_text=r["caption"], image=r["jpg"],
            text=r["caption"], width=640, height=480, stored_width=256, stored_height=256,
            sha256=r["sha256"], phash="0" * 16, carried=(("key", r["key"]),),
        )
        examples.append(shards.to_example(candidate, ("key",)))
    paths["tfrecord"] = os.path.join(directory, "corpus-train.tfrecord-00000-of-00001")
    with open(paths["tfrecord"], "wb") as f:
        tfrecord.write_records(f, examples)

    paths["tsv"] = os.path.join(directory, "urls.tsv")
    with open(paths["tsv"], "w") as f:
        f.write("url\tcaption\n" + "".join(f"{r['url']}\t{r['caption']}\n" for r in rows))
    paths["jsonl"] = os.path.join(directory, "urls.jsonl")
    with open(paths["jsonl"], "w") as f:
        f.write("".join(json.dumps({"url": r["url"], "caption": r["caption"]}) + "\n" for r in rows))
    return paths


def measure(fmt: str, path: str, expected: int, repeats: int) -> dict:
    reader = readers.FORMATS[fmt]
    counts = []
    timing = harness.timed(lambda: counts.append(sum(1 for _ in reader.read_file(path, Columns()))), repeats)
    if any(count != expected for count in counts):
        raise RuntimeError(f"{fmt}: read {counts} records of {expected}")
    return {"records": expected, "records_per_cpu_s": round(statistics.median(expected / s for s in timing.cpus), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    run = record.Run()
    rows = make_rows(args.records)
    figures = {}
    with tempfile.TemporaryDirectory() as directory:
        paths = write_formats(rows, directory)
        for fmt, path in paths.items():
            figures[fmt] = measure(fmt, path, len(rows), args.repeats)
            print(f"{fmt:11s} {figures[fmt]['records_per_cpu_s']:>10,.0f} records per CPU-s", flush=True)
    run.write("readers", figures, args.json)


if __name__ == "__main__":
    main()
