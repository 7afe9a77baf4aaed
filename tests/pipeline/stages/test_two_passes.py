"""The build's two passes: what the first pass hands on, and how the second finds and writes it again.

The first pass (``pipeline.stages.judge``) keeps a record's place as its reader and
its ordinal; the second (``pipeline.write``) reads the file again and picks
records by it. These tests hold that contract on every input format, the
second pass's own rejections, and its shard layout.
"""

import collections
import glob
import json
import os
import pickle

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf
from apache_beam.testing.test_pipeline import TestPipeline

from common.schema import make_key, shard_glob, tf_feature_spec
from corpus_paths import committed
from filters.presets import get_preset
from pipeline.build import launcher
from pipeline.readers.file_records import MatchInputFiles
from pipeline.readers.rows import Columns
from pipeline.stages import judge
from pipeline.write import second_pass as write
from tests import images as made
from tests.pipeline.build.test_build_safety import QUICK, write_candidates

ALIGN = get_preset("align", ["vocab_size=0", "nsfw_threshold=1.0", "min_shorter_side=0"])


def _dump(items, path):
    with open(path, "wb") as handle:
        pickle.dump(items, handle)


def first_pass(pattern, preset=ALIGN, nsfw_factory=None):
    """The first pass alone on files: its light rows and NSFW outcomes, collected."""
    where = os.path.join(os.path.dirname(str(pattern).rstrip("*/")), "first_pass")
    record_judge = judge.RecordJudge(preset, nsfw_factory=nsfw_factory)
    with TestPipeline(runner="FnApiRunner") as p:
        out = p | MatchInputFiles(str(pattern)) | judge.JudgeFiles(record_judge, str(pattern))
        for tag in (judge.ROWS, judge.NSFW_OUTCOMES):
            _ = out[tag] | f"Collect{tag}" >> beam.combiners.ToList() | f"Dump{tag}" >> beam.Map(_dump, f"{where}.{tag}")
    return [pickle.load(open(f"{where}.{tag}", "rb")) for tag in (judge.ROWS, judge.NSFW_OUTCOMES)]


def mixed_inputs(directory):
    """A Parquet file and a WebDataset shard with its metadata Parquet: some rows bad."""
    from tests.pipeline.readers.test_readers import meta, sample, write_shard

    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "url": [f"https://e.x/p{i}.jpg" for i in range(5)],
        "caption": ["a photo of a red bus", None, "a photo of a blue car", "two cats on a sofa", "x"],
        "jpg": [made.swatch(0), made.swatch(1), b"not an image", made.swatch(3), made.swatch(4)],
    }), directory / "a.parquet")
    shard = directory / "shard"
    shard.mkdir()
    write_shard(shard, [sample("000", "https://e.x/0.jpg", "a dog on a beach"),
                        sample("002", "https://e.x/2.jpg", "a cat on a sofa")],
                [meta("000", "https://e.x/0.jpg", "a dog on a beach"),
                 meta("001", "https://e.x/1.jpg", "a page gone", "failed_to_download", "HTTP Error 404: Not Found"),
                 meta("002", "https://e.x/2.jpg", "a cat on a sofa")])
    return directory / "**"


def test_every_row_points_at_its_record_in_what_the_reader_yields(tmp_path):
    rows, _ = first_pass(mixed_inputs(tmp_path / "in"))
    assert len({r.reader for r in rows}) >= 2
    by_file = collections.defaultdict(list)
    for row in rows:
        by_file[(row.reader, row.source)].append(row)
    for (reader, source), file_rows in by_file.items():
        if not source:
            continue
        again = list(write.records_of(reader, source, Columns()))
        for row in file_rows:
            assert again[row.ordinal].key == row.key, (source, row.ordinal)


class Ones:
    name = "ones"

    def score(self, images):
        import numpy as np

        return np.ones(len(images), np.float32)


def every_image_scores_one():
    return Ones(), "ones"


