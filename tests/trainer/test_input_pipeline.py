"""Preprocessing ops and the resumable, per-host input pipeline on the tiny corpus."""

import collections
import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from common import schema
from trainer import input_pipeline, preprocess
from trainer.input_pipeline import make_dataset

IMAGE_SIZE = 32
BATCH = 6  # does not divide 64: batches straddle epoch boundaries
MAX_LEN = 16
NUM_BATCHES = 14  # > one epoch (64 records = 10.7 batches)


# ---------------------------------------------------------------------------
# Preprocessing ops (eager, no pipeline)
# ---------------------------------------------------------------------------


def encoded(array, fmt):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt)
    return tf.constant(buffer.getvalue())


def gradient_image(height=40, width=50):
    y, x = np.mgrid[:height, :width]
    return np.stack([x * 5, y * 6, (x + y) * 2], axis=-1).astype(np.uint8)


def test_parse_op_reads_literal_args_and_kwargs():
    assert preprocess.parse_op("flip_lr") == ("flip_lr", (), {})
    assert preprocess.parse_op("value_range(-1, 1, key='img')") == ("value_range", (-1, 1), {"key": "img"})
    assert preprocess.parse_op(" resize((20, 30)) ") == ("resize", ((20, 30),), {})
    with pytest.raises(KeyError, match="unknown preprocessing op"):
        preprocess.get_preprocess_fn("decode|sharpen(2)")


def test_decode_resize_central_crop_value_range_on_png_and_jpeg():
    image = gradient_image()
    pp = preprocess.get_preprocess_fn("decode|resize(40)|central_crop(20)|value_range(-1,1)")
    out = pp({"image": encoded(image, "PNG")})["image"].numpy()
    assert out.shape == (20, 20, 3) and out.dtype == np.float32
    assert -1.0 <= out.min() and out.max() <= 1.0
    # central crop of the (40x40-resized) lossless image: row 10..29, cols 10..29.
    resized = tf.cast(tf.round(tf.image.resize(image, (40, 40))), tf.uint8).numpy()
    np.testing.assert_allclose(out, resized[10:30, 10:30] / 127.5 - 1.0, atol=1e-6)
    jpeg = pp({"image": encoded(image, "JPEG")})["image"].numpy()
    assert np.abs(jpeg - out).mean() < 0.05  # same picture, lossy


def test_decode_with_size_uses_the_coarsest_jpeg_scale_that_covers_it():
    image = np.repeat(np.repeat(gradient_image(75, 100), 4, axis=0), 4, axis=1)  # 300 x 400
    jpeg, png = encoded(image, "JPEG"), encoded(image, "PNG")

    def decoded(spec, raw):
        return preprocess.get_preprocess_fn(spec)({"image": raw})["image"].numpy()

    full = decoded("decode", jpeg)
    assert full.shape == (300, 400, 3)
    assert decoded("decode(300)", jpeg).shape == (300, 400, 3)
    assert decoded("decode(100)", jpeg).shape == (150, 200, 3)
    assert decoded("decode(72)", jpeg).shape == (75, 100, 3)  # 1/8 would give 38 < 72
    assert decoded("decode(72)", png).shape == (300, 400, 3)  # only JPEGs have DCT scales
    small = decoded("decode(72)|resize(72)", jpeg).astype(np.float32)
    reference = decoded("decode|resize(72)", jpeg).astype(np.float32)
    assert np.abs(small - reference).mean() < 3.0  # same picture, on the 0..255 scale


def test_resize_antialiases_a_downscale():
    """One-pixel stripes reduced 4x: the antialiased resize averages them to grey;
    a plain bilinear one samples the stripes and keeps black and white columns."""
    stripes = np.zeros((64, 64, 3), np.uint8)
    stripes[:, ::2] = 255
    stripes[:, 1::4] = 255  # period 4: 3 of 4 columns white
    data = {"image": tf.constant(stripes)}
    smooth = preprocess.get_preprocess_fn("resize(16)")(data)["image"].numpy().astype(np.float32)
    aliased = preprocess.get_preprocess_fn("resize(16, antialias=False)")(data)["image"].numpy()
    inner = (slice(None), slice(1, -1))  # the border columns see the edge padding
    assert np.abs(smooth[inner] - 0.75 * 255).max() < 8
    assert np.abs(aliased[inner].astype(np.float32) - 0.75 * 255).min() > 40


def test_value_range_maps_the_endpoints():
    pp = preprocess.get_preprocess_fn("value_range(-1,1)")
    out = pp({"image": tf.constant([[[0, 255, 51]]], tf.uint8)})["image"].numpy()
    np.testing.assert_allclose(out.ravel(), [-1.0, 1.0, -0.6], atol=1e-6)


