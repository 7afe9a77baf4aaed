"""Composite transforms whose input is a (named) tuple of PCollections, some of them absent.

A part of a job that is off (no pair model, no evaluation set, a selection
that judges nothing again) has no PCollection to hand on; its place in the
tuple is ``None``. Beam takes every leaf of an input tuple for a PCollection
and refuses ``None``, so ``OptionalInputs`` leaves the ``None`` out of what
it declares as its inputs; ``expand`` receives the tuple as given and reads
``None`` as "this part did not run".
"""

from __future__ import annotations

import apache_beam as beam


class OptionalInputs(beam.PTransform):
    """A ``PTransform`` whose input tuple may hold ``None`` where a PCollection is absent."""

    def _extract_input_pvalues(self, pvalueish):
        pvalueish, inputs = super()._extract_input_pvalues(pvalueish)
        return pvalueish, {tag: value for tag, value in inputs.items() if value is not None}
