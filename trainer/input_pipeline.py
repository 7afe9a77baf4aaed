"""tf.data input pipeline over the project's TFRecord shards.

``make_dataset`` yields this host's share of every global batch:
``{"image": float32 [B_host, S, S, 3] in [-1, 1], "text": int32 [B_host, L],
"key": string [B_host]}``.

How the stream is made resumable in O(shard). In train mode the host's
records form a sequence of epochs; epoch ``e`` reads the host's shards one
after another in an order drawn from ``(seed, e)``, each shard shuffled on its
own (buffer ``shuffle_buffer_size``, seed from ``(seed, e, shard)``). Each
record is tagged with its (epoch, shard, index-in-shuffled-shard) position and
its augmentation seed is derived from that position, so the stream is a pure
function of the seed and the data. Resuming at batch ``n`` is a seek: the
record count ``n * B_host`` gives the epoch, the shard's place in that epoch's
order and the offset inside it (``resume_position``, from
``dataset_info.json``'s shard lengths, counted if absent); the restore opens
that one shard and skips fewer records than it holds. Nothing before it is
read, and the result is exactly the uninterrupted stream from batch ``n`` on.

Mixing. A batch draws from one shard (two at a shard boundary). The
pipeline assigns records to shards by a hash of their key, so every shard is
a uniform random sample of the split and a within-shard shuffle gives
batches with the statistics of the whole split; what it buys is that no
shuffle buffer spans shards, which is what makes the seek exact. (Shards
written any other way, e.g. sorted by source, should be re-sharded first.)

Per-host sharding: with at least as many files as hosts, host ``i`` reads
files ``i, i + P, i + 2P, ...``; with fewer files, every host reads all files
and keeps records ``i, i + P, ...`` of each shuffled shard (train) or of the
file-ordered split (eval).

Every shard is read through a ``trainer.shard_reader.ShardReader``: a damaged
shard stops the stream with one line naming the file, or, with a reader that
skips (``config.skip_corrupt_records``), loses only its damaged records,
counted. Skipped records are not in ``dataset_info.json``'s shard lengths, so
a run that skipped some and then resumes may see up to that many records
again or not at all around the resume point; the stream is otherwise the same.
"""

from __future__ import annotations

import fnmatch
import os
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from common import corpus_dir, schema
from common.corpus_dir import parse_json
from trainer import preprocess
from trainer.shard_reader import ShardReader

#: ALIGN: resize to 346 then crop 289; other image sizes keep that ratio.
RESIZE_RATIO = 346 / 289
DEFAULT_SHUFFLE_BUFFER = 10_000
_MAX_EPOCHS = 2**40  # "forever", kept inside int64 position arithmetic


def list_shards(data_dir: str, split: str) -> list[str]:
    """Sorted shard paths of ``split`` (local or gs://); raises if there are none.

    ``data_dir`` is a literal directory, never a pattern: a corpus in ``c[1]``
    must not read the shards of a neighbouring ``c1``. Only the file names are
    matched against the shard pattern.
    """
    directory = corpus_dir.read_dir(data_dir)
    names_pattern = os.path.basename(schema.shard_glob(directory, split))
    names = tf.io.gfile.listdir(directory) if tf.io.gfile.isdir(directory) else []
    files = sorted(f"{directory}/{name}" for name in names if fnmatch.fnmatchcase(name, names_pattern))
    if not files:
        raise FileNotFoundError(f"no shards named {names_pattern} in {directory}")
    return files


def parse_fields(serialized, names):
    """Parses only the named features of serialized examples (scalar or batch)."""
    spec = schema.tf_feature_spec()
    wanted = {name: spec[name] for name in names}
    if serialized.shape.rank == 0:
        return tf.io.parse_single_example(serialized, wanted)
    return tf.io.parse_example(serialized, wanted)


def read_texts(data_dir: str, split: str, reader: Optional[ShardReader] = None) -> tf.data.Dataset:
    """The alt-texts of ``split`` (for the vocabulary builder; word counts ignore order)."""
    reader = reader or shard_reader(data_dir, split)
    records = tf.data.Dataset.from_tensor_slices(list_shards(data_dir, split)).interleave(
        tf.autograph.experimental.do_not_convert(reader.dataset), cycle_length=4, num_parallel_calls=4)
    return records.batch(1024).map(lambda r: parse_fields(r, ["texts"])["texts"]).unbatch()


