"""The hand-written Example encoder and TFRecord framing against TensorFlow's own."""

import numpy as np
import tensorflow as tf

from common.schema import FEATURES, tf_feature_spec
from common import tfrecord_io as tfrecord


def test_example_parses_with_tensorflow():
    values = {
        "image": bytes(range(256)),
        "texts": "zwei Hunde im Schnee \u00e9\u4e2d",
        "key": "abc",
        "url": "https://example.com/a.jpg",
        "width": 0,
        "height": 2**40,
        "original_width": -1,
        "original_height": 300,
        "sha256": "00" * 32,
        "phash": "f" * 16,
    }
    assert list(values) == list(FEATURES)
    parsed = tf.io.parse_single_example(tfrecord.encode_example(values), tf_feature_spec())
    for name, value in values.items():
        got = parsed[name].numpy()
        expected = value.encode("utf-8") if isinstance(value, str) else value
        assert got == expected, name


def test_example_bytes_equal_tensorflow_serialisation():
    values = {"b": b"xyz", "a": 7}
    proto = tf.train.Example(
        features=tf.train.Features(
            feature={
                "b": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"xyz"])),
                "a": tf.train.Feature(int64_list=tf.train.Int64List(value=[7])),
            }
        )
    )
    assert tf.train.Example.FromString(tfrecord.encode_example(values)) == proto


def test_framed_records_read_back_with_crc_check(tmp_path):
    payloads = [b"", b"one", np.random.default_rng(0).bytes(100_000)]
    path = tmp_path / "x.tfrecord"
    with open(path, "wb") as handle:
        assert tfrecord.write_records(handle, payloads) == 3
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    assert read == payloads
    # A flipped payload byte must fail TensorFlow's checksum verification.
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    try:
        list(tf.data.TFRecordDataset(str(path)))
    except tf.errors.DataLossError:
        pass
    else:
        raise AssertionError("corrupted record was not detected")


def test_first_values_takes_the_named_features_and_walks_no_further_than_it_needs():
    import pytest

    payload = tfrecord.encode_example({"image": b"pic", "texts": "", "key": "k", "width": 3, "height": 4,
                                       "sha256": "00"})
    wanted = ("key", "image", "width", "height")
    assert tfrecord.first_values(payload, wanted) == {"key": b"k", "image": b"pic", "width": 3, "height": 4}
    assert tfrecord.first_values(payload, ("key", "absent")) == {"key": b"k"}
    damaged = payload + b"\x0b"  # a field of an unsupported wire type after the features
    with pytest.raises(ValueError, match="wire type"):
        tfrecord.decode_example(damaged, names=wanted, first_only=True)  # walks every field
    assert tfrecord.first_values(damaged, wanted)["width"] == 3  # had all it needed before the damage
    with pytest.raises(ValueError, match="wire type"):
        tfrecord.first_values(damaged, ("key", "absent"))
