"""The build's job graph stays as small as it was made: every leaf transform costs at graph construction and at
the runner's translation of it, and the stats wiring grew it silently before.

The sample build (``conftest.measured_sample_build``, the same job the other sample tests read) runs on
``benchmarks.helpers.shuffles.ShuffleMeasuringRunner``, which records the graph's size as the runner received it
(``benchmarks.helpers.graph_size``).
"""

import apache_beam as beam

from benchmarks.helpers import graph_size

#: The sample build's leaf transforms and FnApiRunner stages (440 and 123 before its global combines lost Beam's
#: default injection, ToList and Create became ``common.once``, the single-part Flattens went and the hot-key
#: joins lost a CoGroupByKey): a bound, so that the graph cannot grow back unnoticed.
MAX_TRANSFORMS = 349
MAX_STAGES = 106


def test_the_helper_counts_leaf_transforms_and_fused_stages():
    def graph(without_defaults):
        p = beam.Pipeline(runner="FnApiRunner")
        total = beam.CombineGlobally(sum)
        _ = (p | "Numbers" >> beam.Create([1, 2, 3])
             | "Sum" >> (total.without_defaults() if without_defaults else total) | "Show" >> beam.Map(str))
        return graph_size.of_pipeline(p)

    plain, lean = graph(False), graph(True)
    # Beam's default for an empty input is five more transforms (DoOnce's and InjectDefault) and a stage.
    assert plain.transforms - lean.transforms == 5 and plain.stages - lean.stages == 1
    assert lean.stages < lean.transforms


def test_the_sample_build_graph_does_not_grow(measured_sample_build):
    _, _, shuffles = measured_sample_build
    assert 0 < shuffles.stages < shuffles.transforms
    assert shuffles.transforms <= MAX_TRANSFORMS, (
        f"the sample build has {shuffles.transforms} leaf transforms (bound {MAX_TRANSFORMS}): fold new counts "
        "into an existing combine or DoFn output rather than adding transforms")
    assert shuffles.stages <= MAX_STAGES, f"{shuffles.stages} fused stages (bound {MAX_STAGES})"
