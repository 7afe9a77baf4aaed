"""A value made once per job from whole PCollections, for two transforms.

``beam.CombineGlobally`` with its value for an empty input, ``combiners.ToList`` and a ``beam.Create([None])``
that only starts a step each cost several transforms beside the work (Beam's ``DoOnce`` and ``InjectDefault``,
``Create``'s decoding): every transform is paid for at graph construction and again at the runner's
translation, and a build has hundreds. ``once`` calls a function one time with its side inputs read whole: an
``Impulse`` and a ``Map``. A combine read through it is applied ``.without_defaults()`` and read with
``AsSingleton(..., default_value=fn.apply([]))``: the same value for an empty input, five transforms fewer.
"""

from __future__ import annotations

import apache_beam as beam


def once(pipeline: beam.Pipeline, label: str, fn, *args, **kwargs) -> beam.PCollection:
    """``fn(*args, **kwargs)`` called once (side inputs among the arguments read whole); its result as the one
    element of a PCollection."""
    return pipeline | f"{label}Start" >> beam.Impulse() | label >> beam.Map(_call, fn, *args, **kwargs)


def total(pcoll: beam.PCollection, label: str, combine_fn) -> beam.pvalue.AsSingleton:
    """``combine_fn`` over ``pcoll`` as a singleton side input: its value of nothing when ``pcoll`` is empty."""
    combine_fn = beam.CombineFn.maybe_from_callable(combine_fn)
    combined = pcoll | label >> beam.CombineGlobally(combine_fn).without_defaults()
    return beam.pvalue.AsSingleton(combined, default_value=combine_fn.apply([]))


def _call(_, fn, *args, **kwargs):
    return fn(*args, **kwargs)
