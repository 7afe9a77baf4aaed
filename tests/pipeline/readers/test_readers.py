"""Readers of every input format, on real files with malformed parts: each unit is one record, a reason each.

TSV (with and without a header, CC12M's and CC3M's column orders), JSONL,
TFRecord (this project's own shards, a corrupt record, a truncated tail; the
codec checked against TensorFlow's), WebDataset tars beside img2dataset's
metadata Parquet (failed downloads, a sample missing from the tar, a
truncated tar, keys with dots), and the dispatch (non-data files skipped,
a metadata Parquet read once with its tar).
"""

import collections
import io
import json
import tarfile

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

import repo_root
from common import tfrecord_io as tfrecord
from common.schema import Candidate, make_key
from pipeline import readers
from pipeline.readers import file_records as read
from pipeline.readers import jsonl, tsv, webdataset
from pipeline.readers import tfrecord as tfrecord_reader
from pipeline.readers.rows import Columns, download_failure, make_columns
from pipeline.write import shards
from tests import images as made


def fates(records):
    return collections.Counter("written" if isinstance(r, Candidate) else r.reason for r in records)


# ---------------------------------------------------------------------------
# TSV and JSONL URL lists
# ---------------------------------------------------------------------------


def test_tsv_with_header_every_line_one_record(tmp_path):
    path = tmp_path / "urls.tsv"
    path.write_bytes(
        b"url\tcaption\tlicense\n"
        b"https://e.x/1.jpg\ta dog on a beach\tcc-by\n"
        b"https://e.x/2.jpg\tonly two fields\n"               # wrong field count
        b"\n"                                                  # blank line
        b"https://e.x/3.jpg\t\xff\xfe bad caption\tcc0\n"    # invalid UTF-8 caption
        b"\xff.jpg\ta cat\tcc0\n"                            # invalid UTF-8 url
        b"https://e.x/4.jpg\ta fox in snow\tcc0"             # no final newline
    )
    records = list(tsv.read_file(str(path), make_columns(carry=["license"])))
    assert len(records) == 6  # the 6 lines after the header
    assert [r.reason for r in records] == [
        "read/not_downloaded", "read/malformed_line", "read/malformed_line",
        "read/caption_not_utf8", "read/url_not_text", "read/not_downloaded",
    ]
    assert records[0].url == "https://e.x/1.jpg" and records[0].alt_text == "a dog on a beach"
    assert records[0].key == make_key("https://e.x/1.jpg", "a dog on a beach")
    assert "2 fields, expected 3" in records[1].alt_text and records[1].url == f"{path}#3"


