"""One spelling of every option across the commands: underscores; the hyphenated one is refused in one line.

Reads every command's own ``--help`` (so a new option is checked the day it
is added) and tries the hyphenated spelling of each of its options.
"""

import importlib
import os
import re
import subprocess
import sys

import pytest

from common import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Command module -> how it parses: "argparse" (``main(argv)`` on a
#: ``common.cli.ArgumentParser``) or "absl" (flags, ``--helpshort``).
#: pipeline.build and pipeline.publish join when their parsers use common.cli.
COMMANDS = {
    "pipeline.audit": "argparse",
    "trainer.vocab": "argparse",
    "trainer.evaluate": "argparse",
    "trainer.embed": "argparse",
    "trainer.search": "argparse",
    "trainer.train": "absl",
}

OPTION = re.compile(r"(?<![\w-])--[A-Za-z][A-Za-z0-9_.-]*[A-Za-z0-9_]")


def help_text(module: str, capsys) -> str:
    if COMMANDS[module] == "absl":
        done = subprocess.run([sys.executable, "-m", module, "--helpshort"], cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert "flags:" in done.stdout, done.stderr  # absl's --helpshort exits with status 1
        return done.stdout
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(module).main(["--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def options_in(text: str) -> set:
    # config overrides (--config.a.b=...) are field paths, spelled as the config's fields are
    return set(OPTION.findall(text)) - {"--help", "--helpshort", "--helpfull"}


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_every_option_of_every_command_is_spelled_with_underscores(module, capsys):
    options = options_in(help_text(module, capsys))
    assert options, f"no options found in {module} --help"
    assert sorted(o for o in options if "-" in o[2:]) == []


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_the_hyphenated_spelling_is_refused_in_one_line_naming_the_right_one(module, capsys):
    spelled = sorted(o for o in options_in(help_text(module, capsys)) if "_" in o and not o.startswith("--config."))
    if not spelled:
        pytest.skip(f"{module} has no option with an underscore")
    for right in spelled:
        wrong = "--" + right[2:].replace("_", "-")
        if COMMANDS[module] == "absl":
            # absl's own refusal: the error line with its suggestion, then its pointer to --helpshort
            done = subprocess.run([sys.executable, "-m", module, f"{wrong}=1"], cwd=ROOT, capture_output=True,
                                  text=True, env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"})
            lines = done.stderr.strip().splitlines()
            assert done.returncode != 0 and len(lines) <= 2 and right[2:] in lines[0], (wrong, done.stderr)
            continue
        with pytest.raises(SystemExit) as exit_info:
            importlib.import_module(module).main([wrong])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1, (wrong, err)
        assert err.startswith(f"error: {wrong}:") and right in err, (wrong, err)


def test_the_check_finds_a_hyphenated_option_and_leaves_the_rest_alone():
    options = {"--allow_incomplete", "--no_html", "--k"}
    assert cli.misspelled(["x", "--no-html"], options) == ("--no-html", "--no_html")
    assert cli.misspelled(["--allow-incomplete=1"], options) == ("--allow-incomplete", "--allow_incomplete")
    assert cli.misspelled(["--no_html", "--k", "3", "--unknown-thing"], options) is None
    assert cli.misspelled(["--", "--no-html"], options) is None  # a positional after --