def test_random_ops_are_a_function_of_the_example_seed():
    pp = preprocess.get_preprocess_fn("random_crop(16)|flip_lr")
    image = tf.constant(gradient_image())

    def run(seed):
        return pp({"image": image, preprocess.RNG_KEY: tf.constant(seed, tf.int64)})["image"].numpy()

    np.testing.assert_array_equal(run([1, 2]), run([1, 2]))
    outputs = {run([1, k]).tobytes() for k in range(8)}
    assert len(outputs) > 4
    with pytest.raises(KeyError, match="is random"):
        pp({"image": image})


def colour_scene():
    """A grey square on a saturated red background, plus a white and a black pixel."""
    image = np.zeros((8, 8, 3), np.uint8)
    image[..., 0] = 200
    image[2:6, 2:6] = 128
    image[0, 0], image[0, 1] = 255, 0
    return image


def colour_ops_run(spec, image, seeds):
    pp = preprocess.get_preprocess_fn(spec)
    return [pp({"image": tf.constant(image), preprocess.RNG_KEY: tf.constant([7, k], tf.int64)})["image"].numpy()
            for k in seeds]


def test_random_hue_rotates_colours_and_keeps_greys_and_brightness():
    image = colour_scene()
    outputs = colour_ops_run("random_hue(1.0)", image, range(32))
    background_hues = set()
    for out in outputs:
        assert out.dtype == np.uint8 and out.shape == image.shape
        np.testing.assert_array_equal(out[2:6, 2:6], image[2:6, 2:6])  # grey: no hue to rotate
        np.testing.assert_array_equal(out[0, :2], image[0, :2])  # white and black
        background = out[7, 7].astype(int)
        assert abs(background.max() - 200) <= 1 and background.min() <= 1  # value, saturation kept
        assert (out[6:, :] == out[7, 7]).all()  # one rotation for the whole image
        background_hues.add(tuple(background // 20))
    assert len(background_hues) > 10  # the whole colour circle, not a small jitter
    # Seeded: the same example seed gives the same image, on any thread, resumed or not.
    np.testing.assert_array_equal(outputs[3], colour_ops_run("random_hue(1.0)", image, [3])[0])


def test_random_colour_ops_apply_with_probability_p():
    image = colour_scene()
    seeds = range(200)
    for spec, p in (("random_hue(0.5)", 0.5), ("random_grayscale(0.5)", 0.5), ("random_grayscale(0.2)", 0.2),
                    ("random_hue(0.0)", 0.0), ("random_grayscale(1.0)", 1.0)):
        changed = [not np.array_equal(out, image) for out in colour_ops_run(spec, image, seeds)]
        assert abs(np.mean(changed) - p) < 0.1, (spec, np.mean(changed))
    grey = colour_ops_run("random_grayscale(1.0)", image, [0])[0]
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    assert abs(int(grey[7, 7, 0]) - 0.299 * 200) <= 1  # ITU-R 601 luma of the red background
    np.testing.assert_array_equal(grey[2:6, 2:6], image[2:6, 2:6])


def test_colour_augment_is_training_only_and_follows_the_crop():
    spec = input_pipeline.image_preprocess(32, 36, train=True, flip_lr=False, colour_augment="random_hue(0.5)")
    assert spec == "decode(36)|resize(36)|random_crop(32)|random_hue(0.5)|value_range(-1,1)"
    assert input_pipeline.image_preprocess(32, 36, train=True) == (
        "decode(36)|resize(36)|random_crop(32)|flip_lr|value_range(-1,1)")
    assert "hue" not in input_pipeline.image_preprocess(32, 36, train=False, colour_augment="random_hue(1.0)")


def test_tokenize_op_needs_a_tokenizer_from_context(tokenizer):
    with pytest.raises(ValueError, match="tokenizer"):
        preprocess.get_preprocess_fn("tokenize")
    pp = preprocess.get_preprocess_fn("tokenize|keep('text')", tokenizer=tokenizer)
    out = pp({"texts": tf.constant("red circle"), "key": tf.constant("k")})
    assert list(out) == ["text"]
    assert out["text"].numpy().tolist() == tokenizer.tokenize_numpy(["red circle"])[0].tolist()


# ---------------------------------------------------------------------------
# make_dataset
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    assert tiny_tokenizer.max_len == MAX_LEN
    return tiny_tokenizer


@pytest.fixture(scope="module")
def split_keys(tiny_corpus):
    """Keys of every record per split, read straight from the shards."""
    keys = {}
    for split in schema.SPLITS:
        records = tf.data.TFRecordDataset(input_pipeline.list_shards(tiny_corpus, split))
        keys[split] = [input_pipeline.parse_fields(r, ["key"])["key"].numpy() for r in records]
    return keys


def dataset(tiny_corpus, tokenizer, split="train", *, train=True, seed=0, batch=BATCH, **kwargs):
    kwargs.setdefault("process_index", 0)
    kwargs.setdefault("process_count", 1)
    return make_dataset(
        tiny_corpus, split, global_batch_size=batch, image_size=IMAGE_SIZE, train=train,
        seed=seed, tokenizer=tokenizer, resize_size=36, **kwargs,
    )


def take(ds, n):
    iterator = ds.as_numpy_iterator()
    return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.fixture(scope="module")
def train_stream(tiny_corpus, tokenizer):
    """The first NUM_BATCHES batches of the uninterrupted seed-0 train stream."""
    return take(dataset(tiny_corpus, tokenizer), NUM_BATCHES)


def test_train_batch_shapes_dtypes_and_ranges(train_stream, tokenizer):
    batch = train_stream[0]
    assert set(batch) == {"image", "text", "key"}
    assert batch["image"].shape == (BATCH, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert batch["image"].dtype == np.float32
    assert -1.0 <= batch["image"].min() < 0.0 < batch["image"].max() <= 1.0
    assert batch["text"].shape == (BATCH, MAX_LEN) and batch["text"].dtype == np.int32
    assert (batch["text"][:, 0] == tokenizer.cls_id).all()
    assert batch["key"].shape == (BATCH,) and isinstance(batch["key"][0], bytes)


def test_each_epoch_is_a_reshuffled_pass_over_all_records(train_stream, split_keys):
    keys = [k for batch in train_stream for k in batch["key"]]
    first, second = keys[:64], keys[64:]
    assert sorted(first) == sorted(split_keys["train"])
    assert first != split_keys["train"]  # shuffled
    assert second != first[: len(second)]  # epoch 1 has its own order


def test_same_seed_same_stream_other_seed_other_stream(tiny_corpus, tokenizer, train_stream):
    assert_batches_equal(take(dataset(tiny_corpus, tokenizer), 3), train_stream[:3])
    other = take(dataset(tiny_corpus, tokenizer, seed=1), 1)[0]
    assert other["key"].tolist() != train_stream[0]["key"].tolist()


def test_start_batch_resumes_exactly_inside_a_later_epoch(tiny_corpus, tokenizer, train_stream):
    # Batch 11 starts at record 66: epoch 1, offset 2.
    resumed = take(dataset(tiny_corpus, tokenizer, start_batch=11), NUM_BATCHES - 11)
    assert_batches_equal(resumed, train_stream[11:])


def test_resume_with_two_hosts_uses_this_hosts_epoch_length(tiny_corpus, tokenizer, split_keys):
    # Host 1 of 2 reads shard 1 only (21 records, 3 per batch): batch 8 starts
    # at record 24 = epoch 1, offset 3, and batch 14 crosses into epoch 2.
    host = dict(process_index=1, process_count=2, batch=2 * 3)
    stream = take(dataset(tiny_corpus, tokenizer, **host), 15)
    first_epoch = [k for batch in stream for k in batch["key"]][:21]
    assert sorted(first_epoch) == sorted(split_keys["train"][22:43])
    assert_batches_equal(take(dataset(tiny_corpus, tokenizer, start_batch=8, **host), 7), stream[8:])


def test_shard_lengths_counted_when_dataset_info_is_missing(tiny_corpus, tmp_path):
    files = input_pipeline.list_shards(tiny_corpus, "train")
    with open(os.path.join(tiny_corpus, "dataset_info.json")) as f:
        info = json.load(f)
    expected = [int(n) for s in info["splits"] if s["name"] == "train" for n in s["shardLengths"]]
    assert input_pipeline.shard_lengths(tiny_corpus, "train", files) == expected
    assert input_pipeline.shard_lengths(str(tmp_path), "train", files) == expected


@pytest.mark.parametrize(
    "split, process_count",
    [("train", 2), ("validation", 3)],  # 3 files >= 2 hosts: by file; 2 files < 3 hosts: by record
)
def test_eval_hosts_partition_the_split_in_order_keeping_partial_batches(
    tiny_corpus, tokenizer, split_keys, split, process_count
):
    files = input_pipeline.list_shards(tiny_corpus, split)
    lengths = input_pipeline.shard_lengths(tiny_corpus, split, files)
    file_keys = np.split(np.array(split_keys[split], dtype=object), np.cumsum(lengths)[:-1])
    host_batch = 4
    seen = []
    for index in range(process_count):
        ds = dataset(
            tiny_corpus, tokenizer, split, train=False, batch=host_batch * process_count,
            process_index=index, process_count=process_count,
        )
        batches = list(ds.as_numpy_iterator())
        keys = [k for b in batches for k in b["key"]]
        if len(files) >= process_count:
            expected = [k for f in file_keys[index::process_count] for k in f]
        else:
            expected = split_keys[split][index::process_count]
        assert keys == expected  # one pass, file order, this host's share
        full, rest = divmod(len(keys), host_batch)
        assert [len(b["key"]) for b in batches] == [host_batch] * full + ([rest] if rest else [])
        seen += keys
    assert len(seen) == len(set(seen))  # disjoint
    assert sorted(seen) == sorted(split_keys[split])  # covering


def test_global_batch_must_split_evenly_over_hosts(tiny_corpus, tokenizer):
    with pytest.raises(ValueError, match="not divisible"):
        dataset(tiny_corpus, tokenizer, batch=5, process_index=0, process_count=2)


def test_to_global_array_puts_the_batch_on_the_data_axis(train_stream):
    import jax

    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("data",), devices=devices)
    rows = 2 * len(devices)
    batch = {
        "image": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3),
        "text": np.arange(rows, dtype=np.int32)[:, None],
        "key": train_stream[0]["key"][:1].repeat(rows),
    }
    out = input_pipeline.to_global_array(batch, mesh)
    assert isinstance(out["key"], np.ndarray)  # strings stay on the host
    assert out["image"].shape == (rows, 3)
    assert out["image"].sharding.spec == jax.sharding.PartitionSpec("data")
    for shard in out["image"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), batch["image"][shard.index])
    np.testing.assert_array_equal(np.asarray(out["text"]), batch["text"])


