"""Evaluation ("index") image sets: read them, add edited copies, embed them.

ALIGN removes training images that are near-duplicates of images in the test
sets of downstream tasks. Those test sets are the *index*. Each set is a
``(name, path)`` pair (the build's ``--eval_images NAME=PATH``, parsed and
checked by ``pipeline.build.config``) where path is

- a folder of images (searched recursively; key = path relative to the folder),
- a TFDS-style directory (or glob) of TFRecord shards written with
  ``common.schema.FEATURES`` (image feature ``image``, key ``key``), or
- Parquet file(s) with a ``key`` column and image bytes in ``jpg``, ``image``
  or ``img`` (plain bytes or a ``{"bytes": ...}`` struct, as Hugging Face
  datasets store images).

The embedder is not invariant to mirroring and cropping, so every index image
is also added flipped and centre-cropped (``DEFAULT_VARIANTS``). Variants share
the original's key and record the variant name: a query matching any variant
is a near-duplicate of that key. Remote paths (``gs://...``) go through
Beam's FileSystems; local ones through the OS.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image, ImageOps

from common.files import exists, match, read_bytes
from common.images import decode_rgb
from dedup import edits
from dedup.embedders import valid_rows

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
IMAGE_COLUMNS = ("jpg", "image", "img", "jpeg", "png")

#: name -> edit of a decoded RGB image. What is covered: a training copy that
#: is a mirror image, or a centre crop such as ImageNet's 87.5% or 80%.
VARIANTS: Dict[str, Callable[[Image.Image], Image.Image]] = {
    "original": lambda im: im,
    "flip": ImageOps.mirror,
    "center_crop_90": lambda im: edits.crop_fraction(im, 0.9),
    "center_crop_80": lambda im: edits.crop_fraction(im, 0.8),
}
DEFAULT_VARIANTS = ("original", "flip", "center_crop_90", "center_crop_80")


@dataclasses.dataclass(frozen=True)
class IndexImage:
    """One evaluation image before embedding."""

    set_name: str
    key: str
    data: bytes  # encoded image
    path: str = ""  # where it came from, when it is a file of its own


@dataclasses.dataclass
class IndexSet:
    """Embedded index: row i is variant ``variants[i]`` of image ``keys[i]`` of set ``set_names[i]``."""

    vectors: np.ndarray  # float32 [M, D], L2-normalised, no zero rows
    set_names: np.ndarray  # str [M]
    keys: np.ndarray  # str [M]
    variants: np.ndarray  # str [M]
    image_ids: np.ndarray  # int [M]: which original image the row was made from
    embedder_name: str = ""
    previews: List[Union[str, bytes]] = dataclasses.field(default_factory=list)  # per image: path or JPEG bytes
    skipped: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)  # (set, key, reason)

    def __len__(self) -> int:
        return len(self.vectors)

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    @property
    def num_images(self) -> int:
        return len(self.previews)

    def thumbnail(self, i: int) -> Union[str, bytes]:
        """For the audit report: the file path of row i's image, or small JPEG bytes."""
        return self.previews[int(self.image_ids[i])]

    def row(self, i: int) -> dict:
        return {
            "set": str(self.set_names[i]),
            "key": str(self.keys[i]),
            "variant": str(self.variants[i]),
        }


# ---------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------


