"""Bytes the build moves through shuffles, per shuffle, measured by the runner that runs it.

    python -m benchmarks.shuffle_bytes --input 'S/candidates/*.parquet' [--workers 1] [--json PATH] [-- BUILD FLAGS]

Every GroupByKey is a shuffle on Dataflow (billed per GB by Dataflow
Shuffle) and a buffer held in memory on the FnApiRunner; CoGroupByKey,
CombinePerKey, CombineGlobally and Reshuffle all expand to one. A combine is
measured where it shuffles: after the runner lifts it, the GroupByKey's
input is the precombined accumulators, not the raw values.

``ShuffleMeasuringRunner`` is Beam's FnApiRunner with two additions: after
fusion it notes which PCollection each GroupByKey reads (the producer of a
``group:`` data channel), and after the job it reads the SDK's own
per-PCollection monitoring infos for those PCollections:
``beam:metric:element_count:v1`` and ``beam:metric:sampled_byte_size:v1``
(the encoded size of a sample of the elements: the first 10, then fewer and
fewer, so ~60 of 2,000). Bytes of a shuffle = elements x mean sampled size.
It runs the real build through its real command line
(``--runner benchmarks.shuffle_bytes.ShuffleMeasuringRunner``), in process or
with ``--direct_running_mode=multi_processing``; it writes its figures to the
file named by ``$SHUFFLE_BYTES_JSON`` when set, and keeps the last job's in
``ShuffleMeasuringRunner.last``.

``measured_build(argv)`` runs one build in this process and returns its
funnel and ``Shuffles``: per shuffle its elements, bytes per element and bytes per
input candidate (the funnel's input count).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # ``python -m benchmarks.shuffle_bytes``: run the module imported by its real
    # name, so the runner Beam instantiates from --runner is the class whose
    # ``last`` this run reads.
    from benchmarks.shuffle_bytes import main

    sys.exit(main())

import argparse
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from apache_beam.metrics import monitoring_infos
from apache_beam.runners.portability.fn_api_runner import fn_runner, translations
from apache_beam.runners.worker import bundle_processor

OUTPUT_ENV = "SHUFFLE_BYTES_JSON"
RUNNER = "benchmarks.shuffle_bytes.ShuffleMeasuringRunner"


@dataclass
class Shuffle:
    """One GroupByKey: what went into it."""

    name: str  # the GroupByKey's full label, e.g. JoinVerdicts/CoGroupByKey/GroupByKey
    pcollections: List[str]  # the PCollection(s) written into its buffer
    elements: int = 0
    sampled: int = 0  # elements whose size was measured
    sampled_bytes: int = 0
    largest_element: int = 0

    @property
    def bytes_per_element(self) -> float:
        return self.sampled_bytes / self.sampled if self.sampled else 0.0

    @property
    def bytes(self) -> float:
        return self.elements * self.bytes_per_element


@dataclass
class Shuffles:
    """Every shuffle of one job; ``candidates`` is the job's input count (0 if not known)."""

    shuffles: List[Shuffle]
    candidates: int = 0
    unmeasured: List[str] = field(default_factory=list)  # shuffles whose input reported no sizes

    @property
    def total_bytes(self) -> float:
        return sum(s.bytes for s in self.shuffles)

    def per_candidate(self, shuffle: Shuffle) -> float:
        return shuffle.bytes / self.candidates if self.candidates else float("nan")

    def heavier_than(self, bytes_per_candidate: float) -> List[Shuffle]:
        """The shuffles that carry more than ``bytes_per_candidate`` per input candidate, heaviest first."""
        return sorted((s for s in self.shuffles if self.per_candidate(s) > bytes_per_candidate),
                      key=lambda s: -s.bytes)

    def describe(self, shuffles: Optional[List[Shuffle]] = None) -> str:
        """One line per shuffle: name, elements, bytes per element and per candidate."""
        return "\n".join(
            f"{s.name}: {s.elements:,} elements x {s.bytes_per_element:,.0f} B "
            f"(largest sampled {s.largest_element:,} B) = {self.per_candidate(s):,.0f} B per candidate"
            for s in (self.shuffles if shuffles is None else shuffles))

    def to_json(self) -> dict:
        rows = []
        for s in sorted(self.shuffles, key=lambda s: -s.bytes):
            row = asdict(s)
            row.update(bytes_per_element=round(s.bytes_per_element, 1), bytes=round(s.bytes),
                       bytes_per_candidate=round(self.per_candidate(s), 1) if self.candidates else None)
            rows.append(row)
        return {"candidates": self.candidates, "shuffles": len(self.shuffles), "total_bytes": round(self.total_bytes),
                "total_bytes_per_candidate": round(self.total_bytes / self.candidates, 1) if self.candidates else None,
                "unmeasured": self.unmeasured, "per_shuffle": rows}

    @classmethod
    def from_json(cls, document: dict) -> "Shuffles":
        fields = ("name", "pcollections", "elements", "sampled", "sampled_bytes", "largest_element")
        return cls([Shuffle(**{k: row[k] for k in fields}) for row in document["per_shuffle"]],
                   document.get("candidates") or 0, document.get("unmeasured", []))


