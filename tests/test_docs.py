"""The README, the manual (docs/) and benchmarks/RESULTS.md say only what exists.

- every link between them leads to a file;
- every ``python -m MODULE`` they cite is a module of this repository (or
  the standard library's ``venv``);
- every commit they cite is in the history;
- every option a command block passes to one of the project's commands is an
  option of that command (its own ``--help``, Beam's options for the build,
  config fields for the trainer), so a renamed option cannot linger;
- each command block says whether it runs here (``<!-- docs-test: run -->``,
  run below, offline) or why not (``<!-- docs-test: skip REASON -->``), and
  the README's test command is the one CI runs;
- every dotted path of the project named in a docstring or a page
  (``pipeline.stages.judge.RecordJudge``) is a module of the tree, and the
  first name after the module is defined there, so a move cannot leave a
  docstring or a page pointing at nothing.
"""

import ast
import os
import re
import shlex
import subprocess
import sys

import pytest

from test_option_spelling import COMMANDS, help_text, options_in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
                               if name.endswith(".md"))
RECORDS = PAGES + [os.path.join("benchmarks", "RESULTS.md")]
#: Manual pages other work adds; linked already. Checked like any page once they exist.
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
MODULE = re.compile(r"python -m ([A-Za-z_][\w.]*)")
BLOCK = re.compile(r"(?:<!-- docs-test: (run|skip)([^>]*)-->\n)?```bash\n(.*?)```", re.S)
# A commit as the records cite one: 7 to 12 hex digits, at least one letter and one digit.
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![\w/-])")


def text(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as handle:
        return handle.read()


def commands(block: str):
    """The command lines of a bash block: continuations joined, comments dropped."""
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            yield shlex.split(line)


def blocks():
    for page in PAGES:
        for marker, reason, block in BLOCK.findall(text(page)):
            yield page, marker, reason.strip(), block


@pytest.mark.parametrize("page", PAGES)
def test_every_link_leads_to_a_file(page):
    missing = []
    for target in LINK.findall(text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http:, mailto:
        path = os.path.normpath(os.path.join(os.path.dirname(page), target))
        if not os.path.exists(os.path.join(ROOT, path)):
            missing.append(target)
    assert missing == []


def module_exists(name: str) -> bool:
    path = os.path.join(ROOT, *name.split("."))
    return os.path.exists(path + ".py") or os.path.exists(os.path.join(path, "__init__.py"))


@pytest.mark.parametrize("page", RECORDS)
def test_every_cited_module_exists(page):
    cited = set(MODULE.findall(text(page))) - {"venv"}
    assert sorted(m for m in cited if not module_exists(m)) == []


@pytest.mark.parametrize("page", RECORDS)
def test_every_cited_commit_is_in_the_history(page):
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    cited = sorted(set(COMMIT.findall(text(page))))
    missing = [c for c in cited if subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{c}^{{commit}}"],
                                                  capture_output=True).returncode != 0]
    assert missing == []


def test_every_command_block_says_whether_it_runs_here():
    unmarked = [(page, block.splitlines()[0]) for page, marker, reason, block in blocks()
                if not marker or (marker == "skip" and not reason)]
    assert unmarked == []


def beam_options() -> set:
    from apache_beam.options.pipeline_options import PipelineOptions

    return {"--" + name for name in PipelineOptions([]).get_all_options()}


INLINE_COMMAND = re.compile(r"`((?:[A-Z_]+=\S+ )?python -m [^`]+)`")


def cited_commands():
    """(page, argv) of every command line: in the bash blocks, and inline in backticks (RESULTS' commands)."""
    for page, _, _, block in blocks():
        for argv in commands(block):
            yield page, argv
    for page in RECORDS:
        for line in INLINE_COMMAND.findall(text(page).replace("\n", " ")):
            yield page, list(commands(line))[0]


def test_every_option_of_a_cited_command_is_an_option_of_that_command(capsys):
    known = {}
    wrong = []
    for page, argv in cited_commands():
        argv = [a for a in argv if not re.match(r"[A-Z_]+=", a)]  # PYTHONPATH=. and the like
        if "-m" not in argv or argv[argv.index("-m") + 1] not in COMMANDS:
            continue
        module = argv[argv.index("-m") + 1]
        if module not in known:
            usage = help_text(module, capsys)
            one_letter = set(re.findall(r"(?<![\w-])--[A-Za-z](?![\w-])", usage))  # --k
            known[module] = options_in(usage) | one_letter | {"--help"}
            if module == "pipeline.build":
                known[module] |= beam_options()
        for arg in argv:
            option = arg.split("=", 1)[0]
            if option.startswith("--") and option not in known[module] and not option.startswith("--config."):
                wrong.append((page, module, option))
    assert sorted(set(wrong)) == []


def test_the_readme_test_command_is_what_ci_runs():
    ci = [line for line in text(os.path.join(".ci", "run")).splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    # The default suite, then its integration tests (pytest.ini's `integration` marker).
    assert ci == ["bash scripts/test.sh", "bash scripts/test.sh -m integration"]
    two_commands = text("README.md").split("## The two commands", 1)[1]
    assert "bash scripts/test.sh" in BLOCK.search(two_commands).group(3)


@pytest.mark.parametrize("page,block", [(page, block) for page, marker, _, block in blocks() if marker == "run"])
def test_runnable_blocks_run(page, block):
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for argv in commands(block):
        argv = [sys.executable if a == "python" else a for a in argv]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, (page, argv, done.stderr[-2000:])


@pytest.mark.slow
def test_the_readme_funnel_is_what_the_demo_build_prints(tmp_path):
    """The README's funnel block is the demo's build of the sample at this commit, line for line."""
    readme = text("README.md")
    shown = re.search(r"```\n(funnel of .*?conservation: [^\n]*)\n```", readme, re.S).group(1)
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2", "ALT_TEXT_CORPUS_LOG_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "samplegen", "--out", "out/sample"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    import json

    info = json.loads((tmp_path / "out" / "sample" / "sample_info.json").read_text())
    argv = [sys.executable, "-m", "pipeline.build", "--input", "out/sample/candidates/*.parquet",
            "--output", "out/corpus", "--preset", "align"]
    for override in info["build_overrides"]:
        argv += ["--set", override]
    name, path = info["eval_images"].split("=", 1)
    argv += ["--eval_images", f"{name}=out/sample/{path}", "--overwrite"]  # as scripts/demo.sh
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    printed = re.search(r"(funnel of .*?conservation: [^\n]*)", done.stdout, re.S).group(1)
    assert printed.splitlines() == shown.splitlines()


# ---------------------------------------------------------------------------
# Docstrings name what exists
# ---------------------------------------------------------------------------

PACKAGES = ("common", "filters", "dedup", "pipeline", "trainer", "samplegen", "benchmarks")
#: ``pipeline.stages.judge`` or ``pipeline.stages.judge.RecordJudge.setup``; ``trainer.checkpoint.load_*`` is a pattern.
DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w*]|\.[\w*])" % "|".join(PACKAGES))


