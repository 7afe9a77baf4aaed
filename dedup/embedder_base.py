"""What every near-duplicate embedder shares, whatever model it runs.

The interface the bucket join and the Beam transform use (``Embedder``), the
registry the embedders join with ``@register(name)``, their constructor
arguments as the command line gives them (``--embedder_arg KEY=VALUE``), the
base class (batching, decode failures, pickling, the calibrated threshold),
the calibration file a threshold is read from, and the pixel scaling of the
model-based embedders. The embedders themselves are ``dedup.embedders``.

Bad input: ``embed`` never raises for one bad image. An image that does not
decode (or, for "dct", has no structure at all: a flat colour) gets an
all-zero row. A zero row has cosine 0 with everything, so it can never be
above a (positive) threshold: it is never called a near-duplicate. Callers
that need to know use ``valid_rows``. The pipeline only sends images that
fully decoded, so in practice zero rows are the flat images.

Embedders are picklable (Beam ships them to workers); heavy runtime state
(an ONNX session, a restored checkpoint) is created on first use and is not
pickled.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np
from PIL import Image


log = logging.getLogger(__name__)


@runtime_checkable
class Embedder(Protocol):
    name: str  # registry name, e.g. "dct"
    dim: int  # fixed output dimension
    threshold: float  # calibrated cosine threshold for this embedder

    def embed(self, images: Sequence[bytes]) -> np.ndarray:
        """Encoded images -> float32 [N, dim], rows L2-normalised (zero row: no descriptor)."""
        ...


class UncalibratedEmbedderError(RuntimeError):
    """Raised when an embedder's threshold is read before it was calibrated."""


def valid_rows(vectors: np.ndarray) -> np.ndarray:
    """bool [N]: rows that hold a descriptor (zero rows are undecodable/featureless)."""
    return np.einsum("nd,nd->n", vectors, vectors) > 0.25



# ---------------------------------------------------------------------------
# Registry and command-line arguments
# ---------------------------------------------------------------------------

_REGISTRY: Dict[str, Callable[..., "ImageEmbedder"]] = {}


def register(name: str):
    def wrap(cls):
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return wrap