def test_nsfw_reasons_and_outcomes_come_from_the_first_pass(tmp_path):
    from tests.filters.test_nsfw import width_scorer_factory

    pattern = write_candidates(tmp_path / "in", rows=6)
    preset = get_preset("align", ["vocab_size=0", "min_shorter_side=0", "nsfw_threshold=0.9"])
    # The fake scorer scores by width: made.swatch(i) pictures are 32 + i px wide, far below 190.
    rows, outcomes = first_pass(pattern, preset, width_scorer_factory)
    assert {r.reason for r in rows} == {""}
    assert outcomes == [((True, "width"), 6)]  # what the workers did, once per file
    rows, outcomes = first_pass(pattern, preset, every_image_scores_one)
    assert {r.reason for r in rows} == {"nsfw/pornographic"} and all(r.counted for r in rows)
    assert outcomes == [((True, "ones"), 6)]


def test_a_record_changed_since_the_first_pass_is_rejected_by_the_second(tmp_path):
    pattern = write_candidates(tmp_path / "in", rows=4)
    rows, _ = first_pass(pattern)
    kept = sorted((r for r in rows if not r.reason), key=lambda r: r.ordinal)
    assert len(kept) == 4
    source = kept[0].source
    table = pq.read_table(source).to_pylist()
    table[1]["jpg"] = made.swatch(11)  # other bytes at ordinal 1
    pq.write_table(pa.Table.from_pylist(table[:3]), source)  # and ordinal 3 is gone
    dofn = write._WriteFileShards(str(tmp_path / "out"), "c", ALIGN, Columns(), ())
    dofn.setup()
    plan = {source: {"train": 0, "validation": 0}}
    out = list(dofn.process((source, kept), plan, {"train": 1, "validation": 1}))
    late = [o.value for o in out if getattr(o, "tag", None) == write.LATE]
    assert sorted((r.ordinal, r.reason) for r in late) == [(1, "read/source_changed"), (3, "read/source_changed")]
    shards = [o.value for o in out if getattr(o, "tag", None) == write.SHARDS]
    assert sum(info["records"] for _, _, info in shards) == 2


def read_split(data_dir, split):
    spec = tf_feature_spec()
    return [tf.io.parse_single_example(r, spec)["key"].numpy().decode()
            for r in tf.data.TFRecordDataset(sorted(glob.glob(shard_glob(str(data_dir), split))))]


def test_max_records_per_shard_is_a_true_maximum_and_every_record_is_written_once(tmp_path):
    pattern = write_candidates(tmp_path / "in", rows=23)
    funnel = launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK,
                           "--set", "max_records_per_shard=4", "--set", "validation_fraction=0.3",
                           "--set", "min_shorter_side=0"])
    out = committed(tmp_path / "out")
    shards = json.loads((out / "stats" / "_shards.json").read_text())
    for split, entry in shards.items():
        assert entry["records"] and max(entry["records"]) <= 4
        names = sorted(glob.glob(shard_glob(str(out), split)))
        assert len(names) == len(entry["records"])
        assert [os.path.getsize(n) for n in names] == entry["bytes"]
    written = read_split(out, "train") + read_split(out, "validation")
    assert sorted(written) == sorted(make_key(f"https://e.x/{i}.jpg", f"a small test picture number {i}")
                                     for i in range(23))
    assert funnel["written"] == {split: sum(entry["records"]) for split, entry in shards.items()}


def test_shard_checksums_are_the_files_crc32c(tmp_path):
    import google_crc32c

    pattern = write_candidates(tmp_path / "in", rows=5)
    launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK, "--set", "min_shorter_side=0"])
    out = committed(tmp_path / "out")
    shards = json.loads((out / "stats" / "_shards.json").read_text())
    for split, entry in shards.items():
        for path, crc in zip(sorted(glob.glob(shard_glob(str(out), split))), entry["crc32c"]):
            assert f"{google_crc32c.value(open(path, 'rb').read()):08x}" == crc
