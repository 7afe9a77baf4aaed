"""No module over 500 lines unless its docstring says why.

The reason is in the module docstring: the words ``Over 500 lines`` followed,
in the same paragraph, by at least 40 characters that say why (a bare marker
does not count).
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOPS = ("common", "filters", "dedup", "pipeline", "trainer", "samplegen", "tests", "benchmarks", "scripts")
MAX_LINES = 500
SIZE_REASON = f"Over {MAX_LINES} lines"
MIN_REASON_CHARS = 40
# Modules whose split is under way, path -> who splits them and how: they
# pass meanwhile. Remove an entry when its split lands.
BEING_SPLIT = {}


def stated_reason(source: str):
    """The docstring paragraph that says why the module is long, or None."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    for paragraph in doc.split("\n\n"):
        at = paragraph.find(SIZE_REASON)
        if at >= 0 and len(" ".join(paragraph[at + len(SIZE_REASON):].split())) >= MIN_REASON_CHARS:
            return paragraph.strip()
    return None


def oversized(paths):
    """'path: N lines' for every module over the limit without a stated reason."""
    found = []
    for path in paths:
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > MAX_LINES and not stated_reason(source):
            found.append(f"{path.relative_to(ROOT).as_posix()}: {lines} lines")
    return found


def test_no_module_over_500_lines_without_a_stated_reason():
    paths = sorted(p for top in TOPS for p in (ROOT / top).rglob("*.py"))
    assert len(paths) > 100  # the walk found the tree
    found = [line for line in oversized(paths) if line.split(":")[0] not in BEING_SPLIT]
    assert found == [], f"split these, or say why not in the docstring ({SIZE_REASON!r} and the reason)"


def test_the_check_fails_on_a_long_module_and_accepts_a_reason(tmp_path):
    body = "x = 1\n" * MAX_LINES
    plain = tmp_path / "plain.py"
    plain.write_text('"""A module."""\n' + body)
    marker_only = tmp_path / "marker.py"
    marker_only.write_text(f'"""A module.\n\n{SIZE_REASON} yes.\n"""\n' + body)
    reasoned = tmp_path / "reasoned.py"
    reasoned.write_text(f'"""A module.\n\n{SIZE_REASON} one table per paper, read side by side with it.\n"""\n' + body)
    short = tmp_path / "short.py"
    short.write_text('"""Short."""\n' + "x = 1\n" * (MAX_LINES - 1))
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert oversized([plain, marker_only, reasoned, short]) == [
            f"plain.py: {MAX_LINES + 1} lines", f"marker.py: {MAX_LINES + 4} lines"]
    finally:
        ROOT = saved