def _kind_and_files(path: str) -> Tuple[str, List[str]]:
    if any(ch in path for ch in "*?["):
        files = match(path)
    else:
        files = match(path.rstrip("/") + "/**")
        if not files and exists(path):
            files = [path]  # a single file
    tfrecords = [f for f in files if ".tfrecord" in os.path.basename(f)]
    parquets = [f for f in files if f.endswith(".parquet")]
    if tfrecords:
        return "tfds", tfrecords
    if parquets:
        return "parquet", parquets
    images = [f for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
    if not images:
        raise ValueError(f"no images, TFRecord shards or Parquet files under {path!r}")
    return "folder", images


def _iter_folder(set_name: str, root: str, files: Sequence[str]) -> Iterator[IndexImage]:
    prefix = root.rstrip("/") + "/"
    for path in files:
        key = path[len(prefix) :] if path.startswith(prefix) else os.path.basename(path)
        yield IndexImage(set_name, key, read_bytes(path), path)


def _iter_tfrecords(set_name: str, files: Sequence[str]) -> Iterator[IndexImage]:
    import tensorflow as tf

    from common.schema import tf_feature_spec

    full = tf_feature_spec()
    # Only the two features needed: TFDS test sets written by others may lack ours.
    spec = {
        "image": full["image"],
        "key": tf.io.FixedLenFeature([], tf.string, default_value=""),
    }
    for path in files:
        dataset = tf.data.TFRecordDataset(path)
        for i, serialized in enumerate(dataset.as_numpy_iterator()):
            example = tf.io.parse_single_example(serialized, spec)
            key = example["key"].numpy().decode("utf-8") or f"{os.path.basename(path)}:{i}"
            yield IndexImage(set_name, key, example["image"].numpy())


def _image_bytes(value) -> Optional[bytes]:
    if isinstance(value, dict):
        value = value.get("bytes")
    return bytes(value) if value is not None else None


def _iter_parquet(set_name: str, files: Sequence[str]) -> Iterator[IndexImage]:
    import pyarrow.parquet as pq

    for path in files:
        parquet = pq.ParquetFile(io.BytesIO(read_bytes(path)))
        columns = parquet.schema_arrow.names
        image_column = next((c for c in IMAGE_COLUMNS if c in columns), None)
        if image_column is None or "key" not in columns:
            raise ValueError(f"{path}: need columns 'key' and one of {IMAGE_COLUMNS}, found {columns}")
        for batch in parquet.iter_batches(columns=["key", image_column], batch_size=256):
            for key, value in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                data = _image_bytes(value)
                yield IndexImage(set_name, str(key), data if data is not None else b"")


def read_index_images(set_name: str, path: str) -> Iterator[IndexImage]:
    """All images of the set ``set_name`` at ``path``, in a deterministic order."""
    kind, files = _kind_and_files(path)
    log.info("index set %s: %s, %d file(s) under %s", set_name, kind, len(files), path)
    if kind == "folder":
        return _iter_folder(set_name, path, files)
    if kind == "tfds":
        return _iter_tfrecords(set_name, files)
    return _iter_parquet(set_name, files)


# ---------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------


def _preview(image: Image.Image, size: int) -> bytes:
    small = image.copy()
    small.thumbnail((size, size))
    return edits.encode_jpeg(small, 85)


def build_index(
    images: Iterable[IndexImage],
    embedder,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    chunk_size: int = 128,
    preview_size: int = 128,
) -> IndexSet:
    """Decode, add variants, embed. Undecodable and featureless images are
    listed in ``skipped`` with a reason (never silently dropped)."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    # Decode at a working size that keeps detail for the crops; for "dct" this
    # is a few times its thumbnail, for a model tower its input size.
    working_size = int(getattr(embedder, "working_size", 256))
    vectors, set_names, keys, names, image_ids = [], [], [], [], []
    previews: List[Union[str, bytes]] = []
    skipped: List[Tuple[str, str, str]] = []

    pending: List[Tuple[IndexImage, Image.Image]] = []

    def flush():
        copies = [VARIANTS[v](image) for _, image in pending for v in variants]
        out = embedder.embed_pil(copies).reshape(len(pending), len(variants), -1)
        for (item, image), rows in zip(pending, out):
            ok = valid_rows(rows)
            if not ok.any():
                skipped.append((item.set_name, item.key, "featureless"))
                continue
            image_id = len(previews)
            previews.append(item.path or (_preview(image, preview_size) if preview_size else b""))
            for variant, vector, good in zip(variants, rows, ok):
                if good:
                    vectors.append(vector)
                    set_names.append(item.set_name)
                    keys.append(item.key)
                    names.append(variant)
                    image_ids.append(image_id)
        pending.clear()

    for item in images:
        try:
            image = decode_rgb(item.data, working_size)
            image.load()
        except Exception as error:
            log.warning("index image %s/%s does not decode: %s", item.set_name, item.key, error)
            skipped.append((item.set_name, item.key, f"undecodable: {type(error).__name__}"))
            continue
        pending.append((item, image))
        if len(pending) >= chunk_size:
            flush()
    if pending:
        flush()

    dim = embedder.dim
    return IndexSet(
        vectors=np.asarray(vectors, np.float32).reshape(-1, dim),
        set_names=np.asarray(set_names, dtype=str),
        keys=np.asarray(keys, dtype=str),
        variants=np.asarray(names, dtype=str),
        image_ids=np.asarray(image_ids, np.int64),
        embedder_name=getattr(embedder, "name", ""),
        previews=previews,
        skipped=skipped,
    )


def load_index_sets(sets: Sequence[Tuple[str, str]], embedder, variants: Sequence[str] = DEFAULT_VARIANTS,
                    **kwargs) -> IndexSet:
    """Read and embed several named evaluation sets (``[("coco", "/data/coco_test"), ...]``, as the build's
    config resolved them)."""
    names = [name for name, _ in sets]
    if len(set(names)) != len(names):
        raise ValueError(f"index set names must be distinct, got {names}")

    def all_images():
        for name, path in sets:
            yield from read_index_images(name, path)

    index = build_index(all_images(), embedder, variants, **kwargs)
    log.info("index: %d rows from %d images, %d skipped", len(index), index.num_images, len(index.skipped))
    return index
