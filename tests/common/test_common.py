"""Shared ground: file access and EXIF orientation."""


import numpy as np
import pytest
from PIL import Image, ImageOps

from common import files, images
from tests import images as made


def test_files_round_trip_raw_bytes_and_make_folders(tmp_path):
    path = str(tmp_path / "deeper" / "report.json.gz")  # a .gz name is not decompressed
    files.write_bytes(path, b"not gzip at all")
    assert files.exists(path) and not files.exists(path + ".missing")
    assert files.read_bytes(path) == b"not gzip at all"
    files.write_text(files.join(str(tmp_path), "t.txt"), "caf\u00e9")
    assert files.read_text(str(tmp_path / "t.txt")) == "caf\u00e9"


def test_match_keeps_relative_paths_and_recurses(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ["a/x.png", "a/b/y.png"]:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert files.match("a/**") == ["a/b/y.png", "a/x.png"]
    assert not files.is_remote("a/x.png") and files.is_remote("gs://bucket/x")


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_agrees_with_pil_and_unorient_inverts_it(orientation):
    upright = Image.fromarray(np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3))
    stored = images.unorient(upright, orientation)
    assert images.upright_size(stored.size, orientation) == upright.size
    opened = images.open_image(made.with_orientation(stored, orientation, "PNG"))
    assert images.exif_orientation(opened) == orientation
    ours = images.orient(opened, orientation)
    assert np.array_equal(np.asarray(ours), np.asarray(upright))
    assert np.array_equal(np.asarray(ImageOps.exif_transpose(opened)), np.asarray(upright))


def test_broken_exif_counts_as_upright():
    class Broken:
        def getexif(self):
            raise ValueError("corrupt EXIF")

    assert images.exif_orientation(Broken()) == 1