def grouping_inputs(stages) -> Dict[str, List[str]]:
    """GroupByKey label -> the PCollections written into its grouping buffer, from the fused stages.

    The FnApiRunner turns each GroupByKey into a ``<label>/Write`` data output
    to a ``group:`` buffer and a ``<label>/Read``; a Flatten before it is sunk
    into its producers, which then write to the same buffer.
    """
    found: Dict[str, List[str]] = {}
    for stage in stages:
        for transform in stage.transforms:
            if transform.spec.urn != bundle_processor.DATA_OUTPUT_URN:
                continue
            kind, _ = translations.split_buffer_id(transform.spec.payload)
            if kind != "group":
                continue
            name = transform.unique_name.removesuffix("/Write")
            found.setdefault(name, []).extend(transform.inputs.values())
    return found


def pcollection_sizes(infos) -> Dict[str, dict]:
    """PCollection id -> {elements, sampled, sampled_bytes, largest} from the SDK's monitoring infos."""
    sizes: Dict[str, dict] = {}
    for info in infos:
        pcollection = info.labels.get(monitoring_infos.PCOLLECTION_LABEL)
        if not pcollection:
            continue
        entry = sizes.setdefault(pcollection, {"elements": 0, "sampled": 0, "sampled_bytes": 0, "largest": 0})
        if info.urn == monitoring_infos.ELEMENT_COUNT_URN:
            entry["elements"] += monitoring_infos.extract_counter_value(info)
        elif info.urn == monitoring_infos.SAMPLED_BYTE_SIZE_URN:
            count, total, _, largest = monitoring_infos.extract_distribution(info)
            entry["sampled"] += count
            entry["sampled_bytes"] += total
            entry["largest"] = max(entry["largest"], largest)
    return sizes


def measure(result, inputs: Dict[str, List[str]], candidates: int = 0) -> Shuffles:
    """The shuffles of a finished FnApiRunner job (``RunnerResult``), from its monitoring infos."""
    sizes = pcollection_sizes(result.monitoring_infos())
    shuffles, unmeasured = [], []
    for name, pcollections in sorted(inputs.items()):
        shuffle = Shuffle(name, list(pcollections))
        for pcollection in pcollections:
            size = sizes.get(pcollection)
            if size is None:
                continue
            shuffle.elements += size["elements"]
            shuffle.sampled += size["sampled"]
            shuffle.sampled_bytes += size["sampled_bytes"]
            shuffle.largest_element = max(shuffle.largest_element, size["largest"])
        if shuffle.elements and not shuffle.sampled:
            unmeasured.append(name)
        shuffles.append(shuffle)
    return Shuffles(shuffles, candidates, unmeasured)


class ShuffleMeasuringRunner(fn_runner.FnApiRunner):
    """FnApiRunner that measures what each GroupByKey of the job receives (see the module docstring)."""

    last: Optional[Shuffles] = None

    def create_stages(self, pipeline_proto):
        stage_context, stages = super().create_stages(pipeline_proto)
        self._grouping_inputs = grouping_inputs(stages)
        return stage_context, stages

    def run_stages(self, stage_context, stages):
        result = super().run_stages(stage_context, stages)
        shuffles = measure(result, self._grouping_inputs)
        type(self).last = shuffles
        path = os.environ.get(OUTPUT_ENV)
        if path:
            with open(path, "w") as handle:
                json.dump(shuffles.to_json(), handle, indent=1)
        return result


def measured_build(build_argv: List[str]) -> Tuple[dict, Shuffles]:
    """Run ``pipeline.build`` with these arguments in this process; returns its funnel and its shuffles."""
    from pipeline import build

    ShuffleMeasuringRunner.last = None
    funnel = build.run(list(build_argv) + ["--runner", RUNNER])
    shuffles = ShuffleMeasuringRunner.last
    if shuffles is None:
        raise RuntimeError("the build did not run on ShuffleMeasuringRunner")
    shuffles.candidates = funnel["input"]
    return funnel, shuffles


def main(argv=None) -> None:
    from benchmarks import record
    from common import console

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="glob of the build's input (Parquet candidates)")
    parser.add_argument("--workers", type=int, default=1, help="1: in process; more: multi_processing workers")
    parser.add_argument("--json", default="", help="default benchmarks/results/shuffle_bytes.json")
    parser.add_argument("build_flags", nargs="*", help="more flags for pipeline.build (after --)")
    args = parser.parse_args(argv)
    run = record.Run()
    log = console.route_library_output("shuffle_bytes")
    with tempfile.TemporaryDirectory(prefix="shuffle-bytes-") as out:
        build_argv = ["--input", args.input, "--output", os.path.join(out, "corpus"), "--preset", "align",
                      *args.build_flags]
        if args.workers > 1:
            build_argv += ["--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"]
        funnel, shuffles = measured_build(build_argv)
    print(shuffles.describe(sorted(shuffles.shuffles, key=lambda s: -s.bytes)))
    print(f"{len(shuffles.shuffles)} shuffles, {shuffles.total_bytes / shuffles.candidates:,.0f} bytes per candidate "
          f"over {shuffles.candidates:,} candidates ({sum(funnel['written'].values()):,} written; log {log})",
          flush=True)
    run.write("shuffle_bytes", {"workers": args.workers, **shuffles.to_json()}, args.json)
