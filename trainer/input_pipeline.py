"""tf.data input pipeline over the project's TFRecord shards.

``make_dataset`` yields this host's share of every global batch:
``{"image": float32 [B_host, S, S, 3] in [-1, 1], "text": int32 [B_host, L],
"key": string [B_host]}``.

How the stream is made resumable. In train mode the host's records form a
sequence of epochs; epoch ``e`` is the host's files in an order drawn from
``(seed, e)``, interleaved, then shuffled with a buffer seeded from
``(seed, e)``. Each epoch is a pure function of ``(seed, e)`` and nothing
(not the shuffle buffer) carries over from one epoch to the next, so the
stream is a pure function of the seed. Each record is tagged with its
(epoch, index-in-epoch) position and its augmentation seed is derived from
that position. Resuming at batch ``n`` therefore means: start at epoch
``n * B_host // N_host`` and skip ``n * B_host % N_host`` *raw* records of it
(before parsing or decoding; costs at most one epoch of raw reads), and the
result is exactly the uninterrupted stream from batch ``n`` on. ``N_host``
comes from ``dataset_info.json``'s shard lengths (counted if absent).

Per-host sharding: with at least as many files as hosts, host ``i`` reads
files ``i, i + P, i + 2P, ...``; with fewer files, every host reads all files
and keeps records ``i, i + P, ...`` of the (identically ordered) stream.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from common import schema
from trainer import preprocess

#: ALIGN: resize to 346 then crop 289; other image sizes keep that ratio.
RESIZE_RATIO = 346 / 289
DEFAULT_SHUFFLE_BUFFER = 10_000
MAX_INTERLEAVE = 16
_MAX_EPOCHS = 2**40  # "forever", kept inside int64 position arithmetic


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
    """The alt-texts of ``split`` (for the vocabulary builder; word counts ignore order)."""
    records = tf.data.TFRecordDataset(list_shards(data_dir, split), num_parallel_reads=4)
    return records.batch(1024).map(lambda r: parse_fields(r, ["texts"])["texts"]).unbatch()


def shard_lengths(data_dir: str, split: str, files: list[str]) -> list[int]:
    """Records per file: from dataset_info.json when it describes these files, else counted."""
    info_path = os.path.join(data_dir, "dataset_info.json")
    if tf.io.gfile.exists(info_path):
        with tf.io.gfile.GFile(info_path) as f:
            info = json.load(f)
        for entry in info.get("splits", []):
            lengths = [int(n) for n in entry.get("shardLengths", [])]
            if entry.get("name") == split and len(lengths) == len(files):
                return lengths
    return [int(tf.data.TFRecordDataset(path).reduce(np.int64(0), lambda n, _: n + 1)) for path in files]


def image_preprocess(image_size: int, resize_size: Optional[int], train: bool,
                     flip_lr: bool = True) -> str:
    """ALIGN's image ops: resize, random crop + flip (train) or central crop (eval).

    ``flip_lr=False`` drops the horizontal flip: a flip contradicts captions
    that say "left of" / "right of" (the sample corpus has them).

    ``decode(resize_size)`` lets a large JPEG decode at a reduced DCT scale
    that still covers the resize target (see ``preprocess.decode``).
    """
    resize_size = resize_size or round(image_size * RESIZE_RATIO)
    crop = f"random_crop({image_size})" + ("|flip_lr" if flip_lr else "") if train else (
        f"central_crop({image_size})")
    return f"decode({resize_size})|resize({resize_size})|{crop}|value_range(-1,1)"


def make_dataset(
    data_dir: str,
    split: str,
    *,
    global_batch_size: int,
    image_size: int,
    train: bool,
    seed: int,
    tokenizer,
    start_batch: int = 0,
    process_index: Optional[int] = None,
    process_count: Optional[int] = None,
    resize_size: Optional[int] = None,
    flip_lr: bool = True,
    shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
    preprocess_spec: Optional[str] = None,
    extra_features: Sequence[str] = (),
) -> tf.data.Dataset:
    """This host's batches of ``split``; see the module docstring for the guarantees.

    Train: repeats forever, shuffled, augmented, drops the remainder; batch
    ``n`` is a pure function of ``(data, seed, n)``. Eval: one pass in file
    order, central crop, keeps the final partial batch.

    ``preprocess_spec`` replaces the per-example image ops of
    ``image_preprocess`` (``trainer.preprocess`` syntax, over the parsed
    ``schema.FEATURES``). Alt-texts are tokenised per batch, after batching:
    BERT tokenisation of a batch costs ~1/20 of one call per example.
    ``extra_features`` adds parsed features to the output (e.g. ``"sha256"``).
    """
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if global_batch_size % process_count:
        raise ValueError(f"global batch {global_batch_size} not divisible by {process_count} hosts")
    host_batch = global_batch_size // process_count
    spec = preprocess_spec or image_preprocess(image_size, resize_size, train, flip_lr)
    preprocess_fn = preprocess.get_preprocess_fn(spec)
    outputs = tuple(dict.fromkeys(("image", "texts", "key", *extra_features)))

    files = list_shards(data_dir, split)
    by_file = len(files) >= process_count
    host_files = files[process_index::process_count] if by_file else files
    augment_seed = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, 0], tf.int64), process_index
    )
    order_seed = tf.constant([seed, 1], tf.int64)

    # Plain graph code, no Python control flow on tensors: skip autograph's
    # conversion pass (it is most of the tracing time).
    @tf.autograph.experimental.do_not_convert
    def epoch_records(epoch):
        """(epoch, index, serialized) of this host's records in epoch ``epoch``."""
        paths = tf.constant(host_files)
        if train:
            epoch_seed = tf.random.experimental.stateless_fold_in(order_seed, epoch)
            paths = tf.gather(paths, tf.argsort(tf.random.stateless_uniform([len(host_files)], seed=epoch_seed)))
            records = tf.data.Dataset.from_tensor_slices(paths).interleave(
                tf.data.TFRecordDataset,
                cycle_length=min(len(host_files), MAX_INTERLEAVE),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
        else:
            records = tf.data.TFRecordDataset(paths)  # file order, one file after another
        if not by_file:
            records = records.shard(process_count, process_index)
        if train:
            shuffle_seed = tf.random.stateless_uniform([], seed=epoch_seed, minval=None, maxval=None, dtype=tf.int64)
            records = records.shuffle(shuffle_buffer_size, seed=shuffle_seed, reshuffle_each_iteration=False)
        return records.enumerate().map(lambda index, record: (epoch, index, record))

    skip = start_batch * host_batch
    if train:
        first_epoch = 0
        if skip:
            lengths = shard_lengths(data_dir, split, files)
            total = sum(lengths[process_index::process_count]) if by_file else len(
                range(process_index, sum(lengths), process_count)
            )
            if total == 0:
                raise ValueError(f"host {process_index} has no {split} records")
            first_epoch, skip = divmod(skip, total)
        epochs = tf.data.Dataset.range(first_epoch, _MAX_EPOCHS)
        records = epochs.flat_map(epoch_records)
    else:
        records = epoch_records(tf.constant(0, tf.int64))
    records = records.skip(skip)

    @tf.autograph.experimental.do_not_convert
    def parse_and_preprocess(epoch, index, serialized):
        data = parse_fields(serialized, schema.FEATURES)
        rng = tf.random.experimental.stateless_fold_in(augment_seed, epoch)
        data[preprocess.RNG_KEY] = tf.random.experimental.stateless_fold_in(rng, index)
        data = preprocess_fn(data)
        return {name: data[name] for name in outputs}

    @tf.autograph.experimental.do_not_convert
    def tokenize(batch):
        # The raw alt-texts stay in the output only when asked for.
        texts = batch["texts"] if "texts" in extra_features else batch.pop("texts")
        batch["text"] = tokenizer.tokenize(texts)
        return batch

    dataset = records.map(parse_and_preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    dataset = dataset.batch(host_batch, drop_remainder=train)
    dataset = dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def to_global_array(batch: dict, mesh) -> dict:
    """Host batch -> jax arrays sharded over ``mesh`` with the batch on axis 'data'.

    Numeric leaves become global arrays (every host passes its own rows, the
    global batch is their concatenation in process order); string leaves
    (``key``) cannot live on devices and stay host-local numpy arrays.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = NamedSharding(mesh, PartitionSpec("data"))

    def put(x):
        x = np.asarray(x)
        if x.dtype.kind in "OSU":
            return x
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(put, batch)