def names() -> Tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def get(name: str = "dct", **kwargs) -> "ImageEmbedder":
    """Build a registered embedder: ``get("dct")``, ``get("onnx", model_path=...)``,
    ``get("checkpoint", workdir=...)``. Keyword arguments go to its constructor.

    The built-in embedders register when ``dedup.embedders`` is imported,
    which is where callers reach this function."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown embedder {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name](**kwargs)


def parse_args(items: Sequence[str]) -> Dict[str, object]:
    """``["workdir=W", "step=100"]`` -> constructor arguments (JSON values, else text).

    The form of ``--embedder_arg KEY=VALUE`` (``pipeline.build``,
    ``dedup.calibrate``); raises ``ValueError`` on an item without ``=``.
    """
    from common.cli import key_value_args

    return key_value_args(items, "--embedder_arg")


# ---------------------------------------------------------------------------
# Shared machinery
# ---------------------------------------------------------------------------


class ImageEmbedder:
    """Base class: batching, decode-failure handling, bytes/PIL/array entry points.

    Subclasses implement ``decode`` (bytes -> PIL image, may raise) and
    ``embed_pil`` (list of decoded PIL images -> float32 [N, dim]).
    """

    name = "base"
    batch_size = 256
    _threshold: Optional[float] = None
    _threshold_hint = ""

    # -- threshold ---------------------------------------------------------
    @property
    def threshold(self) -> float:
        if self._threshold is None:
            raise UncalibratedEmbedderError(
                f"embedder {self.name!r} has no calibrated threshold; pass threshold=... "
                f"or run `python -m dedup.calibrate --embedder {self.name} ...`{self._threshold_hint}"
            )
        return self._threshold

    @threshold.setter
    def threshold(self, value: Optional[float]) -> None:
        if value is not None and not 0.0 < float(value) < 1.0:
            raise ValueError(f"cosine threshold must be in (0, 1), got {value}")
        self._threshold = None if value is None else float(value)

    @property
    def is_calibrated(self) -> bool:
        return self._threshold is not None

    @property
    def working_size(self) -> int:
        """Decode size for callers that edit an image before embedding it
        (index variants, calibration): enough detail for a crop to be exact."""
        return int(getattr(self, "image_size", 256))

    # -- entry points --------------------------------------------------------
    def decode(self, data: bytes) -> Image.Image:
        raise NotImplementedError

    def embed_pil(self, images: Sequence[Image.Image]) -> np.ndarray:
        raise NotImplementedError

    def embed(self, images: Sequence[bytes]) -> np.ndarray:
        out = np.zeros((len(images), self.dim), np.float32)
        for start in range(0, len(images), self.batch_size):
            chunk = images[start : start + self.batch_size]
            decoded, rows = [], []
            for offset, data in enumerate(chunk):
                try:
                    decoded.append(self.decode(data))
                    rows.append(start + offset)
                except Exception as error:  # any decoder failure: zero row, see module doc
                    log.debug("image %d does not decode: %s", start + offset, error)
            if decoded:
                out[rows] = self.embed_pil(decoded)
        return out

    def embed_arrays(self, images: np.ndarray) -> np.ndarray:
        """uint8 [N, H, W, 3] (or [N, H, W]) -> float32 [N, dim]."""
        images = np.asarray(images)
        if images.dtype != np.uint8:
            raise ValueError(f"expected uint8 pixels, got {images.dtype}")
        out = np.zeros((len(images), self.dim), np.float32)
        for start in range(0, len(images), self.batch_size):
            chunk = images[start : start + self.batch_size]
            out[start : start + len(chunk)] = self.embed_pil([Image.fromarray(a) for a in chunk])
        return out

    # -- pickling: configuration travels, runtime state is rebuilt -----------
    _runtime_attrs: Tuple[str, ...] = ()

    def __getstate__(self):
        state = dict(self.__dict__)
        for attr in self._runtime_attrs:
            state[attr] = None
        return state

    def __repr__(self):
        threshold = self._threshold if self._threshold is not None else "uncalibrated"
        return f"{type(self).__name__}(name={self.name!r}, dim={self.dim}, threshold={threshold})"


def read_calibrated_threshold(path: str, embedder_name: str) -> Optional[float]:
    """The recommended threshold from a ``dedup.calibrate`` report, if the file exists."""
    from common import state_files as sf

    def schema(doc):
        sf.obj(sf.field(sf.obj(doc), "embedder"), "embedder")
        sf.number(sf.field(doc, "recommended_threshold"), "recommended_threshold")

    try:  # a damaged report is the embedder's one-line ValueError (the build's usage error)
        report = sf.read_json(path, schema, f"run dedup.calibrate again (--out {path})")
    except sf.DamagedFile as error:
        raise ValueError(str(error)) from None
    if report is None:
        return None
    if report["embedder"].get("name") != embedder_name:
        raise ValueError(f"{path} calibrates embedder {report.get('embedder')!r}, not {embedder_name!r}")
    return float(report["recommended_threshold"])


def resize_to_unit_range(images: Sequence[Image.Image], size: int, center_crop: bool = False) -> np.ndarray:
    """RGB PIL images -> float32 [B, size, size, 3] in [-1, 1]: squashed (whole
    image kept) or, with ``center_crop``, the central square of the image."""
    batch = np.empty((len(images), size, size, 3), np.float32)
    for i, image in enumerate(images):
        image = image if image.mode == "RGB" else image.convert("RGB")
        box = None
        if center_crop:
            side = min(image.size)
            left, top = (image.width - side) // 2, (image.height - side) // 2
            box = (left, top, left + side, top + side)
        image = image.resize((size, size), Image.Resampling.BILINEAR, box=box, reducing_gap=3.0)
        batch[i] = np.asarray(image, np.float32)
    return batch / 127.5 - 1.0
