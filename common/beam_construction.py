"""Three answers Beam's Python SDK (2.77) computes again and again while a job graph is built and run, remembered.

Profiling the construction and translation of the build's graph (and of the
corpus filters' composites alone) shows most of the CPU in two places that
repeat pure computations:

- ``apache_beam.transforms.userstate.get_dofn_specs(dofn)``: the state and
  timer specs of a DoFn, found by ``inspect.signature`` on every method of
  it. It runs about seven times per ``ParDo`` (validation at ``ParDo``
  construction, ``is_stateful_dofn`` in translation and in the runner), each
  time over the same DoFn instance, whose methods do not change.
- ``PipelineOptions.view_as(cls)``: every call builds an argparse parser for
  ``cls``'s options and parses the flags again, about four times per
  transform applied. Every view shares the options' value store
  (``_all_options``), so a view made once for that store answers like a new
  one.
- ``apache_beam.typehints.decorators.get_signature(func)``: ``inspect.signature``
  of a DoFn's methods and wrapped functions, ~12,000 times for a small build
  (~0.5 CPU-s of its ~2.5), as transforms are built and again as each
  stage's bundle processor is made.

``install()`` remembers them: ``get_dofn_specs`` per DoFn class (per wrapped
function for ``Map`` and ``FlatMap``: the specs are declared as defaults of
the class's methods), ``view_as`` per (value store, class), ``get_signature``
per Python function (a bound method's per its function: the bound signature
is the function's without its first parameter; other callables are not
remembered). On the corpus filters'
composites this took graph construction and translation from 104 to 62
CPU-s over their 45 tests (``benchmarks/RESULTS.md``, "Build start-up").
``tests/common/test_beam_construction.py`` checks that the remembered
answers are Beam's own. The build's launcher and the test suite install it;
nothing else about Beam changes.
"""

from __future__ import annotations

import types
import weakref

_installed = False


def _specs_key(dofn):
    """What a DoFn's state and timer specs depend on: its class's methods, and the function a ``Map`` or
    ``FlatMap`` wraps (its ``process``); None for an instance that carries methods of its own."""
    from apache_beam.transforms.core import CallableWrapperDoFn

    if any(isinstance(value, types.MethodType) for value in vars(dofn).values()):
        return None
    if isinstance(dofn, CallableWrapperDoFn):
        return type(dofn), dofn._fn
    return type(dofn)


def install() -> None:
    """Remember ``get_dofn_specs``, ``view_as`` and ``get_signature`` answers in this process (idempotent)."""
    global _installed
    if _installed:
        return
    from apache_beam.options import pipeline_options
    from apache_beam.transforms import userstate

    specs_of = userstate.get_dofn_specs
    by_class = {}  # a DoFn class (or a Map's function) -> its specs: they are read off the class's methods

    def get_dofn_specs(dofn):
        key = _specs_key(dofn)
        if key is None:
            return specs_of(dofn)
        found = by_class.get(key)
        if found is None:
            found = by_class[key] = specs_of(dofn)
        return found

    make_view = pipeline_options.PipelineOptions.view_as
    views = {}  # (id of a value store, class) -> (the store, its view)

    def view_as(self, cls):
        store = object.__getattribute__(self, "_all_options")
        found = views.get((id(store), cls))
        if found is not None and found[0] is store:
            return found[1]
        view = make_view(self, cls)
        views[(id(store), cls)] = (store, view)
        return view

    from apache_beam.transforms import core, ptransform, util
    from apache_beam.typehints import decorators

    signature_of = decorators.get_signature
    of_functions, of_bound_methods = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()

    def get_signature(func):
        if type(func) is types.FunctionType:
            memo, key = of_functions, func
        elif type(func) is types.MethodType and type(func.__func__) is types.FunctionType:
            memo, key = of_bound_methods, func.__func__
        else:
            return signature_of(func)
        found = memo.get(key)
        if found is None:
            found = memo[key] = signature_of(func)
        return found

    get_signature.__wrapped__ = signature_of
    for module in (decorators, core, ptransform, util):  # each imported the function by name
        module.get_signature = get_signature
    get_dofn_specs.__wrapped__ = specs_of
    view_as.__wrapped__ = make_view
    view_as.__doc__ = make_view.__doc__
    userstate.get_dofn_specs = get_dofn_specs
    pipeline_options.PipelineOptions.view_as = view_as
    _installed = True
