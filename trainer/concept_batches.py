"""TOnICS object-node minibatches: a whole batch of one class, read by seeking, without a scan.

A build with ``--concepts`` (``pipeline.write.concept_tags``) writes beside every shard
``concepts/<shard>.json``: the byte offset of each record of each class in
that shard. ``ConceptIndex`` loads these for a split (8 bytes per (record,
class) pair in memory, no shard is read), and ``ClassBatches`` draws the
global batch of a class at a step:

- the draw is a function of ``(seed, step)`` only, so every host draws the
  same global batch and keeps its own slice (host ``i`` of ``P`` takes rows
  ``i*B/P .. (i+1)*B/P``), as the root's batches are laid out;
- without replacement when the class has at least a global batch of pairs,
  with replacement otherwise (said once per class in the log);
- each record is read by seeking to its offset in its shard (local or gs://),
  then parsed, augmented (seeded by ``(seed, step, row)``) and tokenised by
  the same ops as the ordinary input pipeline (``trainer.input_pipeline``).
"""

from __future__ import annotations

import os
import struct
from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

from common import corpus_dir, schema
from common import state_files as sf
from trainer import input_pipeline, preprocess

_HEADER = 12  # uint64 length + uint32 masked CRC of the length


class ConceptIndex:
    """Record positions per class of ``split``: ``positions[class]`` is an int64 ``[n, 2]`` of (file id, offset)."""

    def __init__(self, data_dir: str, split: str = "train"):
        data_dir = corpus_dir.read_dir(data_dir)
        self.files = input_pipeline.list_shards(data_dir, split)
        index_dir = os.path.join(data_dir.rstrip("/"), schema.CONCEPTS_DIR)
        if not tf.io.gfile.isdir(index_dir):
            raise FileNotFoundError(
                f"{data_dir} has no {schema.CONCEPTS_DIR}/ class index: build it with "
                f"'python -m pipeline.build ... --concepts default' (or an ontology file) to train with TOnICS")
        self.classes = _class_order(data_dir)
        found: Dict[str, List[np.ndarray]] = {}
        for file_id, path in enumerate(self.files):
            index_path = os.path.join(index_dir, os.path.basename(path) + ".json")
            if not tf.io.gfile.exists(index_path):
                continue  # an empty shard has no index
            with tf.io.gfile.GFile(index_path, "rb") as handle:
                entry = sf.parse(handle.read(), index_path, _index_schema, REMEDY)
            for name, offsets in entry["offsets"].items():
                rows = np.empty((len(offsets), 2), np.int64)
                rows[:, 0], rows[:, 1] = file_id, offsets
                found.setdefault(name, []).append(rows)
        if not self.classes:
            self.classes = sorted(found)
        self.positions = {name: (np.concatenate(found[name]) if name in found else np.zeros((0, 2), np.int64))
                          for name in self.classes}

    def sizes(self) -> List[int]:
        """|X(o)| per class, in ``classes`` order."""
        return [len(self.positions[name]) for name in self.classes]


def _class_order(data_dir: str) -> List[str]:
    """The ontology's class order, from ``stats/concepts.json`` (empty list if absent)."""
    path = os.path.join(corpus_dir.read_dir(data_dir), "stats", "concepts.json")
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path, "rb") as handle:
        return list(sf.parse(handle.read(), path, _classes_schema, REMEDY)["classes"])


#: What to do about a damaged class index or concepts.json (a damaged file is one line: ``common.state_files``).
REMEDY = "rebuild the corpus with --concepts"


def _index_schema(doc) -> dict:
    """A shard's class index (``pipeline.write.concept_tags``): class -> the shard's offsets of its records."""
    def offsets(value, where):
        values = sf.array(value, where)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in values):
            raise sf.Problem(f"{where}: not a list of byte offsets")

    sf.mapping(sf.field(sf.obj(doc), "offsets"), "offsets", offsets)
    return doc