def test_resume_position_is_a_seek_to_one_shard():
    lengths = [22, 21, 21]
    order = lambda epoch: [2, 0, 1] if epoch % 2 else [1, 2, 0]  # noqa: E731
    assert input_pipeline.resume_position(0, lengths, order) == (0, 0, 0)
    assert input_pipeline.resume_position(20, lengths, order) == (0, 0, 20)   # inside shard 1
    assert input_pipeline.resume_position(21, lengths, order) == (0, 1, 0)    # shard 2 starts
    assert input_pipeline.resume_position(63, lengths, order) == (0, 2, 21)   # last of shard 0
    assert input_pipeline.resume_position(64 + 25, lengths, order) == (1, 1, 4)
    for consumed in range(0, 200, 7):
        epoch, position, skip = input_pipeline.resume_position(consumed, lengths, order)
        assert skip < lengths[order(epoch)[position]]


def test_restore_reads_no_shard_before_its_position(tiny_corpus, tokenizer, train_stream, monkeypatch):
    # Count every raw record read, by (epoch, shard): a restore must open only
    # the shard it resumes in (skipping fewer records than it holds) and no
    # shard that precedes it in that epoch; the batches are the uninterrupted ones.
    reads = collections.Counter()

    def counting_open(path, epoch, reader):
        def count(p, e):
            reads[(int(e.numpy()), p.numpy().decode())] += 1
            return np.int64(0)

        records = reader.dataset(path)
        return records.map(lambda r: (r, tf.py_function(count, [path, epoch], tf.int64))).map(lambda r, _: r)

    monkeypatch.setattr(input_pipeline, "_open_shard", counting_open)
    files = input_pipeline.list_shards(tiny_corpus, "train")
    lengths = input_pipeline.shard_lengths(tiny_corpus, "train", files)
    order_seed = tf.constant([0, 1], tf.int64)
    order = input_pipeline._shard_order(order_seed, None, len(files))
    start = 9  # record 54 of 64: the last shard of epoch 0's order
    epoch, position, skip = input_pipeline.resume_position(start * BATCH, lengths, order)
    assert (epoch, position) == (0, 2) and 0 < skip < lengths[order(0)[2]]
    resumed = take(dataset(tiny_corpus, tokenizer, start_batch=start), 2)
    assert_batches_equal(resumed, train_stream[start:start + 2])
    earlier = {files[i] for i in order(0)[:position]}
    assert not {path for (e, path) in reads if e == 0} & earlier
    in_epoch_0 = sum(n for (e, _), n in reads.items() if e == 0)
    assert skip < in_epoch_0 <= lengths[order(0)[position]]  # one shard's worth, at most


def test_list_shards_takes_the_directory_literally(tiny_corpus, tmp_path):
    """A corpus in ``c[1]`` reads its own shards, not those of a neighbouring ``c1``."""
    import shutil

    literal, neighbour = tmp_path / "c[1]", tmp_path / "c1"
    shutil.copytree(tiny_corpus, literal)
    neighbour.mkdir()
    (neighbour / "other-train.tfrecord-00000-of-00001").write_bytes(b"")
    files = input_pipeline.list_shards(str(literal), "train")
    assert files and all(os.path.dirname(f) == str(literal) for f in files)
    assert len(files) == len(input_pipeline.list_shards(tiny_corpus, "train"))
    with pytest.raises(FileNotFoundError):
        input_pipeline.list_shards(str(tmp_path / "c[2]"), "train")
