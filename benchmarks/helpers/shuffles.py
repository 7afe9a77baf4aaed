"""Bytes each shuffle of a job carries, measured by the runner that runs it.

Every GroupByKey is a shuffle on Dataflow (billed per GB by Dataflow
Shuffle) and a buffer held in memory on the FnApiRunner; CoGroupByKey,
CombinePerKey, CombineGlobally and Reshuffle all expand to one. A combine is
measured where it shuffles: after the runner lifts it, the GroupByKey's
input is the precombined accumulators, not the raw values.

``ShuffleMeasuringRunner`` is Beam's FnApiRunner with two additions: after
fusion it notes which PCollections each GroupByKey reads (the producers of
its ``group:`` data channel), and while the job runs it counts the encoded
bytes every bundle appends to each grouping buffer: exactly what crosses
that shuffle, as the data plane carries it (length-prefixed windowed
values). Element counts are the SDK's own ``beam:metric:element_count:v1``
for those PCollections; the largest element its size sampling
(``beam:metric:sampled_byte_size:v1``) saw is reported beside. (The SDK's
sampled mean alone misjudges a CoGroupByKey, whose inputs are flattened
into one stream: it samples the first elements most, so the order of the
inputs sets the mean; on a join of 200 elements of 20 kB with 200 of 20 B
it read 66% over the bytes.)

A build runs on it through its real command line (``--runner`` ``RUNNER``),
in process or with ``--direct_running_mode=multi_processing`` (all data
reaches the runner's process either way); it writes its figures to the file
named by ``$SHUFFLE_BYTES_JSON`` when set, and keeps the last job's in
``ShuffleMeasuringRunner.last``. ``measured_build(argv)`` runs one build in
this process and returns its funnel and ``Shuffles``: per shuffle its
elements, bytes per element and bytes per input candidate (the funnel's
input count). Used by ``benchmarks.shuffle_bytes``,
``benchmarks.build_throughput`` and the tests that bound the build's shuffles;
the job's size (leaf transforms, fused stages) is recorded beside.
"""

from __future__ import annotations

import collections
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from apache_beam.metrics import monitoring_infos
from apache_beam.runners.portability.fn_api_runner import execution, fn_runner, translations
from apache_beam.runners.worker import bundle_processor

from benchmarks.helpers import graph_size

OUTPUT_ENV = "SHUFFLE_BYTES_JSON"
RUNNER = "benchmarks.helpers.shuffles.ShuffleMeasuringRunner"


@dataclass
class Shuffle:
    """One GroupByKey: what went into it."""

    name: str  # the GroupByKey's full label, e.g. JoinVerdicts/CoGroupByKey/GroupByKey
    pcollections: List[str]  # the PCollection(s) written into its buffer
    elements: int = 0
    bytes: int = 0  # encoded, as they reached the runner's grouping buffer
    largest_sampled: int = 0  # the largest element the SDK's size sampling saw

    @property
    def bytes_per_element(self) -> float:
        return self.bytes / self.elements if self.elements else 0.0


@dataclass
class Shuffles:
    """Every shuffle of one job; ``candidates`` is the job's input count (0 if not known)."""

    shuffles: List[Shuffle]
    candidates: int = 0
    unmeasured: List[str] = field(default_factory=list)  # shuffles whose element count no operation reported
    transforms: int = 0  # the job's leaf transforms (benchmarks.helpers.graph_size)
    stages: int = 0      # and the stages the runner fused them into

    @property
    def total_bytes(self) -> int:
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
            f"(largest sampled {s.largest_sampled:,} B) = {self.per_candidate(s):,.0f} B per candidate"
            for s in (self.shuffles if shuffles is None else shuffles))

    def to_json(self) -> dict:
        rows = []
        for s in sorted(self.shuffles, key=lambda s: -s.bytes):
            row = asdict(s)
            row.update(bytes_per_element=round(s.bytes_per_element, 1),
                       bytes_per_candidate=round(self.per_candidate(s), 1) if self.candidates else None)
            rows.append(row)
        return {"candidates": self.candidates, "shuffles": len(self.shuffles), "total_bytes": self.total_bytes,
                "total_bytes_per_candidate": round(self.total_bytes / self.candidates, 1) if self.candidates else None,
                "unmeasured": self.unmeasured, "transforms": self.transforms, "stages": self.stages,
                "per_shuffle": rows}

    @classmethod
    def from_json(cls, document: dict) -> "Shuffles":
        fields = ("name", "pcollections", "elements", "bytes", "largest_sampled")
        return cls([Shuffle(**{k: row[k] for k in fields}) for row in document["per_shuffle"]],
                   document.get("candidates") or 0, document.get("unmeasured", []), document.get("transforms", 0),
                   document.get("stages", 0))


def grouping_inputs(stages) -> Dict[bytes, Tuple[str, List[str]]]:
    """Grouping buffer id -> (GroupByKey label, the PCollections written into it), from the fused stages.

    The FnApiRunner turns each GroupByKey into a ``<label>/Write`` data output
    to a ``group:`` buffer and a ``<label>/Read``.
    """
    found: Dict[bytes, Tuple[str, List[str]]] = {}
    for stage in stages:
        for transform in stage.transforms:
            if transform.spec.urn != bundle_processor.DATA_OUTPUT_URN:
                continue
            kind, _ = translations.split_buffer_id(transform.spec.payload)
            if kind != "group":
                continue
            name = transform.unique_name.removesuffix("/Write")
            found.setdefault(transform.spec.payload, (name, []))[1].extend(transform.inputs.values())
    return found