@pytest.mark.parametrize("order", ["url,caption", "caption,url"])
def test_headerless_tsv_cc12m_and_cc3m_orders(tmp_path, order):
    path = tmp_path / "list.tsv"
    rows = [("https://e.x/a.jpg", "a red bicycle"), ("https://e.x/b.jpg", "two green apples")]
    lines = ["\t".join(r if order == "url,caption" else r[::-1]) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    records = list(tsv.read_file(str(path), make_columns(tsv_columns=order)))
    assert [(r.url, r.alt_text, r.reason) for r in records] == [(u, c, "read/not_downloaded") for u, c in rows]


@pytest.mark.parametrize("chunk", [1, 3, 64, 1 << 20])
def test_lines_within_their_cap_are_the_lines_of_the_stream(monkeypatch, chunk):
    import random

    from common import files
    from pipeline.readers import limits

    monkeypatch.setattr(files, "CHUNK_BYTES", chunk)  # the readers' lines are common.files.lines
    rng = random.Random(chunk)
    for _ in range(100):
        data = b"".join(rng.choice([b"\n", b"a", b"bb", b"x" * rng.randrange(50)]) for _ in range(rng.randrange(100)))
        cap = rng.randrange(1, 60)
        parts = data.split(b"\n")
        expected = [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
        expected = [("too long", len(x)) if len(x) > cap else x for x in expected]
        got = [("too long", x.length) if isinstance(x, limits.TooLong) else x
               for x in limits.lines(io.BytesIO(data), cap)]
        assert got == expected


def test_jsonl_malformed_lines_each_have_a_reason(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_bytes(b"\n".join([
        json.dumps({"url": "https://e.x/1.jpg", "caption": "a boat at sea", "id": 7}).encode(),
        b"{not json",
        b"[1, 2]",
        b"",
        json.dumps({"url": "https://e.x/2.jpg"}).encode(),                    # no caption field
        json.dumps({"url": "https://e.x/3.jpg", "caption": None}).encode(),   # null caption
        json.dumps({"url": 12, "caption": "a number as url"}).encode(),
        b'{"url": "https://e.x/4.jpg", "caption": "\xff"}',                  # invalid UTF-8
    ]) + b"\n")
    records = list(jsonl.read_file(str(path), Columns()))
    assert [r.reason for r in records] == [
        "read/not_downloaded", "read/malformed_line", "read/malformed_line", "read/malformed_line",
        "read/missing_column", "read/missing_caption", "read/url_not_text", "read/malformed_line",
    ]


# ---------------------------------------------------------------------------
# TFRecord
# ---------------------------------------------------------------------------


def test_example_codec_reads_what_tensorflow_writes():
    tf = pytest.importorskip("tensorflow")
    example = tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x00\xffbytes"])),
        "texts": tf.train.Feature(bytes_list=tf.train.BytesList(value=["caf\u00e9 au lait".encode()])),
        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[3, -1, 2**40])),
        "score": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5, -2.25])),
        "empty": tf.train.Feature(bytes_list=tf.train.BytesList(value=[])),
    }))
    decoded = tfrecord.decode_example(example.SerializeToString())
    assert decoded == {
        "image": [b"\x00\xffbytes"], "texts": ["caf\u00e9 au lait".encode()], "ids": [3, -1, 2**40],
        "score": [0.5, -2.25], "empty": [],
    }


def own_shard_record(i):
    record = Candidate(
        key=make_key(f"https://e.x/{i}.jpg", f"caption number {i} here"), url=f"https://e.x/{i}.jpg",
        alt_text=f"caption number {i} here", image=made.swatch(i, (16, 12)), text=f"caption number {i} here",
        width=640 + i, height=480, stored_width=16, stored_height=12, sha256="ab" * 32, phash="0" * 16,
        carried=(("key", f"k{i}"),),
    )
    return shards.to_example(record, ("key",))


def test_tfrecord_reads_own_shards_with_a_corrupt_record_and_a_truncated_tail(tmp_path):
    path = tmp_path / "corpus-train.tfrecord-00000-of-00001"
    frames = [tfrecord.frame_record(own_shard_record(i)) for i in range(4)]
    frames[1] = frames[1][:-1] + bytes([frames[1][-1] ^ 0xFF])  # payload checksum broken
    garbage = tfrecord.frame_record(b"\x0a\x05not an example")  # frames fine, payload is not an Example
    path.write_bytes(frames[0] + frames[1] + garbage + frames[2] + frames[3][:30])  # the last one cut short
    assert readers.format_of(str(path)) == "tfrecord"
    records = list(tfrecord_reader.read_file(str(path), Columns()))
    assert [r.reason if not isinstance(r, Candidate) else "written" for r in records] == [
        "written", "read/corrupt_record", "read/malformed_record", "written", "read/truncated_file",
    ]
    first = records[0]
    assert (first.url, first.alt_text) == ("https://e.x/0.jpg", "caption number 0 here")
    assert (first.source_width, first.source_height) == (640, 480)  # the shard's original_* are the source size
    assert dict(first.carried)["key"] == make_key("https://e.x/0.jpg", "caption number 0 here")
    assert dict(first.carried)["sha256"] == "ab" * 32


# ---------------------------------------------------------------------------
# WebDataset
# ---------------------------------------------------------------------------


