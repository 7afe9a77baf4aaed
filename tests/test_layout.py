"""The package layout stays as designed: imports point one way, modules stay small.

Every import is read from the source with ``ast`` (function-level and
conditional imports included), so a lazy import cannot hide a dependency.
"""

import ast
import pathlib

import setuptools

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Package -> the project packages it may import (besides itself). Shared ground
# (common) <- filters <- dedup <- pipeline; common <- trainer. The sample
# generator is a test-data tool on top: nothing shipped may import it.
ALLOWED = {
    "common": set(),
    "filters": {"common"},
    "dedup": {"common", "filters"},
    "pipeline": {"common", "filters", "dedup"},
    "trainer": {"common"},
    "samplegen": {"common", "filters", "dedup", "pipeline"},
}

# (module path, imported module) -> why the rule does not hold there. Keep it short.
EXCEPTIONS = {
    ("dedup/embedders.py", "trainer.checkpoint"): (
        "the 'checkpoint' embedder runs a trained ALIGN image tower; the loading lives on the "
        "trainer side (trainer.checkpoint.load_image_encoder) and is imported only when that "
        "embedder is used, so dedup itself loads without JAX"
    ),
    ("filters/model_score.py", "trainer.pair_score"): (
        "the 'checkpoint' pair model scores with a trained run's two towers, through the trainer's own "
        "preprocessing and tokenizer (what makes its cosine the one trainer.embed gives); imported only "
        "when that model is used, so filters itself loads without JAX"
    ),
}

def modules(tops=ALLOWED):
    for top in sorted(tops):
        yield from sorted((ROOT / top).rglob("*.py"))


def imported_modules(path: pathlib.Path):
    """(line, absolute module name) for every import of the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: stays inside its own package
                continue
            yield node.lineno, node.module
            for alias in node.names:  # `from pipeline import schema` imports pipeline.schema
                yield node.lineno, f"{node.module}.{alias.name}"


def violations():
    found = []
    for path in modules():
        relative = path.relative_to(ROOT).as_posix()
        top = relative.split("/")[0]
        for line, name in imported_modules(path):
            target = name.split(".")[0]
            if target not in ALLOWED or target == top or target in ALLOWED[top]:
                continue
            if (relative, name) in EXCEPTIONS or (relative, name.rsplit(".", 1)[0]) in EXCEPTIONS:
                continue
            found.append(f"{relative}:{line} imports {name} ({top} may import only {sorted(ALLOWED[top]) or 'nothing of the project'})")
    return found


NOT_CHECKED = {"benchmarks", "tests"}  # harnesses: they may import anything


def test_every_package_is_checked():
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - NOT_CHECKED
    assert on_disk <= set(ALLOWED), "a new top-level package needs its place in ALLOWED"


def test_samplegen_is_not_shipped():
    """setup.py's packages: every checked package but the test-data generator."""
    call = next(
        node for node in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "find_packages"
    )
    include = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "include"))
    shipped = {name.split(".")[0] for name in setuptools.find_packages(where=str(ROOT), include=include)}
    assert shipped == set(ALLOWED) - {"samplegen"}


def test_imports_point_one_way():
    assert violations() == []


def test_exceptions_are_still_needed():
    # An exception whose import went away must leave the list, or it would
    # silently allow the next such import.
    present = {
        (path.relative_to(ROOT).as_posix(), name) for path in modules() for _, name in imported_modules(path)
    }
    assert set(EXCEPTIONS) <= present


def test_the_checker_sees_function_level_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    if True:\n        from trainer.train import x\n    import pipeline.build\n")
    assert {name for _, name in imported_modules(module)} >= {"trainer.train", "pipeline.build"}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """module -> project modules it imports anywhere in its source (lazy imports included)."""
    paths = {module_name(p): p for p in modules()}

    def resolve(name):  # the longest project module the name starts with
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                # `from a.b import c`: c is the module a.b.c, or a name defined in a.b.
                targets.update(resolve(f"{node.module}.{alias.name}") for alias in node.names)
        graph[name] = targets - {"", name}
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# ---------------------------------------------------------------------------
# pipeline/ by role: one folder per part of the data flow, imports pointing down
# ---------------------------------------------------------------------------

#: Sub-package of pipeline/ -> the sub-packages it may import (besides itself). The command folders sit on
#: top; ``funnel/`` is the ground floor every part counts into and imports no sibling.
ROOMS = {
    "funnel": set(),
    "readers": {"funnel"},
    "stages": {"readers", "funnel"},
    "download": {"stages", "readers", "funnel"},
    "write": {"stages", "download", "readers", "funnel"},
    "what_if": {"funnel"},
    "publish": {"funnel"},
    "audit": {"what_if", "funnel"},
    "build": {"readers", "download", "stages", "write", "funnel", "publish", "what_if"},
    "select": {"build", "readers", "stages", "write", "funnel", "publish"},
}
#: The commands a person runs: ``python -m pipeline.X`` for each, a folder with its ``__main__.py``.
COMMANDS = {"build", "publish", "audit", "select"}


def room_of(module: str):
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "pipeline" else None


def room_violations(graph=None):
    graph = import_graph() if graph is None else graph
    found = []
    for module, targets in sorted(graph.items()):
        room = room_of(module)
        for target in sorted(targets):
            other = room_of(target)
            if room and other and other != room and other not in ROOMS[room]:
                found.append(f"{module} imports {target} (pipeline/{room}/ may import only {sorted(ROOMS[room])})")
            if not room and target.startswith("pipeline.") and other == "build":
                found.append(f"{module} imports {target} (nothing below the command imports pipeline/build/)")
    return found


def test_pipeline_has_only_sub_packages():
    loose = sorted(p.name for p in (ROOT / "pipeline").glob("*.py") if p.name != "__init__.py")
    assert loose == []
    rooms = {p.parent.name for p in (ROOT / "pipeline").glob("*/__init__.py")}
    assert rooms == set(ROOMS), "a new sub-package of pipeline/ needs its place in ROOMS"


def test_pipeline_imports_point_down():
    assert room_violations() == []


def test_the_room_check_finds_an_upward_import():
    graph = {"pipeline.funnel.counts": {"pipeline.stages.judge"}, "pipeline.audit.report": {"pipeline.stages.judge"},
             "dedup.x": {"pipeline.build.config"}, "pipeline.build.graph": {"pipeline.stages.judge"}}
    assert len(room_violations(graph)) == 3


def test_each_command_is_a_folder():
    for name in COMMANDS:
        assert (ROOT / "pipeline" / name / "__main__.py").exists()
    mains = {p.parent.name for p in (ROOT / "pipeline").glob("*/__main__.py")}
    assert mains == COMMANDS


def test_pipeline_module_names_are_used_once_in_the_tree():
    """A module of pipeline/ does not share its name with another shipped module (``tfrecord.py`` beside
    ``readers/tfrecord.py`` made a reader ask which one is meant)."""
    shipped = [p for top in sorted(set(ALLOWED) - {"samplegen"}) for p in (ROOT / top).rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")]
    by_name = {}
    for path in shipped:
        by_name.setdefault(path.stem, []).append(path.relative_to(ROOT).as_posix())
    shared = {name: paths for name, paths in by_name.items()
              if len(paths) > 1 and any(path.startswith("pipeline/") for path in paths)}
    assert shared == {}
