"""``common.beam_construction``: the remembered answers are Beam's own, and jobs run as before."""

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate

from common import beam_construction

beam_construction.install()


class Stateful(beam.DoFn):
    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())

    def process(self, element, count=beam.DoFn.StateParam(COUNT)):
        count.write((count.read() or 0) + 1)
        yield element[0], count.read()  # how many of its key this worker had seen


class Plain(beam.DoFn):
    def process(self, element):
        yield element


def test_dofn_specs_are_beams_and_asked_once_per_instance():
    original = userstate.get_dofn_specs.__wrapped__
    for dofn in (Stateful(), Plain(), beam.Map(len).dofn):
        assert userstate.get_dofn_specs(dofn) == original(dofn)
        assert userstate.get_dofn_specs(dofn) is userstate.get_dofn_specs(dofn)
    assert userstate.is_stateful_dofn(Stateful()) and not userstate.is_stateful_dofn(Plain())


def test_signatures_are_beams_for_functions_bound_methods_and_the_rest():
    from apache_beam.transforms import core
    from apache_beam.typehints import decorators

    original = decorators.get_signature.__wrapped__

    def function(element, side=None):
        return element

    class Callable:
        def __call__(self, element, *rest):
            return element

    plain, other = Plain(), Plain()
    for func in (function, plain.process, other.process, Stateful().process, Callable(), len, lambda x, y=2: x):
        assert decorators.get_signature(func) == original(func), func
        assert core.get_signature is decorators.get_signature
    assert str(decorators.get_signature(plain.process)) == "(element)"  # bound: no self
    assert decorators.get_signature(plain.process) is decorators.get_signature(other.process)
    assert core.get_function_arguments(Stateful(), "process") == (["element", "count"], [beam.DoFn.StateParam(
        Stateful.COUNT)])


def test_views_share_the_options_values_like_new_ones():
    options = PipelineOptions(["--runner", "FnApiRunner", "--save_main_session"])
    view = options.view_as(StandardOptions)
    assert view is options.view_as(StandardOptions)  # remembered
    fresh = PipelineOptions.view_as.__wrapped__(options, StandardOptions)
    assert fresh.runner == view.runner == "FnApiRunner"
    view.runner = "DataflowRunner"  # a change through one view is seen by every view and the options
    assert options.view_as(StandardOptions).runner == fresh.runner == "DataflowRunner"
    assert options.view_as(SetupOptions).save_main_session is True
    other = PipelineOptions(["--runner", "FnApiRunner"])
    assert other.view_as(StandardOptions) is not view and other.view_as(StandardOptions).runner == "FnApiRunner"


def test_a_stateful_job_runs_as_before():
    with TestPipeline(runner="FnApiRunner") as p:
        counted = p | beam.Create([("a", 1), ("a", 2), ("b", 3)]) | beam.ParDo(Stateful()) | beam.CombinePerKey(max)
        assert_that(counted, equal_to([("a", 2), ("b", 1)]))
