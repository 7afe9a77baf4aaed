"""The int8 open_nsfw graph's activation ranges, measured again on samplegen's pictures.

    python -m samplegen.nsfw_calibration [--out PATH]

``filters.open_nsfw_int8`` quantises the folded graph with ranges that ship
as ``filters/open_nsfw_int8_ranges.json``; this measures them on the fixed
calibration set (crops of the photographs samplegen uses, as
``benchmarks.photo_candidates`` makes them, and its drawn scenes) and
writes the file, one tensor a line. A tool of the checkout, like the rest
of samplegen: workers read the shipped file and never calibrate (the
photographs come with scikit-image, which they do not install).
"""

from __future__ import annotations

import io
import json
import os
from typing import Dict, Optional, Tuple

import numpy as np

from filters.open_nsfw_int8 import (CALIBRATION_PHOTOS, CALIBRATION_SCENES, CALIBRATION_SEED, RANGES_FILE,
                                    _conv_tensors, graph_digest)


def measure_ranges(folded: bytes, inputs: np.ndarray, batch: int = 8) -> Dict[str, Tuple[float, float]]:
    """MinMax calibration: each quantised convolution's activations' min and max over ``inputs`` (0 included)."""
    import onnx
    import onnxruntime

    model = onnx.load_from_string(folded)
    names = _conv_tensors(model)
    del model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in names)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    # The basic level only: the measured tensors must stay what they are in the graph the quantiser reads.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    calibrating = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    low = {name: 0.0 for name in names}
    high = {name: 0.0 for name in names}
    input_name = calibrating.get_inputs()[0].name
    for start in range(0, len(inputs), batch):
        for name, values in zip(names, calibrating.run(names, {input_name: inputs[start:start + batch]})):
            low[name] = min(low[name], float(values.min()))
            high[name] = max(high[name], float(values.max()))
    return {name: (low[name], high[name]) for name in names}


def calibration_inputs() -> np.ndarray:
    """The fixed calibration set through the model's preparation: float32 [64, 224, 224, 3].

    Photograph crops as ``benchmarks.photo_candidates`` makes them (400-800
    px JPEGs) and samplegen's drawn scenes.
    """
    from filters.open_nsfw import model_input
    from samplegen.content import render
    from samplegen.drawers import draw_content
    from samplegen.photos import render_photo, sample_photo

    rng = np.random.default_rng(CALIBRATION_SEED)
    pictures = []
    for index in range(CALIBRATION_PHOTOS + CALIBRATION_SCENES):
        longer = int(rng.integers(400, 801))
        aspect = float(rng.uniform(0.6, 1.6))
        size = (longer, round(longer / aspect)) if aspect >= 1 else (round(longer * aspect), longer)
        if index < CALIBRATION_PHOTOS:
            image = render_photo(sample_photo(rng, size), size)
        else:
            image = render(draw_content(rng, size=size, photo_share=0))
        out = io.BytesIO()
        image.convert("RGB").save(out, format="JPEG", quality=int(rng.integers(70, 91)))
        pictures.append(model_input(out.getvalue()))
    return np.stack(pictures)


def write_ranges(path: str = RANGES_FILE) -> dict:
    """Measures the ranges on the calibration set and writes ``RANGES_FILE``; returns what it wrote."""
    from filters.open_nsfw import folded_graph, model_path

    shipped = model_path()
    found = {
        "graph_sha256": graph_digest(shipped),
        "calibration": {"photos": CALIBRATION_PHOTOS, "scenes": CALIBRATION_SCENES, "seed": CALIBRATION_SEED},
        "ranges": {name: [float(f"{low:.6g}"), float(f"{high:.6g}")]
                   for name, (low, high) in measure_ranges(folded_graph(shipped)[0], calibration_inputs()).items()},
    }
    lines = [f"  {json.dumps(name)}: {json.dumps(value)}" for name, value in found["ranges"].items()]
    with open(path, "w", encoding="utf-8") as handle:  # one tensor a line: a new measurement diffs readably
        handle.write(f'{{"graph_sha256": {json.dumps(found["graph_sha256"])},\n'
                     f' "calibration": {json.dumps(found["calibration"])},\n'
                     ' "ranges": {\n' + ",\n".join(lines) + "\n }\n}\n")
    return found


def main(argv: Optional[list] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Measure the int8 open_nsfw graph's activation ranges again "
                                                 "and write them to " + os.path.relpath(RANGES_FILE))
    parser.add_argument("--out", default=RANGES_FILE, help="where to write them (default: the shipped file)")
    args = parser.parse_args(argv)
    try:
        found = write_ranges(args.out)
    except ImportError as error:
        print(f"error: the calibration pictures need the sample extra (pip install '.[sample]'): {error}")
        return 2
    print(f"{len(found['ranges'])} ranges -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
