"""The build's near-duplicate stages: the evaluation index as files, and eval + in-corpus dedup in one build."""

import base64
import collections
import io
import json
import re

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from common.schema import make_key
from conftest import build_args
from corpus_paths import committed
from dedup import preset_options as dedup_options
from dedup.transforms import IndexRows
from filters.image import perceptual_hash
from filters.presets import get_preset
from pipeline.build import graph as build
from pipeline.build import launcher
from pipeline.stages import eval_index as index_files
from tests import images as made
from tests.pipeline.build.test_build_safety import write_candidates


def random_index(num_rows, dim=143, seed=0):
    rng = np.random.default_rng(seed)
    variants = ("original", "flip", "center_crop_90", "center_crop_80")
    return IndexRows(
        rng.normal(size=(num_rows, dim)).astype(np.float32),
        keys=[f"img{i // 4:05d}.png" for i in range(num_rows)],
        set_names=["coco" if i // 4 % 3 else "imagenet" for i in range(num_rows)],
        variants=[variants[i % 4] for i in range(num_rows)],
    )


def random_thumbnails(index, seed=0, size=4500):
    """Incompressible stand-ins for base64 JPEGs, one per image; every third missing (undecodable)."""
    rng = np.random.default_rng(seed)
    images = dict.fromkeys(zip(index.set_names.tolist(), index.keys.tolist()))
    return {ident: None if i % 3 == 2 else base64.b64encode(rng.bytes(size)).decode() for i, ident in enumerate(images)}


def read_files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# ---------------------------------------------------------------------------
# The index as files
# ---------------------------------------------------------------------------


def test_index_files_round_trip_byte_for_byte(tmp_path):
    index = random_index(41)
    thumbnails = random_thumbnails(index)
    index_files.write_index(index, str(tmp_path / "a"), thumbnails)
    index_files.write_index(random_index(41), str(tmp_path / "b"), random_thumbnails(random_index(41)))
    assert read_files(tmp_path / "a") == read_files(tmp_path / "b")  # same index, same bytes
    assert sorted(read_files(tmp_path / "a")) == sorted([index_files.VECTORS_FILE, index_files.ROWS_FILE, index_files.THUMBNAILS_FILE])

    loaded = index_files.load_index_rows(str(tmp_path / "a"))
    assert isinstance(loaded, IndexRows) and IndexRows.of(loaded) is loaded
    assert loaded.vectors.dtype == np.float32 and loaded.vectors.shape == (41, 143)
    np.testing.assert_allclose(loaded.vectors, index.vectors, atol=1e-6)
    for field in ("keys", "set_names", "variants"):
        assert getattr(loaded, field).tolist() == getattr(index, field).tolist()
    lines = (tmp_path / "a" / index_files.THUMBNAILS_FILE).read_text().splitlines()
    assert dict(index_files.thumbnail_entry(line) for line in lines) == thumbnails
    assert [index_files.thumbnail_entry(line)[0] for line in lines] == list(thumbnails)  # in the index's order


def test_empty_index_round_trips(tmp_path):
    index_files.write_index(IndexRows(np.zeros((0, 143), np.float32), [], [], []), str(tmp_path), {})
    loaded = index_files.load_index_rows(str(tmp_path))
    assert len(loaded) == 0 and loaded.vectors.shape == (0, 143)


def test_rows_and_vectors_must_agree(tmp_path):
    index_files.write_index(random_index(8), str(tmp_path), {})
    rows = (tmp_path / index_files.ROWS_FILE).read_text().splitlines()
    (tmp_path / index_files.ROWS_FILE).write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(ValueError, match="8 vectors but 7 rows"):
        index_files.load_index_rows(str(tmp_path))


@pytest.mark.parametrize("name", ["index", "out[1]?*"])  # an --output with glob characters: a literal directory
def test_index_rows_and_thumbnails_are_read_on_workers(tmp_path, name):
    directory = tmp_path / name
    index = random_index(12)
    thumbnails = random_thumbnails(index)
    index_files.write_index(index, str(directory), thumbnails)
    known = ("coco", "img00001.png")  # has a thumbnail
    missing = ("coco", "img00002.png")  # written as null
    assert thumbnails[known] and thumbnails[missing] is None
    rows = [
        {"key": "c1", "index_set": known[0], "index_key": known[1], "cosine": 0.99},
        {"key": "c2", "index_set": known[0], "index_key": known[1], "cosine": 0.95},
        {"key": "c3", "index_set": missing[0], "index_key": missing[1], "cosine": 0.97},
        {"key": "c4", "index_set": "other", "index_key": "not_in_the_index", "cosine": 0.96},
    ]
    expected = [dict(rows[0], index_thumbnail=thumbnails[known]), dict(rows[1], index_thumbnail=thumbnails[known]),
                dict(rows[2], index_thumbnail=None), dict(rows[3], index_thumbnail=None)]
    loaded = index_files.load_index_rows(str(directory))
    assert (len(loaded), loaded.vectors.shape[1], tuple(loaded.keys), tuple(loaded.variants)) == (
        12, 143, tuple(index.keys), tuple(index.variants))
    with TestPipeline(runner="FnApiRunner") as p:
        joined = p | beam.Create(rows) | index_files.AddIndexThumbnails(str(directory))
        assert_that(joined, equal_to(expected), label="CheckThumbnails")


def test_pairs_report_is_written_in_sharded_files(tmp_path):
    from filters.image import thumbnail_b64
    from pipeline.audit import read_stats
    from pipeline.stages.light_rows import LightRow
    from pipeline.stages.near_duplicates import WritePairsReport

    index = random_index(12)
    index_files.write_index(index, str(tmp_path / "index"), random_thumbnails(index))
    pairs = [dict(key=f"c{i}", index_set="coco", index_key="img00001.png", variant="flip", cosine=0.95 + i / 100,
                  thumbnail=thumbnail_b64(made.solid((32, 24), (i, 0, 0)))) for i in range(6)]
    reason = "near_duplicate_eval/coco"

    def rejected(key, why):
        return LightRow(key, "u", "t", why, True, "s", "", 32, 24, "JPEG", "f", "parquet", 0, reason)

    rejections = [rejected(f"c{i}", reason) for i in range(5)]
    # One key repeated 500 times is reported once; a match an earlier stage rejected is not reported.
    rejections += [rejected("c0", reason) for _ in range(500)] + [rejected("c5", "images_per_text/shared_text")]
    out = tmp_path / "out"
    with TestPipeline(runner="FnApiRunner") as p:
        _ = (p | "Pairs" >> beam.Create(pairs), p | "Rejections" >> beam.Create(rejections)) | WritePairsReport(
            str(tmp_path / "index"), str(out), per_file=2)
    names = sorted(f.name for f in (out / "stats").iterdir())
    assert names == [f"near_duplicates-{i:05d}-of-00003.jsonl" for i in range(3)]
    written = []
    for name in names:
        rows = [json.loads(line) for line in (out / "stats" / name).read_text().splitlines()]
        assert rows == sorted(rows, key=lambda r: r["key"])
        written += rows
    assert sorted(r["key"] for r in written) == [f"c{i}" for i in range(5)]
    assert all(r["thumbnail"] and r["index_thumbnail"] for r in written)
    assert next(r for r in written if r["key"] == "c0")["thumbnail"] == pairs[0]["thumbnail"]
    # The audit reads every file, in one order.
    loaded = read_stats.load_stats(str(out))
    assert [r["key"] for r in loaded["near_duplicates"]] == [f"c{i}" for i in range(5)]
    assert read_stats.NEAR_DUPLICATES_FILE not in loaded["missing"]

    # No pair at all: one empty file (the search ran and found nothing).
    empty = tmp_path / "empty"
    with TestPipeline(runner="FnApiRunner") as p:
        _ = (p | "NoPairs" >> beam.Create([]), p | "NoRejections" >> beam.Create([])) | WritePairsReport(
            str(tmp_path / "index"), str(empty))
    assert [f.name for f in (empty / "stats").iterdir()] == ["near_duplicates-00000-of-00001.jsonl"]
    assert (empty / "stats" / "near_duplicates-00000-of-00001.jsonl").read_text() == ""


def graph_size(tmp_path, eval_index, overrides=()):
    """Bytes of the build's job graph as a runner receives it (nothing runs)."""
    from pipeline.build.config import resolve
    from pipeline.build.options import parse

    write_candidates(tmp_path / "in")
    sets = [arg for override in overrides for arg in ("--set", override)]
    config, _ = resolve(*parse(["--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out"),
                                *sets]))
    p = beam.Pipeline(runner=FnApiRunner())
    build.build_pipeline(p, config, {}, eval_index)
    return len(p.to_runner_api().SerializeToString())


