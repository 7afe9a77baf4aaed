"""Index sets: folders, TFDS-style shards and Parquet, with flipped/cropped variants."""

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from dedup import embedders
from dedup.calibration_images import real_photographs
from dedup.edits import crop_fraction, encode_jpeg
from dedup.index_sets import DEFAULT_VARIANTS, IndexImage, build_index, load_index_sets
from tests import images as made


@pytest.fixture(scope="module")
def pictures():
    """Four unrelated real photographs (PIL, RGB, ~300 px)."""
    by_name = dict(real_photographs())
    return [Image.fromarray(by_name[n]).resize((320, 240)) for n in ("coffee", "rocket", "astronaut", "china")]


@pytest.fixture(scope="module")
def dct():
    return embedders.get("dct")


def test_folder_set_is_read_recursively_with_variants_and_reasons(tmp_path, pictures, dct):
    root = tmp_path / "eval"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.jpg").write_bytes(encode_jpeg(pictures[0]))
    (root / "sub" / "b.png").write_bytes(made.encode(pictures[1], "PNG"))
    (root / "sub" / "deeper" / "c.jpeg").write_bytes(encode_jpeg(pictures[2]))
    (root / "sub" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    (root / "sub" / "notes.txt").write_text("not an image")
    (root / "flat.png").write_bytes(made.encode(Image.new("RGB", (100, 80), (90, 90, 90)), "PNG"))

    index = load_index_sets([("eval", str(root))], dct)

    assert index.vectors.shape == (3 * len(DEFAULT_VARIANTS), dct.dim) and index.vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(index.vectors, axis=1), 1.0, atol=1e-5)
    assert sorted(set(index.keys)) == ["a.jpg", "sub/b.png", "sub/deeper/c.jpeg"]
    assert set(index.set_names) == {"eval"}
    for key in set(index.keys):
        assert sorted(index.variants[index.keys == key]) == sorted(DEFAULT_VARIANTS)
    reasons = {key: reason for _, key, reason in index.skipped}
    assert reasons["sub/broken.jpg"].startswith("undecodable")
    assert reasons["flat.png"] == "featureless"
    row = int(np.flatnonzero(index.keys == "sub/b.png")[0])
    assert index.thumbnail(row) == str(root / "sub" / "b.png")
    assert index.row(row)["set"] == "eval"


def test_variants_catch_mirrored_and_centre_cropped_copies(pictures, dct):
    index = build_index([IndexImage("eval", "p0", encode_jpeg(pictures[0], 95))], dct)
    mirrored = encode_jpeg(ImageOps.mirror(pictures[0]))
    cropped = encode_jpeg(crop_fraction(pictures[0], 0.8).resize((300, 200)))
    queries = dct.embed([mirrored, cropped])
    best = queries @ index.vectors.T
    assert index.variants[best[0].argmax()] == "flip" and best[0].max() > dct.threshold
    assert index.variants[best[1].argmax()] == "center_crop_80" and best[1].max() > dct.threshold
    original = index.variants == "original"
    assert (best[:, original] < dct.threshold).all()  # only the variants make these matches


def test_tfds_shards_and_parquet_sets_load_together(tmp_path, pictures, dct):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from common import tfrecord_io as tfrecord

    shards = tmp_path / "coco"
    shards.mkdir()
    with open(shards / "coco-test.tfrecord-00000-of-00001", "wb") as f:
        tfrecord.write_records(
            f,
            [
                tfrecord.encode_example({"image": encode_jpeg(pictures[0]), "texts": "a cup", "key": "k0"}),
                tfrecord.encode_example({"image": encode_jpeg(pictures[1]), "texts": "a rocket", "key": "k1"}),
            ],
        )
    (shards / "dataset_info.json").write_text("{}")
    table = pa.table(
        {
            "key": ["p0", "p1"],
            # Hugging Face style: the image column is a {bytes, path} struct.
            "image": [{"bytes": encode_jpeg(pictures[2]), "path": "x.jpg"}, {"bytes": encode_jpeg(pictures[3]), "path": ""}],
        }
    )
    pq.write_table(table, tmp_path / "flickr.parquet")

    index = load_index_sets([("coco", str(shards)), ("flickr", str(tmp_path / "flickr.parquet"))], dct,
                            variants=("original",))

    assert list(zip(index.set_names, index.keys)) == [("coco", "k0"), ("coco", "k1"), ("flickr", "p0"), ("flickr", "p1")]
    assert not index.skipped
    preview = Image.open(io.BytesIO(index.thumbnail(3)))
    assert max(preview.size) <= 128
    # Each row is its own picture: the original's bytes embed to (almost) the same vector.
    direct = dct.embed([encode_jpeg(p) for p in pictures])
    np.testing.assert_array_less(0.99, np.einsum("nd,nd->n", direct, index.vectors))


def test_set_names_must_be_distinct(tmp_path, dct):
    with pytest.raises(ValueError, match="distinct"):
        load_index_sets([("a", str(tmp_path)), ("a", f"{tmp_path}/x")], dct)


def test_unknown_variant_is_rejected(dct):
    with pytest.raises(ValueError, match="unknown variants"):
        build_index([], dct, variants=("original", "rotate_45"))
