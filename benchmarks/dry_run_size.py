"""The Dataflow job's size against what it reads: ``--dry_run=true`` for 10 and 10,000 input files, 10^3 and 10^5 index rows.

    python -m benchmarks.dry_run_size [--files 10,10000] [--rows 1000,100000] [--json PATH]

Each combination is one dry run through the launcher (``pipeline.build.launcher.run``)
with the align preset, ``--download``, a pair model (``--model_score``), an
evaluation set, ``--setup_file`` (this checkout's ``setup.py``) and
``--requirements_file`` (``pipeline.build.worker_requirements`` of the lock),
as ``tests/pipeline/build/test_dry_run.py`` runs it. The input files are URL
lists, all empty but the first (the launcher lists them, the workers read
them). The evaluation index has the given number of rows of random unit
vectors of the embedder's dimension in place of embedded images (embedding
10^5 images takes minutes and does not change the graph: its path is what
the graph carries). Figures: the job's steps, its graph (the serialized
portable pipeline) and CreateJob request in bytes, the largest transform
payload, and the CPU seconds of the dry run (this process plus the sdist
and ``pip freeze`` subprocesses Beam's stager runs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile

import numpy as np

from benchmarks import harness, record
from dedup import index_sets
from pipeline.build import dry_run, launcher, worker_requirements

DATAFLOW = ["--runner", "DataflowRunner", "--project", "my-project", "--region", "us-central1",
            "--temp_location", "gs://my-bucket/tmp", "--dry_run=true"]


def url_lists(directory: str, files: int) -> str:
    os.makedirs(directory)
    with open(os.path.join(directory, "a.tsv"), "w") as handle:
        handle.write("url\tcaption\n" + "".join(f"https://e.x/{i}.jpg\ta red picture {i}\n" for i in range(3)))
    for i in range(files - 1):
        os.close(os.open(os.path.join(directory, f"b-{i:05d}.tsv"), os.O_CREAT | os.O_WRONLY, 0o644))
    return os.path.join(directory, "*.tsv")


def random_index(rows: int):
    def load(specs, embedder, *args, **kwargs):
        vectors = np.random.default_rng(rows).standard_normal((rows, embedder.dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return index_sets.IndexSet(
            vectors=vectors, set_names=np.full(rows, "test"), keys=np.array([f"k{i}" for i in range(rows)]),
            variants=np.full(rows, "original"), image_ids=np.arange(rows), embedder_name=embedder.name,
            previews=[""] * rows)
    return load


def one(scratch: str, pattern: str, rows: int, requirements: str) -> dict:
    evals = os.path.join(scratch, "eval")
    if not os.path.isdir(evals):
        os.makedirs(evals)
        from PIL import Image

        Image.new("RGB", (32, 32), (200, 30, 30)).save(os.path.join(evals, "0.jpg"))  # its rows are replaced
    jobs = []
    real = dry_run.build_job

    def recording(*args, **kwargs):
        jobs.append(real(*args, **kwargs))
        return jobs[-1]

    dry_run.build_job, index_sets.load_index_sets, loader = recording, random_index(rows), index_sets.load_index_sets
    try:
        with harness.Timer() as timer, contextlib.redirect_stdout(io.StringIO()):
            launcher.run(["--input", pattern, "--output", os.path.join(scratch, "corpus"), "--preset", "align",
                          "--download", "--model_score", "tests.pipeline.score_models:colour_words",
                          "--eval_images", f"test={evals}", "--setup_file", os.path.join(harness.REPO, "setup.py"),
                          "--requirements_file", requirements, *DATAFLOW])
        cpu = timer.cpu_s
    finally:
        dry_run.build_job, index_sets.load_index_sets = real, loader
    (job,) = jobs
    return {"steps": job.steps, "graph_bytes": job.graph_bytes, "request_bytes": job.request_bytes,
            "largest_payload_bytes": job.largest_payloads[0][0], "largest_payload": job.largest_payloads[0][1],
            "cpu_s": round(cpu, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="10,10000")
    parser.add_argument("--rows", default="1000,100000")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    run = record.Run()
    figures = []
    with tempfile.TemporaryDirectory() as scratch:
        requirements = os.path.join(scratch, "worker-requirements.txt")
        with open(requirements, "w") as handle:
            handle.write("\n".join(worker_requirements.worker_requirements(
                os.path.join(harness.REPO, "requirements", "lock.txt"))))
        patterns = {int(n): url_lists(os.path.join(scratch, f"in-{n}"), int(n)) for n in args.files.split(",")}
        one(scratch, patterns[min(patterns)], 10, requirements)  # warm-up: imports, Beam's first translation
        print("| input files | index rows | steps | graph bytes | request bytes | largest payload | CPU s |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for files, pattern in sorted(patterns.items()):
            for rows in (int(r) for r in args.rows.split(",")):
                found = one(scratch, pattern, rows, requirements)
                figures.append({"files": files, "rows": rows, **found})
                print(f"| {files:,} | {rows:,} | {found['steps']} | {found['graph_bytes']:,} | {found['request_bytes']:,} "
                      f"| {found['largest_payload_bytes']:,} | {found['cpu_s']} |", flush=True)
    run.write("dry_run_size", figures, args.json)


if __name__ == "__main__":
    main()
