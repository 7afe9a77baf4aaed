"""Image embedders for near-duplicate detection, behind one small interface.

ALIGN (Appendix A) embeds every query and index image, then calls a pair a
near-duplicate when the cosine similarity of the embeddings is above a
threshold that was *calibrated for that embedding model* (0.975 for theirs).
A threshold only means something for the embedder it was calibrated on, so
each embedder carries its own; ``python -m dedup.calibrate`` measures it.

Interface (what the bucket join and the Beam transform use)::

    embedder = dedup.embedders.get("dct")          # or "onnx", "checkpoint"
    embedder.name, embedder.dim, embedder.threshold
    vectors = embedder.embed([jpeg_bytes, ...])     # float32 [N, dim]
    ok = dedup.embedders.valid_rows(vectors)        # bool [N]

Rows are L2-normalised, so cosine similarity is a dot product; an image that
does not decode, or has no structure, is a zero row. This module holds the
three embedders (dct, checkpoint, onnx); what they share (the registry,
``--embedder_arg`` parsing, the base class, calibration files, pixel scaling)
is ``dedup.embedder_base``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from common import files
from common.images import decode_rgb, draft, exif_orientation, open_image, orient
from common.vectors import l2_normalize
from dedup.embedder_base import (  # noqa: F401  (the interface callers use, re-exported)
    Embedder,
    ImageEmbedder,
    UncalibratedEmbedderError,
    get,
    names,
    parse_args,
    read_calibrated_threshold,
    register,
    resize_to_unit_range,
    valid_rows,
)


# ---------------------------------------------------------------------------
# "dct": training-free low-frequency DCT descriptor
# ---------------------------------------------------------------------------


@register("dct")
class DctEmbedder(ImageEmbedder):
    """Low-frequency 2-D DCT of a small grayscale thumbnail (pHash without the sign step).

    Decode to ``size`` x ``size`` luma (JPEGs are downscaled inside the decoder
    with ``draft``, which is what makes this fast), take the orthonormal 2-D
    DCT, keep the ``block`` x ``block`` lowest frequencies except DC, weight
    frequency (u, v) by ``(1 + u^2 + v^2) ** (weight_exponent / 2)``, L2-normalise.

    Dropping DC removes the image mean (brightness), L2 removes contrast, and
    low frequencies survive resizing, JPEG, blur and mild colour changes. The
    descriptor is not invariant to flips, rotations, crops or padding: the
    index side adds flipped and centre-cropped copies of every evaluation image
    instead (see ``dedup.index_sets``), and the calibration report says what is
    still missed. The image is squashed to a square, so resizes that change the
    aspect ratio are not covered either.
    """

    # From `python -m dedup.calibrate` (defaults: this configuration, seeds
    # 0,1,2 pooled: 600 index crops of 17 shipped photographs, 15,600 edited
    # copies, 3.2M unrelated pairs): the lowest cosine with an unrelated-pair
    # FPR <= 1e-5 with the flipped/cropped index variants. There: photometric
    # recall 99.67%, distractor images dropped 0.27%. Full tables in
    # benchmarks/RESULTS.md. Re-run it whenever the descriptor changes.
    DEFAULT_THRESHOLD = 0.913

    def __init__(
        self,
        size: int = 32,
        block: int = 12,
        weight_exponent: float = 1.5,
        min_contrast: float = 1.0,
        threshold: Optional[float] = None,
        batch_size: int = 512,
    ):
        if not 2 <= block <= size:
            raise ValueError(f"need 2 <= block <= size, got block={block}, size={size}")
        self.size = int(size)
        self.block = int(block)
        self.weight_exponent = float(weight_exponent)
        # RMS contrast (grey levels, 0..255) of the low-pass thumbnail below
        # which an image counts as featureless: its "structure" would be JPEG
        # noise, and every flat image would match every other.
        self.min_contrast = float(min_contrast)
        self.batch_size = int(batch_size)
        self.dim = self.block * self.block - 1
        self.threshold = self.DEFAULT_THRESHOLD if threshold is None else threshold
        u, v = np.meshgrid(np.arange(self.block), np.arange(self.block), indexing="ij")
        weights = (1.0 + u**2 + v**2) ** (self.weight_exponent / 2.0)
        self._weights = weights.reshape(-1)[1:].astype(np.float32)

    @property
    def working_size(self) -> int:
        return 4 * self.size

    def config(self) -> dict:
        return {
            "name": self.name,
            "size": self.size,
            "block": self.block,
            "weight_exponent": self.weight_exponent,
            "min_contrast": self.min_contrast,
        }

    def decode(self, data: bytes) -> Image.Image:
        image = open_image(data)
        orientation = exif_orientation(image)
        # JPEGs decode straight to luma at up to 1/8 scale: most of the speed.
        box = draft(image, "L", 2 * self.size)
        # The thumbnail is square, so squashing first and orienting after is
        # the same as orienting the full image first, and much cheaper.
        return orient(self._thumbnail(image, box), orientation)

    def _thumbnail(self, image: Image.Image, box=None) -> Image.Image:
        """The one way every path (JPEG bytes, PNG bytes, PIL, arrays) makes the thumbnail.

        A box-average straight to ``size`` aliases fine detail differently
        depending on the input resolution and on whether libjpeg already
        averaged 8x8 blocks (cosine ~0.93-0.97 between the paths for the same
        picture). So: integer box reduction to between 2x and 4x ``size``
        (what ``draft`` does inside the decoder for JPEGs), then an
        antialiased triangle filter down to ``size`` (paths agree to >0.999).
        """
        if image.mode != "L":
            image = image.convert("L")
        if box is None:
            box = (0.0, 0.0, float(image.width), float(image.height))
        if image.size == (self.size, self.size) and tuple(box) == (0, 0, self.size, self.size):
            return image
        factor = int(min(box[2], box[3]) // (2 * self.size))
        if factor >= 2:
            image = image.reduce(factor)
            box = (0.0, 0.0, box[2] / factor, box[3] / factor)
        return image.resize((self.size, self.size), Image.Resampling.BILINEAR, box=box)

    def embed_pil(self, images: Sequence[Image.Image]) -> np.ndarray:
        from scipy.fft import dctn

        pixels = np.stack([np.asarray(self._thumbnail(im), np.float32) for im in images])
        coeffs = dctn(pixels, type=2, norm="ortho", axes=(1, 2))
        low = coeffs[:, : self.block, : self.block].reshape(len(images), -1)[:, 1:]
        # Orthonormal DCT: ||AC|| / size is the RMS contrast of the thumbnail.
        contrast = np.linalg.norm(low, axis=1) / self.size
        vectors = l2_normalize(low * self._weights)
        vectors[contrast < self.min_contrast] = 0.0
        return vectors


#: (fn(float32 [B, S, S, 3] in [-1, 1]) -> [B, D] L2-normalised, S)
ImageEncoder = Tuple[Callable[[np.ndarray], np.ndarray], int]


@register("checkpoint")
class CheckpointEmbedder(ImageEmbedder):
    """The image tower of an ALIGN trainer checkpoint, via
    ``trainer.checkpoint.load_image_encoder(workdir) -> (fn, image_size)``.

    By default the image is squashed to ``image_size`` so that the whole image
    is compared; ``center_crop=True`` uses the trainer's eval view (central
    square) instead. Calibrate each choice separately. Threshold: ``threshold=``,
    else ``<workdir>/near_duplicate_calibration.json`` written by
    ``python -m dedup.calibrate --embedder checkpoint --embedder_arg workdir=W
    --out W/near_duplicate_calibration.json``.
    """

    CALIBRATION_FILE = "near_duplicate_calibration.json"
    _runtime_attrs = ("_encoder",)

    def __init__(
        self,
        workdir: str = "",
        threshold: Optional[float] = None,
        batch_size: int = 64,
        step: Optional[int] = None,
        center_crop: bool = False,
        encoder: Optional[ImageEncoder] = None,
    ):
        if not workdir and encoder is None:
            raise ValueError("checkpoint embedder needs workdir=...")
        self.workdir = workdir
        self.step = step
        self.center_crop = bool(center_crop)
        self.batch_size = int(batch_size)
        self._encoder = encoder
        self._injected = encoder is not None  # tests inject a fake; it must survive pickling
        self._dim: Optional[int] = None
        calibration = f"{workdir.rstrip('/')}/{self.CALIBRATION_FILE}" if workdir else ""
        self._threshold_hint = f" --out {calibration}" if calibration else ""
        if threshold is None and calibration:
            threshold = read_calibrated_threshold(calibration, self.name)
        self.threshold = threshold

    def __getstate__(self):
        state = dict(self.__dict__)
        if not self._injected:
            state["_encoder"] = None
        return state

    def config(self) -> dict:
        return {"name": self.name, "workdir": self.workdir, "step": self.step, "center_crop": self.center_crop}

    def check(self) -> None:
        """Loads the tower once, at launch: a missing or damaged checkpoint is a one-line ``ValueError``
        naming the workdir and the step, before any job starts."""
        from trainer.checkpoint import DamagedCheckpoint  # lazy: pulls in JAX

        try:
            self._load()
        except DamagedCheckpoint as error:
            raise ValueError(f"checkpoint embedder {error}") from None
        except FileNotFoundError as error:
            raise ValueError(f"checkpoint embedder {self.workdir}: {error}") from None

    def _load(self) -> ImageEncoder:
        if self._encoder is None:
            from trainer.checkpoint import load_image_encoder  # lazy: pulls in JAX

            self._encoder = load_image_encoder(self.workdir, self.step)
        return self._encoder

    @property
    def image_size(self) -> int:
        return int(self._load()[1])

    @property
    def dim(self) -> int:
        if self._dim is None:
            fn, size = self._load()
            self._dim = int(np.asarray(fn(np.zeros((1, size, size, 3), np.float32))).shape[-1])
        return self._dim

    def decode(self, data: bytes) -> Image.Image:
        return decode_rgb(data, self.image_size)

    def embed_pil(self, images: Sequence[Image.Image]) -> np.ndarray:
        fn, size = self._load()
        # Re-normalise: cheap, and the threshold assumes unit rows.
        return l2_normalize(np.asarray(fn(resize_to_unit_range(images, size, self.center_crop))))


# ---------------------------------------------------------------------------
# "onnx": any exported image model (optional extra: onnxruntime)
# ---------------------------------------------------------------------------


@register("onnx")
class OnnxEmbedder(ImageEmbedder):
    """An ONNX image model run with onnxruntime (optional extra ``onnx``).

    Input layout (NCHW or NHWC) and image size are read from the model's
    first input when static. Pixels are scaled to [0, 1], then
    ``(x - mean) / std`` per channel (default mean=std=0.5, i.e. [-1, 1];
    ImageNet models want mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)).
    The first output, flattened per image, is L2-normalised. Threshold:
    ``threshold=``, else ``<model_path>.calibration.json`` if it exists.
    """

    _runtime_attrs = ("_session",)

    def __init__(
        self,
        model_path: str = "",
        threshold: Optional[float] = None,
        image_size: Optional[int] = None,
        layout: Optional[str] = None,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        batch_size: int = 32,
        num_threads: int = 0,
    ):
        if not model_path:
            raise ValueError("onnx embedder needs model_path=...")
        self.model_path = model_path
        self.batch_size = int(batch_size)
        self.num_threads = int(num_threads)
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)
        self._session = None
        calibration = f"{model_path}.calibration.json"
        self._threshold_hint = f" --out {calibration}"
        if threshold is None:
            threshold = read_calibrated_threshold(calibration, self.name)
        self.threshold = threshold
        session = self._load()
        shape = session.get_inputs()[0].shape
        if layout is None:
            layout = "NCHW" if len(shape) == 4 and shape[1] == 3 else "NHWC"
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
        self.layout = layout
        spatial = shape[2] if layout == "NCHW" else shape[1]
        if image_size is None:
            if not isinstance(spatial, int):
                raise ValueError(f"{model_path} has a dynamic image size; pass image_size=...")
            image_size = spatial
        self.image_size = int(image_size)
        self.dim = int(np.prod(self._run(np.zeros((1, self.image_size, self.image_size, 3), np.float32)).shape[1:]))

    def config(self) -> dict:
        return {"name": self.name, "model_path": self.model_path, "image_size": self.image_size, "layout": self.layout}

    def _load(self):
        if self._session is None:
            import onnxruntime as ort

            model = files.read_bytes(self.model_path)
            options = ort.SessionOptions()
            if self.num_threads:
                options.intra_op_num_threads = self.num_threads
            self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return self._session

    def _run(self, unit: np.ndarray) -> np.ndarray:
        """unit: float32 [B, S, S, 3] in [0, 1]."""
        x = (unit - self.mean) / self.std
        if self.layout == "NCHW":
            x = x.transpose(0, 3, 1, 2)
        session = self._load()
        out = session.run(None, {session.get_inputs()[0].name: np.ascontiguousarray(x, np.float32)})[0]
        return np.asarray(out).reshape(len(unit), -1)

    def decode(self, data: bytes) -> Image.Image:
        return decode_rgb(data, self.image_size)

    def embed_pil(self, images: Sequence[Image.Image]) -> np.ndarray:
        unit = (resize_to_unit_range(images, self.image_size) + 1.0) / 2.0
        return l2_normalize(self._run(unit))
