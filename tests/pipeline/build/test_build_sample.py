"""End to end: the real Beam job on the embedded sample, checked record by record."""

import collections
import glob
import io
import json
import os

import numpy as np
import pytest
import pyarrow.parquet as pq
import tensorflow as tf
from PIL import Image, ImageOps

from common.schema import make_key, shard_glob, tf_feature_spec
from conftest import build_args
from corpus_paths import committed
from filters.image import to_rgb
from filters.text import normalize_text
from pipeline.build import launcher


def read_split(data_dir, split):
    files = sorted(glob.glob(shard_glob(str(data_dir), split)))
    spec = tf_feature_spec()
    return [
        {k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
        for r in tf.data.TFRecordDataset(files)
    ]


def read_ledger(data_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(data_dir, "stats", "rejected", "*.jsonl"))):
        rows += [json.loads(line) for line in open(path)]
    return rows


def test_every_planted_case_meets_its_expected_fate(sample_dir, sample_build):
    output, _ = sample_build
    written = collections.Counter(r["key"].decode() for split in ("train", "validation") for r in read_split(output, split))
    rejected = collections.defaultdict(list)
    for row in read_ledger(output):
        rejected[row["key"]].append(row["reason"])
    manifest = [json.loads(line) for line in open(sample_dir / "manifest.jsonl")]
    by_key = collections.defaultdict(list)
    for row in manifest:
        by_key[row["pipeline_key"]].append(row)
    wrong = []
    for key, rows in by_key.items():
        expected = sorted(r["expected"] for r in rows)
        if expected == ["written_once"] * len(rows):
            got_ok = written[key] == 1 and rejected[key] == ["duplicate_pair/repeat"] * (len(rows) - 1)
        else:
            got = sorted(["written"] * written[key] + rejected[key])
            got_ok = got == expected
        if not got_ok:
            wrong.append((rows[0]["case"], expected, written[key], rejected[key]))
    assert not wrong, f"{len(wrong)} keys off their expected fate, e.g. {wrong[:10]}"


def test_counts_add_up(sample_dir, sample_build):
    output, funnel = sample_build
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in glob.glob(str(sample_dir / "candidates" / "*.parquet")))
    assert funnel["input"] == rows
    assert funnel["conserved"]
    assert funnel["input"] == sum(funnel["written"].values()) + funnel["rejected_total"]
    assert len(read_ledger(output)) == funnel["rejected_total"]
    for split, count in funnel["written"].items():
        assert len(read_split(output, split)) == count
    stages = [row["stage"] for row in funnel["stages"]]
    from filters.stages import OPTIONAL_STAGES, STAGE_NAMES

    assert stages == [name for name in STAGE_NAMES if name not in OPTIONAL_STAGES]  # no --download: no download stage


def test_shards_load_with_tfds_and_hold_what_went_in(sample_dir, sample_build):
    import tensorflow_datasets as tfds

    output, funnel = sample_build
    builder = tfds.builder_from_directory(str(output))
    assert builder.info.splits["train"].num_examples == funnel["written"]["train"]
    example = next(iter(builder.as_dataset(split="validation").take(1)))
    assert example["image"].shape[-1] == 3 and example["image"].dtype == tf.uint8

    source = {}
    for path in glob.glob(str(sample_dir / "candidates" / "*.parquet")):
        table = pq.read_table(path)
        if "caption" not in table.column_names:
            continue
        for row in table.to_pylist():
            if row["caption"] is not None and row["jpg"]:
                source[make_key(row["url"], row["caption"])] = row
    records = read_split(output, "train") + read_split(output, "validation")
    assert records
    for record in records:
        row = source[record["key"].decode()]
        assert record["texts"].decode() == normalize_text(row["caption"])
        stored = Image.open(io.BytesIO(record["image"]))
        assert stored.format == "JPEG" and stored.size == (record["width"], record["height"])
        if record["image"] != row["jpg"]:  # re-encoded: same picture, maybe resized/rotated
            # The pipeline's own colour rule (transparency on white, 16-bit scaled).
            original = to_rgb(ImageOps.exif_transpose(Image.open(io.BytesIO(row["jpg"])))).resize(stored.size)
            diff = np.abs(np.asarray(original, np.float32) - np.asarray(stored.convert("RGB"), np.float32))
            assert diff.mean() < 12, (row["url"], diff.mean())


def _file_digests(directory):
    import hashlib

    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "**", "*"), recursive=True)):
        if os.path.isfile(path) and not path.endswith(("report.html", "_BUILD.json", "manifest.json")):
            out[os.path.relpath(path, directory)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


# The whole build on worker processes: CI's integration run. The light twins in the default run build with two
# worker processes too, on smaller jobs: tests/filters/test_frequency_reference.py (the corpus stages) and
# tests/pipeline/stages/test_model_score_stage.py (the first pass and a corpus-wide cut).
@pytest.mark.integration
def test_rebuild_with_worker_processes_is_byte_identical(sample_dir, tmp_path):
    """Same input, in-process vs two worker processes: identical shards and stats."""
    first_part = sorted(glob.glob(str(sample_dir / "candidates" / "*.parquet")))[0]
    outputs = []
    for i, extra in enumerate([[], ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]]):
        out = tmp_path / f"run{i}"
        args = build_args(sample_dir, out) + extra
        args[args.index("--input") + 1] = first_part
        launcher.run(args)
        outputs.append(out)
    # The version directories differ only in what names the build (its id, start, host).
    first, second = (_file_digests(str(committed(o))) for o in outputs)
    assert first and first == second