def claimed_lengths(data_dir: str, split: str, files: list[str]) -> Optional[list[int]]:
    """Records per file as ``dataset_info.json`` gives them, or None if it does not describe these files."""
    info_path = os.path.join(corpus_dir.read_dir(data_dir), "dataset_info.json")
    if not tf.io.gfile.exists(info_path):
        return None
    with tf.io.gfile.GFile(info_path, "rb") as f:
        info = parse_json(f.read(), info_path)
    for entry in info.get("splits", []) if isinstance(info, dict) else []:
        lengths = [int(n) for n in entry.get("shardLengths", [])]
        if entry.get("name") == split and len(lengths) == len(files):
            return lengths
    return None


def shard_lengths(data_dir: str, split: str, files: list[str], reader: Optional[ShardReader] = None) -> list[int]:
    """Records per file: from dataset_info.json when it describes these files, else counted."""
    lengths = claimed_lengths(data_dir, split, files)
    reader = reader or ShardReader()
    return lengths if lengths is not None else [reader.count(path) for path in files]


def shard_reader(data_dir: str, split: str, skip_corrupt: bool = False, remedy: str = "") -> ShardReader:
    """A ``ShardReader`` for ``split`` that knows its shard lengths (to count a lost tail)."""
    files = list_shards(data_dir, split)
    return ShardReader(skip_corrupt, dict(zip(files, claimed_lengths(data_dir, split, files) or [])), remedy)


def _open_shard(path, epoch, reader: ShardReader):
    """The raw records of one shard read in ``epoch`` (a seam: tests count what a restore reads)."""
    del epoch
    return reader.dataset(path)


def _epoch_seed(order_seed, epoch):
    return tf.random.experimental.stateless_fold_in(order_seed, epoch)


def _shard_order(order_seed, epoch, num_files: int):
    """The host's shards in epoch ``epoch``: a permutation drawn from (seed, epoch).

    Called in the graph (``epoch`` a tensor) and eagerly by ``resume_position``
    (``epoch=None``: returns a function of the epoch), the same ops both ways.
    """
    if epoch is None:
        return lambda e: _shard_order(order_seed, tf.constant(e, tf.int64), num_files).numpy()
    return tf.argsort(tf.random.stateless_uniform([num_files], seed=_epoch_seed(order_seed, epoch)))


def resume_position(records_consumed: int, host_lengths: Sequence[int], shard_order) -> tuple[int, int, int]:
    """Where the host's record stream stands after ``records_consumed`` records.

    Returns ``(epoch, position in that epoch's shard order, records to skip in
    that shard)``: the restore opens that one shard and skips fewer records than
    it holds, whatever the position. ``shard_order(epoch)`` is the epoch's
    permutation of the host's shards.
    """
    total = sum(host_lengths)
    if total == 0:
        raise ValueError("this host has no records")
    epoch, offset = divmod(records_consumed, total)
    for position, shard in enumerate(shard_order(epoch)):
        if offset < host_lengths[shard]:
            return epoch, position, offset
        offset -= host_lengths[shard]
    raise AssertionError("unreachable: offset < total")


