"""open_nsfw's precisions: CPU per scored photograph and agreement with the fp32 folded graph, in one run.

    python -m benchmarks.nsfw_precision [--photos 1000] [--large_photos 300] [--sample_candidates 400] [--seed 0]
                                        [--timing_images 160] [--rounds 5] [--variants int8,...] [--json PATH]

Inputs, made in a scratch directory (deterministic, nothing downloaded):

- photographs: ``benchmarks.photo_candidates`` crops of the photographs
  scikit-image and scikit-learn ship, JPEGs of 400-800 px (``--photos``,
  seed ``--seed``; the int8 graph's calibration pictures are other crops,
  ``open_nsfw_int8.CALIBRATION_SEED``), and of 1000-2000 px
  (``--large_photos``, seed ``--seed`` + 1: agreement only), where the
  int8 path's reduced decode reduces most;
- every distinct decodable picture of the sample (``samplegen``,
  ``--sample_candidates`` ordinary rows, seed ``--seed``: the test run's
  sample at the defaults).

Variants, each against ``fp32`` (the folded graph, the reference, from the
whole decode):

- ``int8``: what the stage runs with ``nsfw_precision=auto`` on a CPU with
  VNNI (``filters.open_nsfw_int8``: every convolution but the stem's,
  shipped ranges; JPEGs decoded reduced, ``open_nsfw.INT8_DECODE_SIDE``);
- ``int8_whole_decode``: the same graph from the whole decode (what the
  reduced decode adds to the score changes, and what it saves);
- ``int8_all``: every operator onnxruntime's QDQ quantiser takes, uint8
  activations (calibrated here on ``samplegen.nsfw_calibration.calibration_inputs``);
- ``int8_all_s8``: the same with int8 symmetric activations;
- ``int8_dynamic``: dynamic quantisation (``ConvInteger``, weights int8).

The benchmark-only variants prepare as fp32 does (whole decode).

Figures:

1. CPU-ms per scored photograph from the bytes, interleaved: each of
   ``--rounds`` rounds times every variant once over the same
   ``--timing_images`` photographs of 400-800 px, its preparation
   (``prepare``: decode, resize, the JPEG round trip, crop, mean) and its
   model (``score_prepared``, batch 4 as the stage, one onnxruntime thread,
   in this process) apart; per variant the median of each, their sum, and
   its ratio to fp32's; the load average with each round;
2. agreement with fp32 on every photograph and every sample picture, each
   variant from its own preparation: max, 99th-percentile and median score
   change, decisions changed at the preset's cut and at 0.2 / 0.8, and how
   many JPEGs the variant decoded reduced.

CPU-ms is this process's CPU time (``time.process_time``: every thread).
The CPU's model name and its int8/bf16 instruction sets are recorded.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
from PIL import Image

from benchmarks import harness, record
from benchmarks.helpers.nsfw import differences, read_images, sample_images
from filters import open_nsfw, open_nsfw_int8
from filters.presets import get_preset
from samplegen import nsfw_calibration

VARIANTS = ("int8", "int8_whole_decode", "int8_all", "int8_all_s8", "int8_dynamic")
BATCH = 4  # the stage's batch (OpenNsfwScorer's default)
#: /proc/cpuinfo flags worth naming beside the figures.
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu() -> dict:
    model, flags = "unknown", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    return {"model": model, "instructions": [flag for flag in FLAGS if flag in flags],
            "int8_usable": open_nsfw_int8.cpu_int8()[1]}


class GraphScorer(open_nsfw.OpenNsfwScorer):
    """``OpenNsfwScorer``'s preparation and batching on a graph made here (a variant the stage does not run)."""

    def __init__(self, graph: bytes, label: str):
        self.batch_size, self.decode_side, self.label = BATCH, 0, label
        self._session = open_nsfw._new_session(graph, 1, "all")
        self._input_name = self._session.get_inputs()[0].name


