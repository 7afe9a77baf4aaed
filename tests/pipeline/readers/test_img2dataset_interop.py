"""The real img2dataset (its own venv, ``scripts/setup_env.sh``) downloads from a loopback server; the build reads its output.

Images of known sizes and formats, a 404, a 500, an HTML page and a reply
slower than the downloader's timeout (``loopback_images.CASES``). Whatever
img2dataset stored (resized to 256x256 by default, or not with
``--resize_mode no``; Parquet or WebDataset), the corpus must be the one the
*source* sizes dictate: the same written (url, alt-text) set and the same
reason for every URL row, each row counted once. The default suite runs one
configuration (WebDataset, default resize: what a new user gets) and loads
the result by name with ``tfds.builder``; the slow test runs all four.
"""

import glob
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

import repo_root
from common.schema import Candidate
from corpus_paths import committed
from pipeline.build import launcher
from pipeline.readers import tfrecord as tfrecord_reader
from pipeline.readers.rows import Columns
from tests.pipeline.loopback_images import CASES, LoopbackImages

ROOT = repo_root.ROOT
TOOL = os.environ.get("IMG2DATASET") or os.path.join(ROOT, ".venv-img2dataset", "bin", "img2dataset")
NAME = "interop_corpus"
TIMEOUT_S = 2  # img2dataset --timeout; the slow case answers after loopback_images.SLOW_SECONDS

# Runs the real img2dataset (its own venv) against a loopback server: CI's integration run. The light twins in
# the default run are the readers' tests of img2dataset's three output layouts (tests/pipeline/readers/test_readers.py).
pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not os.path.exists(TOOL), reason=f"img2dataset not installed at {TOOL} (scripts/setup_env.sh creates it)")]


def write_url_list(directory, server):
    path = directory / "urls.tsv"
    lines = ["url\tcaption\tphoto_id"] + [f"{server.url(c.path)}\t{c.caption}\tid-{i}" for i, c in enumerate(CASES)]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_img2dataset(url_list, output, output_format, resize_mode):
    """img2dataset 1.47 as a user runs it (its defaults but the output format and resize mode)."""
    command = [
        TOOL, "--url_list", str(url_list), "--input_format", "tsv", "--url_col", "url", "--caption_col", "caption",
        "--save_additional_columns", '["photo_id"]', "--output_folder", str(output),
        "--output_format", output_format, "--resize_mode", resize_mode,
        "--processes_count", "1", "--thread_count", "16", "--timeout", str(TIMEOUT_S), "--retries", "0",
    ]
    env = dict(os.environ, NO_ALBUMENTATIONS_UPDATE="1", WANDB_MODE="disabled")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return output


def build_corpus(img2dataset_output, corpus, *extra):
    funnel = launcher.run([
        "--input", str(img2dataset_output / "*"), "--output", str(corpus), "--name", NAME,
        "--carry_columns", "photo_id", "--set", "min_ngram_count=0", *extra,
    ])
    assert funnel["conserved"]
    return funnel


def outcome(corpus):
    """``{url: "written" | reason}`` over every URL row, from the shards and the rejection ledger."""
    corpus = committed(corpus)
    fates = {}
    for path in sorted(glob.glob(str(corpus / f"{NAME}-*.tfrecord-*"))):
        for record in tfrecord_reader.read_file(path, Columns()):
            assert isinstance(record, Candidate)
            assert record.url not in fates
            fates[record.url] = "written"
    for path in sorted(glob.glob(str(corpus / "stats" / "rejected" / "*.jsonl"))):
        for line in open(path):
            row = json.loads(line)
            assert row["url"] not in fates, f"{row['url']} counted twice"
            fates[row["url"]] = row["reason"]
    return fates


def expected_outcome(server):
    return {server.url(c.path): c.expected for c in CASES}


