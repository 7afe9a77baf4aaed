"""Pinned requirements for Dataflow workers: the lock file restricted to what workers install.

    python -m pipeline.build.worker_requirements > worker-requirements.txt
    python -m pipeline.build.worker_requirements --extra train > worker-requirements.txt  # --embedder checkpoint

``setup.py`` gives lower bounds (``pillow>=10``): a worker installing this
package with ``--setup_file`` gets whatever the newest versions are that day,
so its Pillow/libjpeg may differ from the lock's and the shards are no longer
byte-identical to a local build. This prints ``requirements/lock.txt``'s pins
of exactly the distributions the workers need: the package's base
requirements (plus ``--extra`` ones) and everything they require in turn, as
installed in this environment (``importlib.metadata``), sorted. Pass the file
to the job with ``--requirements_file worker-requirements.txt`` beside
``--setup_file``: Dataflow installs it on every worker before the package.

In a checkout, the package's own requirements are read from its
``setup.py`` (the installed metadata of an editable install keeps the
requirements of the day it was installed); their dependencies from the
installed distributions. A needed distribution missing from the lock is an
error (exit 1): a pin cannot be guessed. Run it in the environment the lock
describes.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata as metadata
import os
import re
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from packaging.requirements import Requirement

DISTRIBUTION = "alt-text-corpus"
#: This checkout's setup.py (absent where the package was installed from its sdist or wheel).
SETUP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "setup.py")
#: Installers, present on every worker and never in a ``pip freeze`` lock.
TOOLING = {"pip", "setuptools", "wheel"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: str) -> Dict[str, str]:
    """``name==version`` lines -> {canonical name: line}."""
    pins = {}
    with open(path) as handle:
        for line in handle:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            requirement = Requirement(line)
            pins[canonical(requirement.name)] = line
    return pins


def _applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in list(extras) or [""])


def declared(setup_path: str = SETUP) -> Optional[Dict[str, List[str]]]:
    """``{"": BASE, extra: [...]}`` as ``setup.py`` declares them, read without running it; None outside a checkout."""
    if not os.path.exists(setup_path):
        return None
    with open(setup_path) as handle:
        tree = ast.parse(handle.read())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("BASE", "EXTRAS"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    if "BASE" not in found:
        return None
    return {"": list(found["BASE"]), **{k: list(v) for k, v in found.get("EXTRAS", {}).items()}}


def _requires(name: str, extras: Sequence[str]) -> List[str]:
    """What ``name[extras]`` requires, markers included: setup.py's lists for this package in a checkout."""
    own = declared() if canonical(name) == canonical(DISTRIBUTION) else None
    if own is not None and all(extra in own for extra in extras):
        return own[""] + [f"{text}; extra == '{extra}'" for extra in extras for text in own[extra]]
    return metadata.distribution(name).requires or []


def needed(distribution: str = DISTRIBUTION, extras: Sequence[str] = ()) -> Tuple[Set[str], List[str]]:
    """Canonical names of what installing ``distribution[extras]`` pulls in (itself excluded), and
    the names required but not installed here."""
    found: Set[str] = set()
    missing: List[str] = []
    frontier = [(distribution, tuple(extras))]
    seen = set()
    while frontier:
        name, wanted = frontier.pop()
        if (canonical(name), wanted) in seen:
            continue
        seen.add((canonical(name), wanted))
        try:
            requires = _requires(name, wanted)
        except metadata.PackageNotFoundError:
            missing.append(canonical(name))
            continue
        for text in requires:
            requirement = Requirement(text)
            if not _applies(requirement, wanted):
                continue
            found.add(canonical(requirement.name))
            frontier.append((requirement.name, tuple(sorted(requirement.extras))))
    found.discard(canonical(distribution))
    return found - TOOLING, sorted(set(missing) - TOOLING)


def worker_requirements(lock_path: str, extras: Sequence[str] = ()) -> List[str]:
    """The lock's lines for what the workers install, sorted; ``ValueError`` if one is not pinned."""
    pins = read_lock(lock_path)
    names, missing = needed(DISTRIBUTION, extras)
    unpinned = sorted(n for n in names if n not in pins)
    if missing or unpinned:
        raise ValueError(
            f"not pinned in {lock_path}: {', '.join(unpinned) or '-'}; not installed here: {', '.join(missing) or '-'}")
    return sorted(pins[n] for n in names)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.build.worker_requirements", description=__doc__.splitlines()[0])
    parser.add_argument("--lock", default="requirements/lock.txt", help="the pinned environment (name==version lines)")
    parser.add_argument("--extra", action="append", default=[], help="an extra the workers need too (repeatable)")
    args = parser.parse_args(argv)
    try:
        lines = worker_requirements(args.lock, args.extra)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"# pinned worker requirements from {args.lock} ({DISTRIBUTION}{'[' + ','.join(args.extra) + ']' if args.extra else ''})")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
