"""``python -m pipeline.build``: what the job pickles refers to ``pipeline.*``, never to ``__main__``.

Run as ``-m``, ``pipeline/build/__main__.py`` is the ``__main__`` module. A
DoFn class or a function defined there would be pickled as
``__main__.<name>``, which a worker started by another program cannot
resolve (a NameError with ``--pickle_library=dill``). The test runs the module exactly as ``-m`` does
(``runpy`` with ``run_name="__main__"``) and, instead of running the job,
lists where every DoFn of the graph comes from.
"""

import json
import os
import subprocess
import sys

import repo_root

ROOT = repo_root.ROOT

PROBE = r"""
import json, runpy, sys
import apache_beam as beam
from apache_beam.transforms.core import CallableWrapperDoFn

def user_callable(target):
    # Map, FlatMap and MapTuple wrap the user's callable in a lambda of Beam's own.
    for _ in range(5):
        target = getattr(target, "func", target)  # functools.partial
        if not target.__module__.startswith("apache_beam") or not getattr(target, "__closure__", None):
            break
        inner = [cell.cell_contents for cell in target.__closure__
                 if callable(cell.cell_contents) and hasattr(cell.cell_contents, "__module__")]
        if not inner:
            break
        target = inner[0]
    return target

def origins(pipeline):
    found = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            fn = getattr(node.transform, "fn", None)
            if isinstance(fn, beam.DoFn):
                target = user_callable(fn._fn) if isinstance(fn, CallableWrapperDoFn) else type(fn)
                found.append([node.full_label, target.__module__, getattr(target, "__qualname__", repr(target))])

    pipeline.visit(Visitor())
    return found

def report_instead_of_running(self, *args, **kwargs):
    print(json.dumps(origins(self)))
    sys.stdout.flush()
    raise SystemExit(0)

beam.Pipeline.run = report_instead_of_running
sys.argv = ["pipeline.build"] + sys.argv[1:]
runpy.run_module("pipeline.build", run_name="__main__", alter_sys=True)
"""


def test_job_pickles_its_dofns_by_reference_to_pipeline_modules(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()  # the launcher checks that the input exists; the job never runs
    pq.write_table(pa.table({"url": ["u"], "caption": ["a b c"], "jpg": [b"x"]}), tmp_path / "in" / "part.parquet")
    args = ["--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out"),
            "--set", "dedup_in_corpus=true"]
    done = subprocess.run([sys.executable, "-c", PROBE] + args, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    origins = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(origins) > 30  # the whole graph was built
    assert [o for o in origins if o[1] == "__main__"] == []
    # The job's own DoFns and the graph's lambdas, by their real module names.
    module_of = {name: module for _, module, name in origins}
    assert module_of["_JudgeFiles"] == "pipeline.stages.judge"
    assert module_of["_WriteFileShards"] == "pipeline.write.second_pass"
    assert module_of["_ResolveVerdicts"] == "pipeline.stages.verdicts"
    assert module_of["FirstPass.expand.<locals>.<lambda>"] == "pipeline.build.graph"