def image_preprocess(image_size: int, resize_size: Optional[int], train: bool,
                     flip_lr: bool = True, colour_augment: str = "") -> str:
    """ALIGN's image ops: resize, random crop + flip (train) or central crop (eval).

    ``flip_lr=False`` drops the horizontal flip: a flip contradicts captions
    that say "left of" / "right of" (the sample corpus has them).
    ``colour_augment``: ``trainer.preprocess`` ops (e.g. ``"random_hue(1.0)"``)
    applied after the crop in training only; ALIGN: none.

    ``decode(resize_size)`` lets a large JPEG decode at a reduced DCT scale
    that still covers the resize target (see ``preprocess.decode``).
    """
    resize_size = resize_size or round(image_size * RESIZE_RATIO)
    if train:
        crop = "|".join(filter(None, (f"random_crop({image_size})", "flip_lr" if flip_lr else "",
                                      colour_augment)))
    else:
        crop = f"central_crop({image_size})"
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
    colour_augment: str = "",
    shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
    preprocess_spec: Optional[str] = None,
    extra_features: Sequence[str] = (),
    reader: Optional[ShardReader] = None,
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
    ``reader``: how shards are read (default: a damaged shard is an error).
    """
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if global_batch_size % process_count:
        raise ValueError(f"global batch {global_batch_size} not divisible by {process_count} hosts")
    host_batch = global_batch_size // process_count
    spec = preprocess_spec or image_preprocess(image_size, resize_size, train, flip_lr, colour_augment)
    preprocess_fn = preprocess.get_preprocess_fn(spec)
    outputs = tuple(dict.fromkeys(("image", "texts", "key", *extra_features)))

    files = list_shards(data_dir, split)
    reader = reader or shard_reader(data_dir, split)
    by_file = len(files) >= process_count
    host_ids = list(range(process_index, len(files), process_count)) if by_file else list(range(len(files)))
    host_files = [files[i] for i in host_ids]
    augment_seed = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, 0], tf.int64), process_index
    )
    order_seed = tf.constant([seed, 1], tf.int64)

    # Plain graph code, no Python control flow on tensors: skip autograph's
    # conversion pass (it is most of the tracing time).
    @tf.autograph.experimental.do_not_convert
    def shard_records(epoch, file_id, path, skip):
        """(epoch, file id, index in its shuffled order, serialized) of one shard, ``skip`` dropped."""
        records = _open_shard(path, epoch, reader)
        if train and not by_file:  # this host's share of each shard (eval: of the whole split, below)
            records = records.shard(process_count, process_index)
        if train:
            file_seed = tf.random.experimental.stateless_fold_in(_epoch_seed(order_seed, epoch), file_id)
            shuffle_seed = tf.random.stateless_uniform([], seed=file_seed, minval=None, maxval=None, dtype=tf.int64)
            records = records.shuffle(shuffle_buffer_size, seed=shuffle_seed, reshuffle_each_iteration=False)
        return records.enumerate().skip(skip).map(lambda index, record: (epoch, file_id, index, record))

    @tf.autograph.experimental.do_not_convert
    def epoch_records(epoch, first_position=0, first_skip=0):
        """This host's records of ``epoch`` from shard ``first_position`` of its order on."""
        order = _shard_order(order_seed, epoch, len(host_files)) if train else tf.range(len(host_files))
        skips = tf.one_hot(first_position, len(host_files), on_value=tf.cast(first_skip, tf.int64),
                           off_value=tf.constant(0, tf.int64), dtype=tf.int64)
        shards = tf.data.Dataset.from_tensor_slices(
            (tf.gather(tf.constant(host_ids, tf.int64), order), tf.gather(tf.constant(host_files), order), skips)
        ).skip(first_position)
        return shards.flat_map(lambda file_id, path, skip: shard_records(epoch, file_id, path, skip))

    if train:
        first_epoch, first_position, first_skip = 0, 0, 0
        if start_batch:
            lengths = shard_lengths(data_dir, split, files, reader)
            host_lengths = [lengths[i] if by_file else len(range(process_index, lengths[i], process_count))
                            for i in host_ids]
            first_epoch, first_position, first_skip = resume_position(
                start_batch * host_batch, host_lengths, _shard_order(order_seed, None, len(host_files)))
        records = epoch_records(tf.constant(first_epoch, tf.int64), first_position, first_skip).concatenate(
            tf.data.Dataset.range(first_epoch + 1, _MAX_EPOCHS).flat_map(epoch_records))
    else:
        records = epoch_records(tf.constant(0, tf.int64))
        if not by_file:
            records = records.shard(process_count, process_index)

    @tf.autograph.experimental.do_not_convert
    def parse_and_preprocess(epoch, file_id, index, serialized):
        data = parse_fields(serialized, schema.FEATURES)
        rng = tf.random.experimental.stateless_fold_in(augment_seed, epoch)
        rng = tf.random.experimental.stateless_fold_in(rng, file_id)
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
