"""tf.data input pipeline over the project's TFRecord shards."""

from __future__ import annotations

import tensorflow as tf

from pipeline import schema


def list_shards(data_dir: str, split: str) -> list[str]:
    """Sorted shard paths of ``split`` (local or gs://); raises if there are none."""
    files = sorted(tf.io.gfile.glob(schema.shard_glob(data_dir, split)))
    if not files:
        raise FileNotFoundError(f"no shards match {schema.shard_glob(data_dir, split)}")
    return files


def parse_fields(serialized, names):
    """Parses only the named features of serialized examples (scalar or batch)."""
    spec = schema.tf_feature_spec()
    wanted = {name: spec[name] for name in names}
    if serialized.shape.rank == 0:
        return tf.io.parse_single_example(serialized, wanted)
    return tf.io.parse_example(serialized, wanted)


def read_texts(data_dir: str, split: str) -> tf.data.Dataset:
    """The alt-texts of ``split``, in file order (for the vocabulary builder)."""
    records = tf.data.TFRecordDataset(list_shards(data_dir, split), num_parallel_reads=4)
    return records.batch(1024).map(lambda r: parse_fields(r, ["texts"])["texts"]).unbatch()