def test_member_names_split_the_webdataset_way():
    assert webdataset.split_member_name("000000001.jpg") == ("000000001", "jpg")
    assert webdataset.split_member_name("shard/a.b.c.JSON") == ("shard/a", "b.c.json")
    assert webdataset.split_member_name("dir.v2/sample.txt") == ("dir.v2/sample", "txt")
    assert webdataset.split_member_name("README") == ("README", "")


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shard(directory, samples, metadata_rows=None, truncate=False):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for key, fields in samples:
            for field, data in fields.items():
                add_member(tar, f"{key}.{field}", data)
    data = buffer.getvalue()
    (directory / "00000.tar").write_bytes(data[: len(data) // 2] if truncate else data)
    if metadata_rows is not None:
        pq.write_table(pa.Table.from_pylist(metadata_rows), directory / "00000.parquet")
    (directory / "00000_stats.json").write_text(json.dumps({"count": len(metadata_rows or [])}))


def meta(key, url, caption, status="success", error=None, size=(800, 600)):
    return {
        "key": key, "url": url, "caption": caption, "status": status, "error_message": error,
        "width": 256 if status == "success" else None, "height": 256 if status == "success" else None,
        "original_width": size[0] if status == "success" else None,
        "original_height": size[1] if status == "success" else None,
        "sha256": "cd" * 32 if status == "success" else None,
    }


def sample(key, url, caption, size=(800, 600)):
    return key, {
        "jpg": made.swatch(size=(256, 256)),
        "txt": caption.encode(),
        "json": json.dumps(meta(key, url, caption, size=size)).encode(),
    }


def test_webdataset_shard_with_its_metadata_counts_every_row_once(tmp_path):
    rows = [
        meta("000", "https://e.x/0.jpg", "a dog on a beach"),
        meta("001", "https://e.x/1.jpg", "a cat on a sofa", size=(150, 150)),
        meta("002", "https://e.x/2.jpg", "a page gone", "failed_to_download", "HTTP Error 404: Not Found"),
        meta("003", "https://e.x/3.jpg", "a slow server", "failed_to_download", "<urlopen error timed out>"),
        meta("004", "https://e.x/4.jpg", "listed but absent"),
    ]
    write_shard(tmp_path, [sample("000", "https://e.x/0.jpg", "a dog on a beach"),
                           sample("001", "https://e.x/1.jpg", "a cat on a sofa", size=(150, 150)),
                           ("005.v1", {"txt": b"a sample without image or json"})], rows)
    records = list(webdataset.read_file(str(tmp_path / "00000.tar"), make_columns()))
    assert fates(records) == {
        "written": 2, "read/download_failed/http_404": 1, "read/download_failed/timeout": 1,
        "read/missing_from_shard": 1, "read/missing_column": 1,
    }
    by_url = {r.url: r for r in records if isinstance(r, Candidate)}
    small = by_url["https://e.x/1.jpg"]
    assert (small.source_width, small.source_height) == (150, 150)  # the json's original size, not 256
    assert dict(small.carried) == {"key": "001", "sha256": "cd" * 32}


def test_truncated_tar_keeps_what_was_read_and_accounts_for_the_rest(tmp_path):
    rows = [meta(f"{i:03d}", f"https://e.x/{i}.jpg", f"caption {i} of the shard") for i in range(6)]
    write_shard(tmp_path, [sample(r["key"], r["url"], r["caption"]) for r in rows], rows, truncate=True)
    records = list(webdataset.read_file(str(tmp_path / "00000.tar"), make_columns()))
    counts = fates(records)
    # the sample the cut fell in (one of its members cut short), and one marker record for the rest
    assert counts["read/truncated_file"] == 2
    assert counts["written"] + counts["read/missing_from_shard"] == 5  # every other metadata row once
    cut_sample, stopped = [r for r in records if getattr(r, "reason", "") == "read/truncated_file"]
    assert cut_sample.url.startswith("https://e.x/") and cut_sample.detail == ()
    assert dict(stopped.detail) == {"unread_records": "unknown"}  # a tar states no count
    assert counts["written"] >= 1


# ---------------------------------------------------------------------------
# Dispatch: formats by name, non-data files, one read per shard
# ---------------------------------------------------------------------------


def test_formats_by_name_and_non_data_files():
    assert readers.format_of("a/00000.parquet") == "parquet"
    assert readers.format_of("a/00000.tar") == "webdataset"
    assert readers.format_of("cc12m.tsv.gz") == "tsv"
    assert readers.format_of("list.jsonl") == "jsonl"
    assert readers.format_of("x-train.tfrecord-00003-of-00016") == "tfrecord"
    assert readers.format_of("x.bin") is None and readers.format_of("x.bin", "tsv") == "tsv"
    for name in ("00000_stats.json", "_SUCCESS", ".part-0.crc", "dataset_info.json", "features.json", "COMPLETED"):
        assert readers.is_non_data(f"out/{name}")
    with pytest.raises(ValueError):
        read.ReadCandidates("x", input_format="csv")


def test_download_failures_named_by_kind():
    assert download_failure("failed_to_download", "HTTP Error 404: Not Found") == "http_404"
    assert download_failure("failed_to_download", "<urlopen error timed out>") == "timeout"
    assert download_failure("failed_to_download", "The read operation timed out") == "timeout"
    assert download_failure("failed_to_resize", "Image decoding error") == "failed_to_resize"
    assert download_failure("failed_to_download", "<urlopen error [Errno 111] Connection refused>") == "connection_error"
    assert download_failure("failed_to_download", None) == "failed_to_download"
    assert download_failure("failed_to_download", "Some New Error: x!") == "some_new_error_x"


def assert_read(pattern, expected, **kwargs):
    """Run ReadCandidates on the Beam runner and compare (fate, url) of every record."""
    from apache_beam.options.pipeline_options import PipelineOptions

    with beam.Pipeline("FnApiRunner", options=PipelineOptions([])) as p:
        out = p | read.ReadCandidates(pattern, **kwargs)
        fated = (out["survivors"], out["rejected"]) | beam.Flatten() | beam.Map(lambda r: ("written" if isinstance(r, Candidate) else r.reason, r.url))
        assert_that(fated, equal_to(expected))


def test_a_glob_over_img2dataset_output_reads_each_shard_once(tmp_path):
    rows = [meta("000", "https://e.x/0.jpg", "a dog on a beach"),
            meta("001", "https://e.x/1.jpg", "a page gone", "failed_to_download", "HTTP Error 404: Not Found")]
    write_shard(tmp_path, [sample("000", "https://e.x/0.jpg", "a dog on a beach")], rows)
    (tmp_path / "_SUCCESS").write_bytes(b"")
    expected = [("written", "https://e.x/0.jpg"), ("read/download_failed/http_404", "https://e.x/1.jpg")]
    # out/*: tar, its metadata Parquet and the stats file are matched; only the shard is read, once.
    assert_read(str(tmp_path / "*"), expected)
    # The metadata Parquet alone names the shard: it is read with its tar.
    assert_read(str(tmp_path / "*.parquet"), expected)
    assert_read(str(tmp_path / "*.tar"), expected)


def test_unknown_format_is_one_named_rejection(tmp_path):
    (tmp_path / "notes.bin").write_bytes(b"\x00\x01")
    assert_read(str(tmp_path / "*"), [("read/unknown_format", str(tmp_path / "notes.bin"))])


def test_own_corpus_directory_as_input_is_counted_against_dataset_info(tmp_path):
    """Re-filtering a built corpus: TFDS metadata is skipped, each shard's stated length is its count."""
    examples = [own_shard_record(i) for i in range(6)]
    lengths = shards.write_contiguous_shards(str(tmp_path), "corpus", "train", examples, 2)
    from pipeline.publish.tfds_metadata import write_metadata as write_tfds_metadata

    write_tfds_metadata(str(tmp_path), "corpus", {"train": lengths}, "test corpus", carried=("key",))
    (tmp_path / "COMPLETED").write_bytes(b"")
    shard = tmp_path / "corpus-train.tfrecord-00001-of-00002"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # 3 records stated; the cut falls inside the second
    assert tfrecord_reader.expected_records(str(shard)) == 3
    records = list(tfrecord_reader.read_file(str(shard), Columns()))
    assert fates(records) == {"written": 1, "read/truncated_file": 1}
    assert dict(records[-1].detail) == {"unread_records": 2}  # one record standing for the 2 missing
    expected = [("written", f"https://e.x/{i}.jpg") for i in (0, 1, 2, 3)] + [
        ("read/truncated_file", f"{shard}#after-1")
    ]
    assert_read(str(tmp_path / "*"), expected)


@pytest.mark.parametrize("name", ["shards", "shards[1]"])
def test_img2dataset_files_output_reads_folder_with_its_parquet(tmp_path, name):
    """img2dataset's default ``files`` output: ``00000/KEY.{jpg,txt,json}`` beside ``00000.parquet``; a folder
    whose name holds glob characters is the folder it names (its pattern escapes them, ``escape_glob``)."""
    from common.files import escape_glob

    base = tmp_path / name
    base.mkdir()
    rows = [meta("000", "https://e.x/0.jpg", "a dog on a beach"),
            meta("001", "https://e.x/1.jpg", "a page gone", "failed_to_download", "HTTP Error 404: Not Found")]
    pq.write_table(pa.Table.from_pylist(rows), base / "00000.parquet")
    (base / "00000_stats.json").write_text("{}")
    folder = base / "00000"
    folder.mkdir()
    for field, data in sample("000", "https://e.x/0.jpg", "a dog on a beach")[1].items():
        (folder / f"000.{field}").write_bytes(data)
    expected = [("written", "https://e.x/0.jpg"), ("read/download_failed/http_404", "https://e.x/1.jpg")]
    directory = escape_glob(str(base))
    assert_read(f"{directory}/*", expected)  # the folder's files are read once, with the shard
    assert_read(f"{directory}/*.parquet", expected)


def test_build_accounts_for_mixed_inputs(tmp_path):
    """A URL list, an unknown file and a shard whose metadata Parquet is unreadable: the build's
    reconciliation (input == rows the files state + unreadable files) holds."""
    from pipeline.build import launcher

    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "urls.tsv").write_text("url\tcaption\nhttps://e.x/1.jpg\ta dog on a beach\nbroken line\n")
    (inputs / "notes.bin").write_bytes(b"\x00")
    write_shard(inputs, [sample("000", "https://e.x/0.jpg", "a dog on a beach")],
                [meta("000", "https://e.x/0.jpg", "a dog on a beach")])
    (inputs / "00000.parquet").write_bytes(b"not parquet")
    funnel = launcher.run(["--input", str(inputs / "*"), "--output", str(tmp_path / "out")])
    assert funnel["input"] == 2 + 1 + 2  # 2 lines, 1 unknown file, 1 sample + 1 unreadable metadata file
    assert funnel["stages"][0]["rejected"] == {
        "read/not_downloaded": 1, "read/malformed_line": 1, "read/unknown_format": 1, "read/unreadable_file": 1,
    }


def test_read_limits_are_flags_listed_in_the_manual_and_checked(tmp_path):
    import argparse
    import os
    import re

    from pipeline.build import launcher, options
    from pipeline.build.config import resolve
    from pipeline.readers import limits

    parser = argparse.ArgumentParser()
    limits.add_arguments(parser)
    flags = {a.option_strings[0]: a.default for a in parser._actions if a.option_strings[0].startswith("--read_")}
    readme = open(os.path.join(repo_root.ROOT, "docs", "building.md")).read()
    rows = dict(re.findall(r"^\| `(--read_[a-z_]*)` \| (\d+)", readme, re.M))
    assert rows == {flag: str(default) for flag, default in flags.items()}
    (tmp_path / "in.tsv").write_text("https://e.x/a.jpg\ta caption\n")
    config, _ = resolve(*options.parse(["--input", str(tmp_path / "in.tsv"), "--output", str(tmp_path / "out"),
                                        "--read_max_line_bytes", "4096"]))
    assert config.columns.limits == limits.ReadLimits(max_line_bytes=4096)
    with pytest.raises(options.UsageError, match=r"^--read_max_record_bytes 0: must be a whole number >= 1$"):
        launcher.run(["--input", str(tmp_path / "*.parquet"), "--output", str(tmp_path / "out"),
                      "--read_max_record_bytes", "0"])
