"""The TOnICS stage of the build: tags written pairs, writes the class index and counts, rejects nothing."""

import json
import os
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from corpus_paths import committed
from pipeline.audit import read_stats, report
from pipeline.build import launcher
from pipeline.publish import output_contract as output
from tests import images as made

CAPTIONS = (
    ["a red circle on white", "two blue circles and one star", "a green star at night",
     "a yellow ring beside a circle", "plain grey background only"] * 8
    + ["bad"]  # text_length rejects it: tagging runs on written pairs only
)
ONTOLOGY = {"root": "entity", "classes": {"circle": ["circle", "circles"], "star": ["star", "stars"],
                                          "ring": ["ring", "rings"], "hexagon": ["hexagon"]}}


def jpeg(index):
    return made.tinted(index, (320, 300), ((index, 0), (255, 255 - index, 0)))


@pytest.fixture(scope="module")
def tagged_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("concepts")
    (root / "in").mkdir()
    pq.write_table(pa.table({
        "url": [f"https://img.example.com/{i}.jpg" for i in range(len(CAPTIONS))],
        "caption": CAPTIONS,
        "jpg": pa.array([jpeg(i) for i in range(len(CAPTIONS))], pa.binary()),
    }), str(root / "in" / "part-0.parquet"))
    (root / "shapes.json").write_text(json.dumps(ONTOLOGY))
    args = ["--input", str(root / "in" / "*.parquet"), "--output", str(root / "out"), "--preset", "align",
            "--set", "vocab_size=0", "--set", "max_images_per_text=100", "--set", "validation_fraction=0.2",
            "--concepts", str(root / "shapes.json")]
    funnel = launcher.run(args)
    return root, args, funnel


def records(path):
    return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]


def feature(example, name):
    return example.features.feature[name].bytes_list.value[0].decode()


def test_every_written_pair_is_tagged_and_nothing_rejected_by_tagging(tagged_build):
    root, _, funnel = tagged_build
    out = committed(root / "out")
    assert funnel["conserved"] and sum(funnel["written"].values()) == 40
    shards = sorted(p for p in os.listdir(out) if ".tfrecord-" in p)
    tagged = {}
    for name in shards:
        for ex in records(out / name):
            tagged[feature(ex, "texts")] = feature(ex, "concepts")
    assert tagged["two blue circles and one star"] == "circle star"
    assert tagged["a yellow ring beside a circle"] == "circle ring"     # ontology order
    assert tagged["plain grey background only"] == ""
    features = json.loads((out / "features.json").read_text())["featuresDict"]["features"]
    assert "concepts" in features


def test_index_offsets_point_at_records_of_their_class(tagged_build):
    out = committed(tagged_build[0] / "out")
    seen = 0
    for index_name in os.listdir(out / "concepts"):
        index = json.loads((out / "concepts" / index_name).read_text())
        assert index["shard"] + ".json" == index_name
        assert index["records"] == len(records(out / index["shard"]))
        with open(out / index["shard"], "rb") as handle:
            for name, offsets in index["offsets"].items():
                for offset in offsets:
                    handle.seek(offset)
                    (length,) = struct.unpack("<Q", handle.read(12)[:8])
                    example = tf.train.Example.FromString(handle.read(length))
                    assert name in feature(example, "concepts").split()
                    seen += 1
    assert seen == 8 * (3 + 2 + 1)   # per repeat of the captions: circle 3, star 2, ring 1


def test_stats_count_pairs_per_class_and_the_audit_shows_them(tagged_build):
    out = committed(tagged_build[0] / "out")
    stats = json.loads((out / "stats" / "concepts.json").read_text())
    both = {name: sum(s["per_class"][name] for s in stats["splits"].values()) for name in stats["classes"]}
    assert both == {"circle": 24, "star": 16, "ring": 8, "hexagon": 0}
    assert sum(s["pairs"] for s in stats["splits"].values()) == 40
    assert sum(s["tagged"] for s in stats["splits"].values()) == 32
    html = report.build_html(read_stats.load_stats(str(out)))
    assert "TOnICS classes" in html and "hexagon" in html


def test_a_tagged_build_can_be_overwritten(tagged_build):
    root, args, _ = tagged_build
    plan = output.plan_output(str(root / "out"), overwrite=True)
    assert any("/concepts/" in p for p in plan.files)


def test_ontology_mistakes_are_usage_errors(tagged_build, tmp_path):
    root, args, _ = tagged_build
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"classes": {"circle": ["circle"], "ring": ["circle"]}}))
    argv = list(args)
    argv[argv.index("--output") + 1] = str(tmp_path / "never")
    argv[argv.index("--concepts") + 1] = str(bad)
    with pytest.raises(launcher.UsageError, match="--concepts: ontology .*'circle' is in both"):
        launcher.run(argv)
    with pytest.raises(launcher.UsageError, match="--concept_labels_column .* --carry_columns"):
        launcher.run(argv[:-2] + ["--concepts", "default", "--concept_labels_column", "labels"])
    assert not (tmp_path / "never").exists()


def test_detector_labels_from_a_carried_column_confirm_text_classes():
    from common.ontology import from_dict
    from common.schema import Candidate
    from filters.concepts import Tagger
    from pipeline.write.concept_tags import tag_record

    tagger = Tagger(from_dict(ONTOLOGY))
    record = Candidate(key="k", url="u", alt_text="", text="a circle and a star",
                       carried=(("labels", "star,person"),))
    assert tag_record(record, tagger).concepts == ("circle", "star")             # text only
    assert tag_record(record, tagger, "labels").concepts == ("star",)            # text and image
    assert tag_record(record.replace(carried=()), tagger, "labels").concepts == ()  # no labels: nothing seen


def test_the_console_line_of_a_damaged_concepts_file_names_it(tmp_path):
    from pipeline.write import concept_tags

    (tmp_path / "stats").mkdir()
    path = tmp_path / "stats" / "concepts.json"
    path.write_text('{"classes": ["dog"], "splits": {"train": {"pairs": -1, "tagged": 0, "per_class": {}}}}')
    line = concept_tags.summary_line(str(tmp_path))
    assert line.startswith(f"concepts: {path}: splits.train.pairs: -1, not a whole number") and "\n" not in line