def _classes_schema(doc) -> dict:
    for i, name in enumerate(sf.array(sf.field(sf.obj(doc), "classes"), "classes")):
        sf.text(name, f"classes[{i}]")
    return doc


def read_record(handle, offset: int) -> bytes:
    """The serialised Example of the TFRecord frame at ``offset`` of an open shard."""
    handle.seek(offset)
    header = handle.read(_HEADER)
    if len(header) != _HEADER:
        raise ValueError(f"no TFRecord frame at offset {offset} (file ends)")
    (length,) = struct.unpack("<Q", header[:8])
    payload = handle.read(length)
    if len(payload) != length:
        raise ValueError(f"TFRecord frame at offset {offset} is truncated")
    return payload


class ClassBatches:
    """This host's share of a class minibatch at a step (see the module doc)."""

    def __init__(self, index: ConceptIndex, *, global_batch_size: int, process_index: int, process_count: int,
                 image_size: int, resize_size: Optional[int], flip_lr: bool, seed: int, tokenizer,
                 say: Callable[[str], None] = print, colour_augment: str = ""):
        if global_batch_size % process_count:
            raise ValueError(f"global batch {global_batch_size} not divisible by {process_count} hosts")
        self.index = index
        self.global_batch = global_batch_size
        self.host_batch = global_batch_size // process_count
        self.process_index = process_index
        self.seed = seed
        self.tokenizer = tokenizer
        self.say = say
        self._handles: Dict[int, object] = {}
        self._told = set()
        spec = input_pipeline.image_preprocess(
            image_size, resize_size, train=True, flip_lr=flip_lr, colour_augment=colour_augment)
        self._preprocess = preprocess.get_preprocess_fn(spec)

    def draw(self, name: str, step: int) -> np.ndarray:
        """This host's (file id, offset) rows of class ``name`` at ``step``."""
        positions = self.index.positions[name]
        if len(positions) == 0:
            raise ValueError(f"class {name!r} has no pair in the index: it cannot be drawn")
        replace = len(positions) < self.global_batch
        if replace and name not in self._told:
            self._told.add(name)
            self.say(f"TOnICS: class {name!r} has {len(positions)} pairs < global batch {self.global_batch}: "
                     f"its minibatches are drawn with replacement")
        rng = np.random.default_rng([int(self.seed), int(step), 0xC1A55])
        picks = rng.choice(len(positions), size=self.global_batch, replace=replace)
        start = self.process_index * self.host_batch
        return positions[picks[start : start + self.host_batch]]

    def serialized(self, name: str, step: int) -> List[bytes]:
        out = []
        for file_id, offset in self.draw(name, step):
            handle = self._handles.get(int(file_id))
            if handle is None:
                handle = self._handles[int(file_id)] = tf.io.gfile.GFile(self.index.files[int(file_id)], "rb")
            out.append(read_record(handle, int(offset)))
        return out

    def batch(self, name: str, step: int) -> dict:
        """``{"image": float32 [B_host, S, S, 3], "text": int32 [B_host, L], "concepts": [B_host] bytes}``."""
        records = self.serialized(name, step)
        parsed = tf.io.parse_example(
            tf.constant(records),
            {**schema.tf_feature_spec(), schema.CONCEPTS_FEATURE: tf.io.FixedLenFeature([], tf.string)})
        base = tf.random.experimental.stateless_fold_in(tf.constant([self.seed, 2], tf.int64), step)
        images = []
        for row in range(len(records)):
            example = {key: value[row] for key, value in parsed.items()}
            example[preprocess.RNG_KEY] = tf.random.experimental.stateless_fold_in(
                base, self.process_index * self.host_batch + row)
            images.append(self._preprocess(example)["image"])
        return {"image": tf.stack(images).numpy(), "text": self.tokenizer.tokenize(parsed["texts"]).numpy(),
                "concepts": parsed[schema.CONCEPTS_FEATURE].numpy()}

    def close(self):
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()