def test_build_graph_carries_the_index_path_not_its_data(tmp_path):
    # Dataflow rejects job graphs over 10 MB; a real index (1e5 rows) is 57 MB.
    big, small = random_index(6000), random_index(4)
    big_thumbnails = random_thumbnails(big)
    index_files.write_index(big, str(tmp_path / "big"), big_thumbnails)
    index_files.write_index(small, str(tmp_path / "sml"), random_thumbnails(small))
    data_bytes = big.vectors.nbytes + sum(len(t or "") for t in big_thumbnails.values())
    assert data_bytes > 8_000_000
    overrides = ["dedup_in_corpus=true"]  # both users of the index: eval matching and the pairs report
    with_big = graph_size(tmp_path, index_files.EvalIndex(str(tmp_path / "big"), 0.9, ""), overrides)
    with_small = graph_size(tmp_path, index_files.EvalIndex(str(tmp_path / "sml"), 0.9, ""), overrides)
    assert abs(with_big - with_small) < 1000, (with_big, with_small)
    assert with_big < data_bytes / 2  # the graph could not hold the index's data (it holds ~0.9 MB of transforms)


def test_preset_search_parameters_reach_the_search_options():
    from dedup import kmeans
    from dedup.transforms import SearchOptions

    preset = get_preset("align", ["num_clusters=64", "nearest_clusters=8", "bucket_size=2", "kmeans_sample_size=5000"])
    options = SearchOptions(threshold=0.9, search=preset.near_duplicate_search, **dedup_options.search_options(preset))
    assert (options.search, options.num_clusters, options.nearest_clusters, options.bucket_size, options.sample_size) == (
        "exact", 64, 8, 2, 5000)
    assert options.merge_cosine is None  # automatic: no thinning for the exact search
    buckets = get_preset("align", ["near_duplicate_search=buckets"])
    options = SearchOptions(threshold=0.9, search=buckets.near_duplicate_search, **dedup_options.search_options(buckets))
    assert options.merge_cosine == pytest.approx(kmeans.merge_cosine_for(0.9))
    never = get_preset("align", ["near_duplicate_search=buckets", "centroid_merge_cosine=-1"])
    assert SearchOptions(threshold=0.9, search="buckets", **dedup_options.search_options(never)).merge_cosine is None
    fixed = get_preset("align", ["centroid_merge_cosine=0.99"])
    assert SearchOptions(threshold=0.9, **dedup_options.search_options(fixed)).merge_cosine == 0.99


