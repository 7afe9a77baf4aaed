"""One real build (``pipeline.build.launcher.run``, FnApiRunner) over hostile files mixed with good ones.

A lying Parquet footer, a TFRecord with a malformed Example and a false
2^40 length, a WebDataset shard with a too-deep ``.json`` beside its
metadata Parquet, and a gzipped JSONL URL list, next to a good Parquet file:
the build is committed, the funnel conserves, the ``read`` counters reconcile
with what the files state, every good record is written, and the build's
peak memory stays under ``PEAK_RSS_BOUND``.
"""

import glob
import gzip
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from hostile_inputs import (
    _field, example_with, good, good_example, good_rows, good_text, length_header, lying_parquet, nested_json,
    sample_members, tar_bytes, write_frames, write_parquet,
)
from corpus_paths import committed
from common import tfrecord_io as tfrecord

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
#: A build's peak memory on these inputs, whatever they claim (one worker: the in-process runner).
PEAK_RSS_BOUND = 2 << 30
QUICK = ["--set", "vocab_size=0", "--set", "nsfw_threshold=1.0"]


def write_inputs(directory):
    """The input files; returns the urls of the good records."""
    good_urls = []
    write_parquet(directory / "good.parquet", good_rows("good", 4))
    good_urls += [good("good", i)[0] for i in range(4)]

    lying_parquet(directory / "lying.parquet", file_rows=100_000, group_rows=100_000)
    good_urls += [good("lying", i)[0] for i in range(6)]

    odd_floats = example_with("score", _field(2, _field(1, b"\x00" * 5)))
    write_frames(directory / "mixed.tfrecord", [good_example("tf", 0), odd_floats, good_example("tf", 1)],
                 tail=length_header(1 << 40) + b"x" * 20)
    good_urls += [good("tf", i)[0] for i in range(2)]

    members = [m for i in range(4) for m in sample_members("shard", i)]
    members[1 * 3 + 2] = ("00001.json", nested_json(30_000))
    (directory / "00000.tar").write_bytes(tar_bytes(members))
    rows = [{"key": f"{i:05d}", "url": good("shard", i)[0], "caption": good("shard", i)[1], "status": "success",
             "error_message": None} for i in range(4)]
    rows.append({"key": "00004", "url": "https://bad.example/gone.jpg", "caption": "a page gone",
                 "status": "failed_to_download", "error_message": "HTTP Error 404: Not Found"})
    pq.write_table(pa.Table.from_pylist(rows), directory / "00000.parquet")
    good_urls += [good("shard", i)[0] for i in (0, 2, 3)]

    lines = [json.dumps(dict(zip(("url", "caption"), good_text("list", i)))).encode() for i in range(2)]
    (directory / "urls.jsonl.gz").write_bytes(gzip.compress(b"\n".join(lines[:1] + [nested_json(30_000)] + lines[1:])))
    return good_urls


def written_urls(output):
    urls = []
    for path in sorted(glob.glob(str(output / "*.tfrecord-*"))):
        with open(path, "rb") as handle:
            for payload in tfrecord.read_frames(handle):
                urls.append(tfrecord.decode_example(payload, {"url"})["url"][0].decode())
    return urls


def test_build_over_hostile_files_completes_conserves_and_writes_every_good_record(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    good_urls = write_inputs(inputs)
    output = tmp_path / "out"
    argv = ["--input", str(inputs / "*"), "--output", str(output), *QUICK,
            "--read_max_record_bytes", str(4 << 20), "--read_max_line_bytes", str(64 << 10)]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, os.path.join(HERE, "build_driver.py"), *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    funnel, counts = report["funnel"], report["read"]

    output = committed(output)
    assert funnel["conserved"]
    # The input is what the files state: the lying footer's 100,000 rows (6 read, one marker for the rest).
    assert funnel["input"] == 4 + 100_000 + 4 + (1 + 4) + 3
    assert funnel["reading"] == {"read": funnel["input"] - (100_000 - 6) - 1, "unread": 100_000 - 6,
                                 "unknown_losses": 1, "beyond_stated": 0}
    assert funnel["stages"][0]["rejected"] == {
        "read/inconsistent_metadata": 100_000 - 6,  # the footer's 100,000 rows over 6: one record standing for the rest
        "read/malformed_record": 2,  # the Example with an odd float list; the sample with too deep a .json
        "read/truncated_file": 1,  # the 2^40-byte frame length
        "read/download_failed/http_404": 1,
        "read/not_downloaded": 2, "read/malformed_line": 1,  # the gzipped URL list
    }
    assert sorted(written_urls(output)) == sorted(good_urls)
    # What the files state (the Parquet footers) == what was read + what the markers count as unread.
    assert counts["stated"] == 4 + 100_000
    assert counts["stated_read"] == 4 + 6 and counts["stated_unread"] == 100_000 - 6
    assert counts.get("unstated", 0) == 0 and counts["unknown_loss_files"] == 1
    ledger = [json.loads(line) for path in sorted((output / "stats" / "rejected").glob("*.jsonl"))
              for line in path.read_text().splitlines()]
    assert {line["reason"]: line.get("unread_records") for line in ledger if "unread_records" in line} == {
        "read/inconsistent_metadata": 100_000 - 6, "read/truncated_file": "unknown"}
    assert report["peak_rss"] < PEAK_RSS_BOUND