def readme_snippet_loads(data_dir, version):
    """The TFDS snippet of docs/output.md, run as written (dataset name, data_dir and version substituted)."""
    import re

    readme = open(os.path.join(ROOT, "docs", "output.md")).read()
    snippet = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "tfds.builder(" in block)
    code = snippet.replace("alt_text_corpus", NAME).replace("OUTPUT", str(data_dir)).replace("1.0.0", version)
    scope = {}
    exec(compile(code, "docs/output.md", "exec"), scope)
    assert scope["builder"].info.name == NAME and scope["ds"] is not None


SERVER = LoopbackImages  # the fixture ``server`` (tests/conftest.py) serves img2dataset's cases


def test_default_img2dataset_webdataset_output_by_source_size_and_loaded_by_name(tmp_path, server):
    url_list = write_url_list(tmp_path, server)
    downloaded = run_img2dataset(url_list, tmp_path / "img2dataset", "webdataset", "border")
    assert sorted(os.listdir(downloaded)) == ["00000.parquet", "00000.tar", "00000_stats.json"]
    data_dir = tmp_path / "tensorflow_datasets"
    funnel = build_corpus(downloaded, data_dir, "--layout", "tfds", "--version", "1.2.0")
    corpus = data_dir / NAME / "1.2.0"

    assert funnel["input"] == len(CASES)  # every URL row once; the stats file is not a record
    assert outcome(corpus) == expected_outcome(server)
    notes = {row["stage"]: row.get("note", "") for row in funnel["stages"]}
    assert "resized stored images" in notes["image_size"] and "256x256" in notes["image_size"]
    assert "re-encodes" in notes["image_format"]

    tfds = pytest.importorskip("tensorflow_datasets")
    builder = tfds.builder(NAME, data_dir=str(data_dir))  # TFDS's by-name lookup, as big_vision does it
    assert str(builder.info.version) == "1.2.0"
    assert tfds.builder_from_directory(str(corpus)).info.splits.total_num_examples == builder.info.splits.total_num_examples
    features = json.loads((committed(corpus) / "features.json").read_text())
    assert {"source_key", "source_sha256", "source_photo_id"} <= set(json.dumps(features).split('"'))
    readme_snippet_loads(data_dir, "1.2.0")
    examples = [e for split in builder.info.splits for e in tfds.as_numpy(builder.as_dataset(split=split))]
    by_url = {e["url"].decode(): e for e in examples}
    sizes = {server.url(c.path): c.size for c in CASES if c.expected == "written"}
    assert set(by_url) == set(sizes) and len(examples) == len(sizes)
    for url, example in by_url.items():
        assert (int(example["original_width"]), int(example["original_height"])) == sizes[url]
        assert (int(example["width"]), int(example["height"])) == (256, 256)  # what img2dataset stored
        assert example["source_photo_id"].decode().startswith("id-")
        assert len(example["source_sha256"]) == 64 and example["source_key"].decode().isdigit()


@pytest.mark.slow
def test_four_img2dataset_outputs_give_the_same_corpus(tmp_path, server):
    """Parquet and WebDataset, resized and not; and the ``files`` output (img2dataset 1.47's default)."""
    url_list = write_url_list(tmp_path, server)
    configs = [(fmt, mode) for fmt in ("webdataset", "parquet") for mode in ("border", "no")] + [("files", "border")]
    with ThreadPoolExecutor(len(configs)) as pool:
        outputs = list(pool.map(lambda c: run_img2dataset(url_list, tmp_path / f"{c[0]}-{c[1]}", *c), configs))
    results = {}
    for config, downloaded in zip(configs, outputs):
        corpus = tmp_path / f"corpus-{config[0]}-{config[1]}"
        funnel = build_corpus(downloaded, corpus)
        assert funnel["input"] == len(CASES)
        results[config] = (outcome(corpus), {row["stage"]: row["rejected"] for row in funnel["stages"]})
    first = results[configs[0]]
    assert first[0] == expected_outcome(server)
    for config in configs[1:]:
        assert results[config] == first, config
