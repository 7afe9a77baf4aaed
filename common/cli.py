"""The project's command lines: one spelling of every option, and every mistake in one line.

Options are spelled with underscores (``--allow_incomplete``, ``--data_dir``),
as Beam's pipeline options and absl's flags are, so that one command line can
mix them. A hyphenated spelling of a known option is refused with one line
naming the right one, instead of being taken for an unknown argument (argparse
prints its usage text first; Beam silently discards what it cannot parse).

``ArgumentParser`` is argparse's with that check and with one-line errors.
``misspelled(argv, options)`` is the check alone, for a command that parses
its arguments in several steps (``pipeline.build`` hands what it does not
know to Beam).
"""

from __future__ import annotations

import argparse
import sys
from typing import Container, Iterable, Optional, Tuple


def misspelled(argv: Iterable[str], options: Container[str]) -> Optional[Tuple[str, str]]:
    """``(given, right)`` for the first argument that is one of ``options`` spelled with hyphens."""
    for arg in argv:
        if arg == "--":  # what follows is positional
            return None
        if not arg.startswith("--"):
            continue
        given = arg.split("=", 1)[0]
        right = "--" + given[2:].replace("-", "_")
        if right != given and right in options:
            return given, right
    return None


def spelling_message(given: str, right: str) -> str:
    return f"{given}: options are spelled with underscores here: {right}"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the spelling check and one-line errors (``error: ... (see <prog> --help)``)."""

    def parse_known_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        found = misspelled(argv, self._option_string_actions)
        if found:
            self.error(spelling_message(*found))
        return super().parse_known_args(argv, namespace)

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def key_value_args(items: Iterable[str], flag: str) -> dict:
    """``["workdir=W", "step=100"]`` -> keyword arguments (JSON values, else text), as ``flag KEY=VALUE``
    options give them; an item without ``=`` or without a key is a ValueError naming ``flag``."""
    import json

    kwargs = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            kwargs[key] = json.loads(text)
        except json.JSONDecodeError:
            kwargs[key] = text
    return kwargs
