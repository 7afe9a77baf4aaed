"""One spelling of every option across the commands: underscores; the hyphenated one is refused in one line.

Reads every command's own ``--help`` (so a new option is checked the day it
is added) and tries the hyphenated spelling of each of its options.
"""

import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from common import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Command module -> how to run it: "main" (``main(argv)`` in this process, on a
#: ``common.cli.ArgumentParser``) or "absl" (``python -m``; absl flags:
#: ``--helpshort``, absl's own refusal).
COMMANDS = {
    "dedup.calibrate": "main",
    "samplegen": "main",
    "pipeline.audit": "main",
    "pipeline.build": "main",
    "pipeline.publish": "main",
    "pipeline.select": "main",
    "trainer.vocab": "main",
    "trainer.evaluate": "main",
    "trainer.embed": "main",
    "trainer.search": "main",
    "trainer.train": "absl",
}

#: Commands whose ``main`` lives in another module (``python -m pipeline.build`` runs the launcher's).
MAIN_OF = {"pipeline.build": "pipeline.build.launcher", "pipeline.publish": "pipeline.publish.publisher",
           "pipeline.audit": "pipeline.audit.auditor", "pipeline.select": "pipeline.select.selector",
           "samplegen": "samplegen.__main__"}

OPTION = re.compile(r"(?<![\w-])--[A-Za-z][A-Za-z0-9_.-]*[A-Za-z0-9_]")
ENV = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}


def run(module: str, argv: list, capsys) -> tuple:
    """(exit status, stdout, stderr) of the command with ``argv``."""
    if COMMANDS[module] == "main":
        with pytest.raises(SystemExit) as exit_info:
            importlib.import_module(MAIN_OF.get(module, module)).main(argv)
        out, err = capsys.readouterr()
        return exit_info.value.code, out, err
    done = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True, env=ENV)
    return done.returncode, done.stdout, done.stderr


def help_text(module: str, capsys) -> str:
    absl = COMMANDS[module] == "absl"
    if absl and module in _ABSL_HELP:
        return _ABSL_HELP[module]
    status, out, err = run(module, ["--helpshort" if absl else "--help"], capsys)
    assert (absl and "flags:" in out) or status == 0, err  # absl's --helpshort exits with status 1
    if absl:
        _ABSL_HELP[module] = out
    return out


#: An absl command's ``--helpshort``, read once per test process (a process of its own: TensorFlow and JAX).
_ABSL_HELP = {}


def options_in(text: str) -> set:
    return set(OPTION.findall(text)) - {"--help", "--helpshort", "--helpfull"}


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_every_option_of_every_command_is_spelled_with_underscores(module, capsys):
    options = options_in(help_text(module, capsys))
    assert options, f"no options found in {module} --help"
    assert sorted(o for o in options if "-" in o[2:]) == []


#: Runs absl's own ``app.run`` of a command for each given argument in one process (a process per
#: option would start TensorFlow and JAX once per option): ``[[exit status, stderr], ...]`` as JSON.
ABSL_REFUSALS = """
import contextlib, importlib, io, json, sys
from absl import app
module = importlib.import_module(sys.argv[1])
found = []
for argument in sys.argv[2:]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            app.run(module.main, argv=[sys.argv[1], argument])
            status = 0
        except SystemExit as stop:
            status = stop.code
    found.append([status, err.getvalue()])
print(json.dumps(found))
"""


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_the_hyphenated_spelling_is_refused_in_one_line_naming_the_right_one(module, capsys):
    # config overrides (--config.a.b=...) are field paths, spelled as the config's fields are
    spelled = sorted(o for o in options_in(help_text(module, capsys)) if "_" in o and not o.startswith("--config."))
    if not spelled:
        pytest.skip(f"{module} has no option with an underscore")
    wrongs = ["--" + right[2:].replace("_", "-") for right in spelled]
    if COMMANDS[module] == "absl":  # absl's refusal: the error with its suggestion, then a pointer to --helpshort
        done = subprocess.run([sys.executable, "-c", ABSL_REFUSALS, module, *[f"{w}=1" for w in wrongs]],
                              cwd=ROOT, capture_output=True, text=True, env=ENV)
        assert done.returncode == 0, done.stderr[-2000:]
        for right, wrong, (status, err) in zip(spelled, wrongs, json.loads(done.stdout.splitlines()[-1])):
            lines = err.strip().splitlines()
            assert status != 0 and len(lines) <= 2 and right[2:] in lines[0], (wrong, err)
        return
    for right, wrong in zip(spelled, wrongs):
        status, _, err = run(module, [f"{wrong}=1"], capsys)
        assert status == 2 and err.count("\n") == 1, (wrong, err)
        assert err.startswith(f"error: {wrong}:") and right in err, (wrong, err)


@pytest.mark.parametrize("argv,wrong,right", [
    (["pipeline.build", "--eval-images=x=y"], "--eval-images", "--eval_images"),
    (["pipeline.build", "--temp-location", "/tmp"], "--temp-location", "--temp_location"),  # Beam's own
    (["pipeline.publish", "out", "--keep-previous"], "--keep-previous", "--keep_previous"),
])
def test_the_command_line_refuses_the_hyphenated_spelling_in_one_line(argv, wrong, right):
    """As a person runs them (``python -m``), before any library output."""
    done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, env=ENV)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {wrong}:") and right in done.stderr, done.stderr


def test_the_check_finds_a_hyphenated_option_and_leaves_the_rest_alone():
    options = {"--allow_incomplete", "--no_html", "--k"}
    assert cli.misspelled(["x", "--no-html"], options) == ("--no-html", "--no_html")
    assert cli.misspelled(["--allow-incomplete=1"], options) == ("--allow-incomplete", "--allow_incomplete")
    assert cli.misspelled(["--no_html", "--k", "3", "--unknown-thing"], options) is None
    assert cli.misspelled(["--", "--no-html"], options) is None  # a positional after --
