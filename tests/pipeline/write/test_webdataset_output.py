"""--webdataset: img2dataset-layout tars of the same records as the TFRecord shards, read by the webdataset library.

A tiny real build with --webdataset (the candidate table's planted inputs):
the tars hold the TFRecord shards' records with the same bytes, read by the
PyPI ``webdataset`` package and by this project's own WebDataset reader; the
docs' DataLoader snippet runs on them. The tar writer and the stored-copy
reader are also tested on their own.
"""

import glob
import io
import json
import re
import tarfile

import pytest

from common.corpus_dir import resolve
from common.schema import Candidate
from pipeline.build import launcher
from pipeline.readers.file_records import file_records
from pipeline.write import tar_shards
from pipeline.write.stored_copies import StoredCopies, stored_at
from repo_root import ROOT
from tests.pipeline.build.test_build_safety import QUICK
from tests.pipeline.select.test_select import records
from tests.pipeline.write.test_candidate_table import PLANTED, write_planted

wds = pytest.importorskip("webdataset")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    pattern = write_planted(root / "in")
    launcher.run(["--input", str(pattern), "--output", str(root / "corpus"), "--webdataset", *QUICK])
    return resolve(str(root / "corpus"))


def tars(version):
    return sorted(glob.glob(f"{version}/*/*.tar"))


def test_the_webdataset_library_reads_the_records_of_the_tfrecord_shards(built):
    expected = records(built)
    assert len(expected) == sum(p[4] == "written" for p in PLANTED)
    seen = {}
    for sample in wds.WebDataset(tars(built), shardshuffle=False):
        assert set(sample) >= {"__key__", "jpg", "txt", "json"}
        seen[sample["__key__"]] = sample
    assert set(seen) == set(expected)
    for key, sample in seen.items():
        split, features = expected[key]
        info = json.loads(sample["json"])
        assert sample["jpg"] == features["image"][0] and sample["txt"] == features["texts"][0]
        assert (info["key"], info["url"].encode(), info["sha256"].encode()) == (key, features["url"][0],
                                                                              features["sha256"][0])
        assert (info["width"], info["height"]) == (features["width"][0], features["height"][0])
        assert info["status"] == "success" and sample["__url__"].endswith(f"/{split}/00000.tar")


def test_the_projects_reader_reads_them_back(built):
    expected = records(built)
    read = [r for path in tars(built) for r in file_records("webdataset", path)]
    assert all(isinstance(r, Candidate) for r in read) and len(read) == len(expected)
    for record in read:
        assert record.key in expected, record.key  # the key of (url, alt-text) again: the same record
        features = expected[record.key][1]
        assert record.image == features["image"][0] and record.alt_text.encode() == features["texts"][0]


def test_the_manifest_lists_the_tars_the_publication_checked(built):
    manifest = json.loads(open(f"{built}/manifest.json").read())
    listed = manifest["webdataset"]["train"]
    assert listed["files"] == ["train/00000.tar"] and sum(listed["records"]) == len(records(built))
    assert listed["bytes"] == [len(open(f"{built}/train/00000.tar", "rb").read())]


def test_the_docs_dataloader_snippet_runs(built):
    pytest.importorskip("torch")
    page = open(f"{ROOT}/docs/output.md").read().split("## WebDataset tars", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    snippet = snippet.replace("OUTPUT/versions/VERSION", str(built))
    out = io.StringIO()
    exec(compile(snippet, "docs/output.md", "exec"), {"print": lambda *a: out.write(" ".join(map(str, a)))})
    assert "https://e.x/" in out.getvalue()


def candidate(key, text="a caption", image=b"\xff\xd8jpeg bytes\xff\xd9" * 37):
    return Candidate(key=key, url=f"https://e.x/{key}", alt_text=text, text=text, image=image, width=640, height=480,
                     stored_width=320, stored_height=240, sha256="s" * 64, phash="p" * 16)


def test_a_tar_is_deterministic_standard_and_read_back_at_each_offset(tmp_path):
    offsets = []
    for path in (tmp_path / "a.tar", tmp_path / "b.tar"):
        writer = tar_shards.TarShardWriter(str(path))
        offsets = [writer.write(candidate(f"{i:024x}", text="x" * (i * 300))) for i in range(3)]
        info = writer.close()
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    assert info["records"] == 3 and info["bytes"] == len((tmp_path / "a.tar").read_bytes())
    with tarfile.open(tmp_path / "a.tar") as archive:  # the standard library agrees on the layout
        names = archive.getnames()
        assert names[:3] == [f"{0:024x}.jpg", f"{0:024x}.txt", f"{0:024x}.json"] and len(names) == 9
    copies = StoredCopies()
    for i, offset in enumerate(offsets):
        key, image, width, height = copies.read(stored_at(str(tmp_path / "a.tar"), offset))
        assert (key, image, width, height) == (f"{i:024x}", candidate("k").image, 320, 240)
    assert copies.read(stored_at(str(tmp_path / "a.tar"), offsets[1] + 1)) is None  # not a header: made anew
    copies.close()


def test_the_tar_list_is_per_split_in_index_order():
    document = tar_shards.tar_list([("train", 1, {"records": 2, "bytes": 9, "crc32c": "b"}),
                                    ("train", 0, {"records": 1, "bytes": 8, "crc32c": "a"})])
    assert document == {"train": {"files": ["train/00000.tar", "train/00001.tar"], "records": [1, 2],
                                  "bytes": [8, 9], "crc32c": ["a", "b"]}}
    with pytest.raises(ValueError, match="not 0..1"):
        tar_shards.tar_list([("train", 0, {}), ("train", 2, {})])
