"""No module over 500 lines: a file that long holds two ideas, and is split where they part."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOPS = ("common", "filters", "dedup", "pipeline", "trainer", "samplegen", "tests", "benchmarks", "scripts")
MAX_LINES = 500


def oversized(paths, root=ROOT):
    """'path: N lines' for every module over the limit."""
    found = []
    for path in paths:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            found.append(f"{path.relative_to(root).as_posix()}: {lines} lines")
    return found


def test_no_module_over_500_lines():
    paths = sorted(p for top in TOPS for p in (ROOT / top).rglob("*.py"))
    assert len(paths) > 100  # the walk found the tree
    assert oversized(paths) == [], "split these where their ideas part"


def test_the_check_fails_on_a_long_module_whatever_its_docstring_says(tmp_path):
    body = "x = 1\n" * MAX_LINES
    plain = tmp_path / "plain.py"
    plain.write_text('"""A module."""\n' + body)
    reasoned = tmp_path / "reasoned.py"
    reasoned.write_text(f'"""A module.\n\nOver {MAX_LINES} lines: one table per paper, read side by side with it.\n"""\n'
                        + body)
    short = tmp_path / "short.py"
    short.write_text('"""Short."""\n' + "x = 1\n" * (MAX_LINES - 1))
    assert oversized([plain, reasoned, short], tmp_path) == [
        f"plain.py: {MAX_LINES + 1} lines", f"reasoned.py: {MAX_LINES + 4} lines"]