def variant_graphs(names, scratch: str) -> dict:
    """The benchmark-only variants' graphs, made from the folded graph."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)

    folded_path = os.path.join(scratch, "folded.onnx")
    with open(folded_path, "wb") as handle:
        handle.write(open_nsfw.folded_graph(open_nsfw.model_path())[0])
    input_name = onnx.load(folded_path).graph.input[0].name
    calibration = nsfw_calibration.calibration_inputs() if {"int8_all", "int8_all_s8"} & set(names) else None

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{input_name: calibration[i:i + 8]} for i in range(0, len(calibration), 8)])

        def get_next(self):
            return next(self.batches, None)

    graphs = {}
    for name in names:
        target = os.path.join(scratch, f"{name}.onnx")
        if name == "int8_dynamic":
            quantize_dynamic(folded_path, target, weight_type=QuantType.QInt8)
        elif name in ("int8_all", "int8_all_s8"):
            signed = name == "int8_all_s8"
            quantize_static(folded_path, target, Calibration(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QInt8 if signed else QuantType.QUInt8,
                            weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": signed})
        else:
            continue
        with open(target, "rb") as handle:
            graphs[name] = handle.read()
    return graphs


def scorers(names, scratch: str) -> dict:
    found = {"fp32": open_nsfw.OpenNsfwScorer(precision="fp32")}
    for name, decode_side in (("int8", None), ("int8_whole_decode", 0)):
        if name in names:
            found[name] = open_nsfw.OpenNsfwScorer(precision="int8", decode_side=decode_side)
            if not found[name].label.startswith(f"{open_nsfw.MODEL_NAME} int8"):
                raise SystemExit(f"the stage's int8 graph did not load: {found[name].label}")
    quiet = open_nsfw_int8._QuantiserAdvice()  # the quantiser's advice and shape-inference chatter
    logging.getLogger().addFilter(quiet)
    try:
        made = variant_graphs(names, scratch)
    finally:
        logging.getLogger().removeFilter(quiet)
    for name, graph in made.items():
        found[name] = GraphScorer(graph, name)
    return found


def prepare_and_score(scorer, images) -> dict:
    """One pass over ``images``: CPU-ms per image of the preparation and of the model, apart."""
    start = time.process_time()
    prepared = [scorer.prepare(data) for data in images]
    middle = time.process_time()
    scorer.score_prepared(prepared)
    end = time.process_time()
    return {"prep": 1000 * (middle - start) / len(images), "model": 1000 * (end - middle) / len(images)}


def interleaved_cost(variants: dict, images, rounds: int) -> dict:
    """CPU-ms per scored photograph from the bytes, preparation and model apart: per variant, the medians over
    ``rounds`` interleaved rounds (``harness.interleaved``), the load average after each round."""
    for scorer in variants.values():
        prepare_and_score(scorer, images)  # warm-up: sessions made, caches filled
    loads, last = [], list(variants)[-1]

    def after(name, repeat, found):
        if name == last:
            loads.append(record.load())

    passes = harness.interleaved({name: (lambda scorer=scorer: prepare_and_score(scorer, images))
                                  for name, scorer in variants.items()}, rounds, report=after)
    found = {}
    for name, runs in passes.items():
        prep, model = (statistics.median(run[part] for run in runs) for part in ("prep", "model"))
        found[name] = {"prep_ms": prep, "model_ms": model, "cpu_ms_per_image": prep + model,
                       "passes": runs}
    for name in found:
        for part, key in (("prep", "prep_ms"), ("model", "model_ms"), ("all", "cpu_ms_per_image")):
            found[name][f"{part}_of_fp32"] = found[name][key] / found["fp32"][key]
    found["fp32"]["load_per_round"] = loads
    return found


def reduced(scorer, images) -> int:
    """How many of ``images`` the scorer's preparation decodes reduced (a JPEG whose sides stay >= its
    ``decode_side`` at 1/2 scale or less)."""
    from common.images import draft, open_image

    side, count = getattr(scorer, "decode_side", 0), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the sample plants one; prepare too
        for data in images if side else ():
            with open_image(data) as image:
                count += draft(image, "RGB", side) != (0.0, 0.0, float(image.width), float(image.height))
    return count


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=1000, help="photographs of 400-800 px (agreement)")
    parser.add_argument("--large_photos", type=int, default=300, help="photographs of 1000-2000 px (agreement)")
    parser.add_argument("--sample_candidates", type=int, default=400, help="the sample's ordinary rows (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing_images", type=int, default=160, help="photographs timed per variant and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="besides fp32: " + ", ".join(VARIANTS))
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    names = [name for name in args.variants.split(",") if name]
    if not set(names) <= set(VARIANTS):
        parser.error(f"--variants: unknown {sorted(set(names) - set(VARIANTS))}; known: {', '.join(VARIANTS)}")
    if min(args.photos, args.timing_images, args.rounds) < 1 or min(args.sample_candidates, args.large_photos) < 0:
        parser.error("--photos, --timing_images and --rounds must be >= 1, --large_photos and "
                     "--sample_candidates >= 0")
    run = record.Run()
    threshold = get_preset("align").nsfw_threshold
    figures = {"threshold": threshold, "cpu": cpu(), "batch": BATCH, "onnxruntime_threads": 1}
    print(f"CPU: {figures['cpu']['model']}, {' '.join(figures['cpu']['instructions'])}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        from benchmarks.helpers.images import write_candidates

        folder = os.path.join(scratch, "photos")
        write_candidates(folder, args.photos, args.seed, longer_side=(400, 800))
        sets = {"photos 400-800 px": [row["jpg"] for row in read_images(folder)]}
        if args.large_photos:
            large = os.path.join(scratch, "large")
            write_candidates(large, args.large_photos, args.seed + 1, longer_side=(1000, 2000))
            sets["photos 1000-2000 px"] = [row["jpg"] for row in read_images(large)]
        if args.sample_candidates:
            from samplegen.generate import write_sample

            sample_dir = os.path.join(scratch, "sample")
            write_sample(sample_dir, args.sample_candidates, args.seed, processes=1, log=lambda line: None)
            sets["sample pictures"] = [data for group in sample_images(sample_dir, args.sample_candidates,
                                                                       args.seed).values() for data in group]
        print("images: " + ", ".join(f"{name} {len(v)}" for name, v in sets.items()), flush=True)
        variants = scorers(names, scratch)
        figures["labels"] = {name: getattr(scorer, "label", name) for name, scorer in variants.items()}
        cost = interleaved_cost(variants, sets["photos 400-800 px"][:args.timing_images], args.rounds)
        figures["cpu_ms_per_scored_photo"] = cost
        print(f"load average (1 min) after each round: {[load[0] for load in cost['fp32']['load_per_round']]}",
              flush=True)
        for name, found in cost.items():
            print(f"{name:17s} {found['cpu_ms_per_image']:6.1f} CPU-ms per scored photograph: prepare "
                  f"{found['prep_ms']:5.1f} + model {found['model_ms']:5.1f} ({found['all_of_fp32']:.2f} of fp32: "
                  f"prepare {found['prep_of_fp32']:.2f}, model {found['model_of_fp32']:.2f})", flush=True)
        scores = {name: {where: scorer.score_prepared([scorer.prepare(d) for d in data])
                         for where, data in sets.items()} for name, scorer in variants.items()}
        agreement = {}
        for name in variants:
            if name == "fp32":
                continue
            for where in sets:
                found = differences(scores[name][where], scores["fp32"][where], threshold)
                found["decoded_reduced"] = reduced(variants[name], sets[where])
                agreement[f"{name}, {where}"] = found
                print(f"{name:17s} {where}: {found['images']} images ({found['decoded_reduced']} decoded reduced), "
                      f"max change {found['max']:.4f}, p99 {found['p99']:.4f}, "
                      f"decisions changed {found['decisions_changed']}", flush=True)
            both = differences(np.concatenate([scores[name][w] for w in sets]),
                               np.concatenate([scores["fp32"][w] for w in sets]), threshold)
            agreement[f"{name}, all"] = both
        figures["agreement_with_fp32"] = agreement
        figures["fp32_max_score"] = {where: float(np.max(s)) for where, s in scores["fp32"].items()}
    run.write("nsfw_precision", figures, args.json)


if __name__ == "__main__":
    main()
