"""A TSV URL list built with ``--download`` gives the corpus img2dataset's output of the same list gives.

The same loopback server and list (``loopback_images.CASES``: images of
known sizes and formats, a 404, a 500, an HTML page, a reply slower than
the timeout). img2dataset 1.47 downloads it to Parquet without resizing and
without re-encoding (``--resize_mode no --disable_all_reencoding True``:
with re-encoding its stored bytes would be its own JPEGs, not the
source's); the build reads that. Our build reads the TSV and downloads.
Written records must be identical feature by feature (image bytes, key,
sizes, sha256, pHash, ...); each failed download must fail for the same
cause, named by each tool's own reason.
"""

import glob
import json
import os
import subprocess

import pytest

from common import tfrecord_io as tfrecord
from common.schema import FEATURES
from corpus_paths import committed
from pipeline.build import launcher
from tests.pipeline.loopback_images import CASES, LoopbackImages
from tests.pipeline.readers.test_img2dataset_interop import TOOL, write_url_list

NAME = "interop_corpus"

#: What each tool calls the same failure (img2dataset never checks Content-Type: the
#: HTML page is "downloaded", then the build's header check rejects it).
SAME_CAUSE = {
    "download/http_404": "read/download_failed/http_404",
    "download/http_500": "read/download_failed/http_500",
    "download/timeout": "read/download_failed/timeout",
    "download/not_an_image": "image_header/undecodable",
}

# img2dataset's own run beside ours: CI's integration run; the light twin in the default run is
# tests/pipeline/download/test_download_stage.py (a --download build against the loopback server).
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.path.exists(TOOL), reason=f"img2dataset not installed at {TOOL}")]


SERVER = LoopbackImages  # the fixture ``server`` (tests/conftest.py) serves img2dataset's cases


def run_img2dataset(url_list, output):
    command = [
        TOOL, "--url_list", str(url_list), "--input_format", "tsv", "--url_col", "url", "--caption_col", "caption",
        "--output_folder", str(output), "--output_format", "parquet", "--resize_mode", "no",
        "--disable_all_reencoding", "True", "--processes_count", "1", "--thread_count", "16", "--timeout", "2",
        "--retries", "0",
    ]
    env = dict(os.environ, NO_ALBUMENTATIONS_UPDATE="1", WANDB_MODE="disabled")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return output


def ledger_reasons(corpus):
    corpus = committed(corpus)
    reasons = {}
    for path in sorted(glob.glob(str(corpus / "stats" / "rejected" / "*.jsonl"))):
        for line in open(path):
            row = json.loads(line)
            reasons[row["url"]] = row["reason"]
    return reasons


def written(corpus):
    """{key: {feature: value}} of every shard record, the shared features only."""
    corpus = committed(corpus)
    found = {}
    for path in sorted(glob.glob(str(corpus / f"{NAME}-*.tfrecord-*"))):
        with open(path, "rb") as handle:
            for payload in tfrecord.read_frames(handle):
                features = tfrecord.decode_example(payload)
                found[features["key"][0].decode()] = {k: features[k] for k in FEATURES}
    return found


def test_download_build_equals_the_build_of_img2dataset_output(tmp_path, server):
    url_list = write_url_list(tmp_path, server)
    downloaded = run_img2dataset(url_list, tmp_path / "img2dataset")
    common = ["--name", NAME, "--set", "min_ngram_count=0"]
    theirs = launcher.run(["--input", str(downloaded / "*"), "--output", str(tmp_path / "theirs"), *common])
    ours = launcher.run([
        "--input", str(url_list), "--output", str(tmp_path / "ours"), *common, "--download",
        "--download_allow_loopback", "--download_deadline", "2", "--download_retries", "0",
    ])

    assert ours["input"] == theirs["input"] == len(CASES)
    ours_written, theirs_written = written(tmp_path / "ours"), written(tmp_path / "theirs")
    assert len(ours_written) == sum(1 for c in CASES if c.expected == "written")
    assert ours_written == theirs_written  # byte for byte, feature by feature
    assert ours["written"] == theirs["written"]

    ours_reasons, theirs_reasons = ledger_reasons(tmp_path / "ours"), ledger_reasons(tmp_path / "theirs")
    assert set(ours_reasons) == set(theirs_reasons)
    for url, reason in ours_reasons.items():
        assert SAME_CAUSE.get(reason, reason) == theirs_reasons[url], url
    assert sorted(ours_reasons.values()) != sorted(theirs_reasons.values())  # the download reasons are ours