def module_file(dotted: str):
    path = os.path.join(ROOT, *dotted.split("."))
    for candidate in (os.path.join(path, "__init__.py"), path + ".py"):
        if os.path.exists(candidate):
            return candidate
    return None


def top_level_names(path: str) -> set:
    """What a module defines or imports at its top level (including under ``if``/``try``)."""
    names = set()
    for node in ast.parse(open(path, encoding="utf-8").read()).body:
        for sub in [node] + (list(ast.walk(node)) if isinstance(node, (ast.If, ast.Try)) else []):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in sub.names)
    return names


def dotted_problem(dotted: str):
    """Why ``dotted`` names nothing (None when its module exists and defines its first attribute)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:end]))
        if path is not None:
            rest = parts[end:]
            if rest and rest[0] not in top_level_names(path):
                return f"{'.'.join(parts[:end])} defines no {rest[0]}"
            return None
    return "no such module"


def docstring_references():
    for top in PACKAGES + ("tests",):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                tree = ast.parse(open(path, encoding="utf-8").read())
                for node in ast.walk(tree):
                    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        for dotted in DOTTED.findall(ast.get_docstring(node, clean=False) or ""):
                            yield os.path.relpath(path, ROOT), getattr(node, "lineno", 1), dotted.rstrip(".")


def test_docstrings_name_modules_that_exist():
    found = [f"{path}:{line}: {dotted}: {problem}" for path, line, dotted in docstring_references()
             if (problem := dotted_problem(dotted))]
    assert found == []


@pytest.mark.parametrize("page", RECORDS)
def test_pages_name_modules_that_exist(page):
    cited = {dotted.rstrip(".") for dotted in DOTTED.findall(text(page)) if not dotted.endswith(".md")}
    assert sorted(f"{dotted}: {problem}" for dotted in cited if (problem := dotted_problem(dotted))) == []


def test_the_docstring_check_finds_a_stale_name():
    assert dotted_problem("pipeline.stages.judge.RecordJudge") is None
    assert dotted_problem("pipeline.judge") == "pipeline defines no judge"
    assert dotted_problem("pipeline.stages.judge.NoSuchThing") == "pipeline.stages.judge defines no NoSuchThing"
    assert DOTTED.findall("``trainer.checkpoint.load_*`` and (``common.files``).") == ["common.files"]
