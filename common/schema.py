"""The two contracts every part of the project shares.

1. ``Candidate``: one image/alt-text pair inside the Beam pipeline.
2. ``FEATURES``: the feature spec of the written shards. The pipeline's writer
   encodes exactly these features and the trainer parses exactly these, so
   neither side can drift from the other.

This module must stay importable without TensorFlow: Beam workers import it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Optional

# ---------------------------------------------------------------------------
# Candidate record
# ---------------------------------------------------------------------------


def make_key(url: str, alt_text: str) -> str:
    """Stable key of a pair: a hash of url and raw alt-text, never of position.

    Re-reading the same input in another order, with other shard boundaries or
    another runner gives every pair the same key, which is what makes sharding,
    validation split and rejected-sample choice deterministic.
    """
    digest = hashlib.sha256(
        url.encode("utf-8", "surrogatepass") + b"\x00" + alt_text.encode("utf-8", "surrogatepass")
    )
    return digest.hexdigest()[:24]


def key_fraction(key: str, salt: str = "") -> float:
    """A number in [0, 1) derived from the key, for hash-based decisions."""
    digest = hashlib.sha256((salt + key).encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_of(key: str, validation_fraction: float) -> str:
    """A key's split: ``validation`` for a ``validation_fraction`` of keys by hash, else ``train``."""
    return "validation" if key_fraction(key, salt="split") < validation_fraction else "train"


def fold_of(key: str, folds: int) -> int:
    """A key's cross-fitting fold among ``folds`` (by a hash apart from the split's and the shards'): the
    model that scores a pair was trained on the other folds (``trainer.crossfit``)."""
    return min(folds - 1, int(key_fraction(key, salt="fold") * folds))