# ---------------------------------------------------------------------------
# One real build with both evaluation and in-corpus dedup
# ---------------------------------------------------------------------------


def _cosine(embedder, a, b):
    x, y = np.asarray(embedder.embed([a, b]), np.float64)
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


def planted_copies(rows, embedder):
    """Copies of three ordinary images under other URLs, each caught by a different in-corpus method.

    The expected method is derived here, independently of the pipeline:
    identical bytes; identical pHash (a re-encode that keeps it); neither,
    but an embedding cosine well above the threshold (a 1% border crop).
    """
    copies = {}
    rows = iter(rows)
    original = next(rows)
    copies["sha256"] = (original, original["jpg"])
    for original in rows:
        image = Image.open(io.BytesIO(original["jpg"])).convert("RGB")
        w, h = image.size
        for method, data in (
            ("phash", made.encode(image, quality=60)),
            ("embedding", made.encode(image.crop((w // 100 + 2, h // 100 + 2, w - w // 100 - 2, h - h // 100 - 2)).resize((w, h)),
                                       quality=85)),
        ):
            if method in copies:
                continue
            same_hash = perceptual_hash(Image.open(io.BytesIO(data)).convert("RGB")) == perceptual_hash(image)
            if same_hash == (method == "phash") and _cosine(embedder, original["jpg"], data) > embedder.threshold + 0.03:
                copies[method] = (original, data)
                break
        if len(copies) == 3:
            return copies
    raise AssertionError(f"no ordinary image gives copies for every method: {sorted(copies)}")


@pytest.mark.parametrize("search", ["exact", "buckets"])
def test_eval_and_in_corpus_dedup_in_one_build(sample_dir, tmp_path, search):
    from dedup import embedders

    embedder = embedders.get("dct")
    manifest = [json.loads(line) for line in open(sample_dir / "manifest.jsonl")]
    ordinary = [m["key"] for m in manifest if m["case"] == "ordinary"][:40]
    eval_copies = {m["key"]: m for m in manifest if m["case"] == "near_duplicate_eval"}
    assert eval_copies and all(m["expected"].startswith("near_duplicate_eval/") for m in eval_copies.values())
    by_key = {}
    for path in sorted((sample_dir / "candidates").glob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            if row["key"] in eval_copies or row["key"] in ordinary:
                by_key[row["key"]] = row
    # The sample plants no in-corpus duplicates (its expected fates assume the
    # stage is off), so this test plants its own: copies of ordinary images.
    assert not any(m["expected"].startswith("near_duplicate_corpus/") for m in manifest)
    copies = planted_copies([by_key[k] for k in ordinary], embedder)
    extra = [
        dict(original, key=f"copy_{method}", url=original["url"] + f"?copy={method}", jpg=data)
        for method, (original, data) in copies.items()
    ]
    inputs = tmp_path / "in"
    inputs.mkdir()
    table = list(by_key.values()) + extra
    pq.write_table(pa.Table.from_pylist(table), inputs / "part-0.parquet")

    out = tmp_path / "out"
    args = build_args(sample_dir, out, "--set", "dedup_in_corpus=true", "--set", "nsfw_threshold=1.0",
                      "--set", f"near_duplicate_search={search}",
                      "--set", "min_ngram_count=0")  # a subset: n-gram counts of the whole sample do not hold
    args[args.index("--input") + 1] = str(inputs / "*.parquet")
    funnel = launcher.run(args)
    out = committed(out)

    # The funnel adds up and matches the ledger.
    assert funnel["conserved"] and funnel["input"] == len(table)
    assert funnel["input"] == sum(funnel["written"].values()) + funnel["rejected_total"]
    reasons = {}
    for path in sorted((out / "stats" / "rejected").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            assert row["key"] not in reasons
            reasons[row["key"]] = row["reason"]
    assert len(reasons) == funnel["rejected_total"]
    stages = {row["stage"]: row for row in funnel["stages"]}

    # Evaluation near-duplicates go first, as the manifest says.
    pipeline_key = {r["key"]: make_key(r["url"], r["caption"]) for r in table}
    for key, planted in eval_copies.items():
        assert reasons.get(pipeline_key[key]) == planted["expected"], key
    assert sum(stages["near_duplicate_eval"]["rejected"].values()) == len(eval_copies)

    # Of each planted pair the larger key goes, for the method that catches it.
    expected_corpus = {}
    for method, (original, _) in copies.items():
        pair = [pipeline_key[original["key"]], pipeline_key[f"copy_{method}"]]
        expected_corpus[max(pair)] = f"near_duplicate_corpus/{method}"
        assert min(pair) not in reasons
    corpus_reasons = {k: r for k, r in reasons.items() if r.startswith("near_duplicate_corpus/")}
    assert corpus_reasons == expected_corpus
    assert stages["near_duplicate_corpus"]["ran"]
    assert stages["near_duplicate_corpus"]["rejected"] == dict(collections.Counter(expected_corpus.values()))
    others = set(ordinary) - {original["key"] for original, _ in copies.values()}
    assert all(pipeline_key[k] not in reasons for k in others)

    # Both stages used one threshold: the embedder's calibrated one.
    thresholds = [float(re.search(r"cosine > ([0-9.]+)", stages[s]["note"]).group(1))
                  for s in ("near_duplicate_eval", "near_duplicate_corpus")]
    assert thresholds == [embedder.threshold, embedder.threshold]
    assert f"{search} search" in stages["near_duplicate_eval"]["note"]

    # The report rows got their evaluation thumbnails from the index files.
    pairs = [json.loads(line) for line in (out / "stats" / "near_duplicates-00000-of-00001.jsonl").read_text().splitlines()]
    assert {p["key"] for p in pairs} == {pipeline_key[k] for k in eval_copies}
    assert all(p["thumbnail"] and p["index_thumbnail"] for p in pairs)
    index_dir = out / "near_duplicates" / "index"
    assert sorted(p.name for p in index_dir.iterdir()) == sorted(
        [index_files.VECTORS_FILE, index_files.ROWS_FILE, index_files.CENTROIDS_FILE, index_files.THUMBNAILS_FILE])