def pcollection_counts(infos_by_stage) -> Dict[str, Tuple[int, int]]:
    """PCollection id -> (elements, largest sampled size) from the SDK's monitoring infos.

    A PCollection read by a later stage is reported there too (by the stage's
    data input, with the same elements): the stage that saw most counts, the
    reports are not added up.
    """
    counts: Dict[str, Tuple[int, int]] = {}
    for infos in infos_by_stage.values():
        seen: Dict[str, list] = {}
        for info in infos:
            pcollection = info.labels.get(monitoring_infos.PCOLLECTION_LABEL)
            if not pcollection:
                continue
            entry = seen.setdefault(pcollection, [0, 0])
            if info.urn == monitoring_infos.ELEMENT_COUNT_URN:
                entry[0] += monitoring_infos.extract_counter_value(info)
            elif info.urn == monitoring_infos.SAMPLED_BYTE_SIZE_URN:
                entry[1] = max(entry[1], monitoring_infos.extract_distribution(info)[3])
        for pcollection, (elements, largest) in seen.items():
            if pcollection not in counts or elements > counts[pcollection][0]:
                counts[pcollection] = (elements, largest)
    return counts


def measure(result, inputs: Dict[bytes, Tuple[str, List[str]]], written: Dict[bytes, int],
            candidates: int = 0) -> Shuffles:
    """The shuffles of a finished FnApiRunner job: bytes as written to each grouping buffer, elements
    from the job's monitoring infos."""
    # Per stage: RunnerResult keeps them so (monitoring_infos() would flatten them).
    by_stage = getattr(result, "_monitoring_infos_by_stage", None) or {"": list(result.monitoring_infos())}
    counts = pcollection_counts(by_stage)
    shuffles, unmeasured = [], []
    for buffer_id, (name, pcollections) in sorted(inputs.items(), key=lambda item: item[1][0]):
        shuffle = Shuffle(name, list(pcollections), bytes=written.get(buffer_id, 0))
        for pcollection in pcollections:
            if pcollection not in counts:  # no operation reported it: its elements are not known
                unmeasured.append(name)
                continue
            elements, largest = counts[pcollection]
            shuffle.elements += elements
            shuffle.largest_sampled = max(shuffle.largest_sampled, largest)
        shuffles.append(shuffle)
    return Shuffles(shuffles, candidates, unmeasured)


class ShuffleMeasuringRunner(fn_runner.FnApiRunner):
    """FnApiRunner that measures what each GroupByKey of the job receives (see the module docstring)."""

    last: Optional[Shuffles] = None

    def create_stages(self, pipeline_proto):
        stage_context, stages = super().create_stages(pipeline_proto)
        self._grouping_inputs = grouping_inputs(stages)
        self._graph = graph_size.GraphSize(graph_size.leaf_transforms(pipeline_proto), len(stages))
        return stage_context, stages

    def run_stages(self, stage_context, stages):
        written: Dict[bytes, int] = collections.Counter()
        get_buffer = execution.BundleContextManager.get_buffer

        def counting_get_buffer(manager, buffer_id, transform_id):
            # Every bundle's output reaches a buffer through here (under the
            # runner's lock); a grouping buffer counts what is appended to it.
            buffer = get_buffer(manager, buffer_id, transform_id)
            if buffer_id in self._grouping_inputs and not getattr(buffer, "_counted", False):
                append = buffer.append

                def counting_append(data, _append=append, _id=buffer_id):
                    written[_id] += len(data)
                    _append(data)

                buffer.append, buffer._counted = counting_append, True
            return buffer

        # The runner makes its BundleContextManagers itself and offers no hook:
        # the method is swapped on the class for this job (one job at a time
        # per process, as the build runs) and put back whatever happens.
        execution.BundleContextManager.get_buffer = counting_get_buffer
        try:
            result = super().run_stages(stage_context, stages)
        finally:
            execution.BundleContextManager.get_buffer = get_buffer
        shuffles = measure(result, self._grouping_inputs, written)
        shuffles.transforms, shuffles.stages = self._graph
        type(self).last = shuffles
        path = os.environ.get(OUTPUT_ENV)
        if path:
            with open(path, "w") as handle:
                json.dump(shuffles.to_json(), handle, indent=1)
        return result


def measured_build(build_argv: List[str]) -> Tuple[dict, Shuffles]:
    """Run ``pipeline.build`` with these arguments in this process; returns its funnel and its shuffles."""
    from pipeline.build import launcher

    ShuffleMeasuringRunner.last = None
    funnel = launcher.run(list(build_argv) + ["--runner", RUNNER])
    shuffles = ShuffleMeasuringRunner.last
    if shuffles is None:
        raise RuntimeError("the build did not run on ShuffleMeasuringRunner")
    shuffles.candidates = funnel["input"]
    return funnel, shuffles
