"""How big a job's graph is: its leaf transforms and the stages the FnApiRunner fuses them into.

Each leaf transform costs at graph construction (a label, its DoFn pickled,
its coders inferred) and again when a runner translates it; each fused stage
is a bundle the runner schedules, with its own operations and data channels.
``size(proto)`` counts both on the portable graph (``Pipeline.to_runner_api()``
or what a runner receives); ``ShuffleMeasuringRunner``
(``benchmarks.helpers.shuffles``) records them for every job it runs.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

from apache_beam.runners.portability.fn_api_runner import fn_runner


class GraphSize(NamedTuple):
    transforms: int  # leaf transforms (a composite's parts counted, not the composite)
    stages: int      # the FnApiRunner's stages after fusion


def leaf_transforms(proto) -> int:
    return sum(1 for t in proto.components.transforms.values() if not t.subtransforms)


def size(proto) -> GraphSize:
    """The graph's leaf transforms and the FnApiRunner's fused stages of it (``proto`` is not changed)."""
    _, stages = fn_runner.FnApiRunner().create_stages(copy.deepcopy(proto))
    return GraphSize(leaf_transforms(proto), len(stages))


def of_pipeline(p) -> GraphSize:
    """``size`` of a constructed (not yet run) ``beam.Pipeline``."""
    return size(p.to_runner_api())