def shard_of(key: str, num_shards: int) -> int:
    """A key's file among ``num_shards`` hash-sharded files (the ledger, the pairs report)."""
    return min(num_shards - 1, int(key_fraction(key, salt="shard") * num_shards))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One image/alt-text pair as it moves through the pipeline.

    Fields after ``source`` are filled in by filter stages; a stage returns a
    new record with ``dataclasses.replace`` and never mutates.
    """

    key: str
    url: str
    alt_text: str                     # raw, as read
    image: Optional[bytes] = None     # encoded bytes; None until downloaded
    source: tuple = ()                # (("column", value), ...) kept for the audit
    # What the input says about the image before its downloader touched it
    # (img2dataset's original_width/original_height); 0 when it says nothing.
    # The size and aspect filters judge these, not the stored (resized) image.
    source_width: int = 0
    source_height: int = 0
    carried: tuple = ()               # (("name", "text"), ...) written as source_<name> features
    # Filled by filters.text:
    text: str = ""                    # normalised alt-text, what gets written
    # Filled by filters.image:
    format: str = ""                  # PIL format name: JPEG, PNG, GIF, WEBP, ...
    width: int = 0                    # of the source image, after EXIF orientation
    height: int = 0
    stored_width: int = 0             # of ``image`` once it holds the bytes to store
    stored_height: int = 0
    sha256: str = ""
    phash: str = ""                   # 16 hex digits: the reduced picture's pHash (see FEATURES)
    # Filled by the optional TOnICS tagging stage (filters.concepts): the
    # ontology classes the alt-text names; None when the stage is off (the
    # shards then have no ``concepts`` feature).
    concepts: Optional[tuple] = None
    # Where the image bytes can be read again when they do not come from the
    # input file itself: ``(reader, path, ordinal)`` of a download's staging
    # file (``pipeline.download.staging``); () otherwise.
    origin: tuple = ()

    def replace(self, **changes) -> "Candidate":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------
# Shard feature spec
# ---------------------------------------------------------------------------

#: name -> (kind, dtype, description). ``kind`` is "image" (encoded JPEG
#: bytes), "text" (UTF-8 string) or "scalar". These names and their order
#: are the on-disk contract; the TFDS features.json is derived from them.
FEATURES = {
    "image": ("image", "string", "the image, re-encoded as JPEG when needed"),
    "texts": ("text", "string", "the normalised alt-text"),
    "key": ("text", "string", "stable pair key: hash of url and raw alt-text"),
    "url": ("text", "string", "source URL of the image"),
    "width": ("scalar", "int64", "width of the stored image"),
    "height": ("scalar", "int64", "height of the stored image"),
    "original_width": ("scalar", "int64", "width of the source image"),
    "original_height": ("scalar", "int64", "height of the source image"),
    "sha256": ("text", "string", "sha256 of the source image bytes (hex)"),
    "phash": ("text", "string", "64-bit perceptual hash (hex, imagehash's pHash) of the source picture, upright, "
                                "reduced by DCT scaling to no less than 64 px a side"),
}

SPLITS = ("train", "validation")

#: Input columns written to the shards by default, as ``source_<column>``
#: (the input's own key and sha256 let a user join the corpus back to their
#: metadata); ``--carry_columns`` adds more.
DEFAULT_CARRIED = ("key", "sha256")
CARRIED_PREFIX = "source_"


def carried_features(columns) -> dict:
    """Extra text features for carried input columns: optional for the trainer.

    They are declared in ``features.json`` (so TFDS parses them) but are not
    part of ``FEATURES``: ``tf_feature_spec()`` and the trainer ignore them.
    Every shard record holds every declared one (empty text when the input
    row had no value), as a TFDS ``FeaturesDict`` requires.
    """
    return {
        CARRIED_PREFIX + column: ("text", "string", f"the input's column {column!r}, as text (empty if absent)")
        for column in columns
    }


#: The optional TOnICS feature (``--concepts``): class names separated by spaces.
CONCEPTS_FEATURE = "concepts"


def concepts_features() -> dict:
    """The ``concepts`` feature, declared in ``features.json`` only when the build tagged."""
    return {CONCEPTS_FEATURE: ("text", "string", "ontology classes the alt-text names, separated by spaces (TOnICS)")}


#: Per-shard record positions of each class, written beside the shards by a
#: build with ``--concepts``: ``concepts/<shard file name>.json`` holds
#: ``{"shard", "records", "offsets": {class: [byte offset of each record]}}``.
CONCEPTS_DIR = "concepts"


def shard_filename(name: str, split: str, index: int, num_shards: int) -> str:
    """TFDS naming: ``<name>-<split>.tfrecord-00000-of-00016``; both numbers get at least 5 digits and
    as many as ``num_shards`` has (``000000-of-100000``), as TFDS's ``ShardedFileTemplate``."""
    width = max(5, len(str(num_shards)))
    return f"{name}-{split}.tfrecord-{index:0{width}d}-of-{num_shards:0{width}d}"


def shard_glob(data_dir: str, split: str = "train") -> str:
    return f"{data_dir.rstrip('/')}/*-{split}.tfrecord-*-of-*"


def tf_feature_spec():
    """``tf.io.parse_single_example`` spec for the shards (imports TF lazily)."""
    import tensorflow as tf

    spec = {}
    for name, (_, dtype, _) in FEATURES.items():
        spec[name] = tf.io.FixedLenFeature([], tf.string if dtype == "string" else tf.int64)
    return spec


def tfds_features(extra: Optional[dict] = None):
    """The same spec as a ``tfds.features.FeaturesDict``, plus ``extra`` ones.

    The build does not use it (``pipeline.publish.tfds_metadata`` writes the same
    ``features.json`` without TFDS); tests compare the two.
    """
    import numpy as np
    import tensorflow_datasets as tfds

    built = {}
    for name, (kind, dtype, doc) in {**FEATURES, **(extra or {})}.items():
        if kind == "image":
            built[name] = tfds.features.Image(encoding_format="jpeg", doc=doc)
        elif kind == "text":
            built[name] = tfds.features.Text(doc=doc)
        else:
            built[name] = tfds.features.Scalar(dtype=np.int64, doc=doc)
    return tfds.features.FeaturesDict(built)
