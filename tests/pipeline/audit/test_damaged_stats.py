"""Stats files that a build wrote and something then damaged: one line naming the file, never a traceback.

Each case damages one file of a realistic ``stats/`` directory (the fixture
of test_audit.py) the way a user's disk or editor would: a NaN or a huge
float where a count belongs, a string where a number belongs, a histogram
bin off its grid, JSON nested 100,000 deep. The audit either stops with one
line naming the file (the funnel; the what-if when it is asked a question)
or writes its report and says there which file or part it could not show.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import repo_root
from filters import stages
from filters.presets import get_preset
from pipeline.audit import auditor as audit
from pipeline.audit import read_stats
from pipeline.what_if import collect, rules
from pipeline.what_if.rules import WHAT_IF_FILE

DEEP = "[" * 100_000 + "]" * 100_000


def _fixtures():
    """The stats fixture of test_audit.py, loaded by path (tests/ is not a package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_audit.py")
    spec = importlib.util.spec_from_file_location("audit_stats_fixtures_damaged", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fixtures = _fixtures()


def what_if_doc() -> dict:
    """A what-if document as the build writes it (``pipeline.what_if.collect.what_if_document``)."""
    histograms = {
        "image_aspect": {"written": {3: 40, 7: 2}, "image_size": {1: 5}},
        "images_per_text": {"written": {1: 30, 2: 12}},
    }
    order = [name for name, _ in stages.STAGES]
    return collect.what_if_document(histograms, None, get_preset("align"), order, list(rules.SHARING_RULES))


def _set(path, value):
    def damage(doc):
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return damage


WHAT_IF_DAMAGE = {
    "nan count": (_set(("rules", "images_per_text", "written", 0), [1, float("nan")]), "rules.images_per_text"),
    "huge float cap": (_set(("caps", "images_per_text"), 1e300), "caps.images_per_text"),
    "string threshold": (_set(("built", "min_words"), "three"), "min_words"),
    "bin off its grid": (lambda doc: doc["rules"]["image_aspect"]["written"].append([99_999_999, 3]),
                         "rules.image_aspect.written[2] bin"),
    "nested 100,000 deep": (None, "nested"),
}


def _write_what_if(stats_dir, name):
    damage, _ = WHAT_IF_DAMAGE[name]
    path = os.path.join(stats_dir, WHAT_IF_FILE)
    if damage is None:
        text = DEEP
    else:
        doc = what_if_doc()
        damage(doc)
        text = json.dumps(doc)  # json writes NaN and 1e300 as a careless writer would
    with open(path, "w") as handle:
        handle.write(text)
    return path


def test_the_undamaged_what_if_document_passes_its_schema(tmp_path):
    stats_dir = fixtures.write_fixture_stats(tmp_path, omit=fixtures.NO_PLOTS)
    with open(os.path.join(stats_dir, WHAT_IF_FILE), "w") as handle:
        json.dump(what_if_doc(), handle)
    loaded = read_stats.load_stats(str(tmp_path))
    assert WHAT_IF_FILE not in loaded["unreadable"] and loaded["what_if"]["rules"]


@pytest.mark.parametrize("name", list(WHAT_IF_DAMAGE))
def test_a_damaged_what_if_file_is_one_line_and_the_report_says_so(tmp_path, capsys, name):
    stats_dir = fixtures.write_fixture_stats(tmp_path, omit=fixtures.NO_PLOTS)
    path = _write_what_if(stats_dir, name)
    # The question: one line naming the file and where it is wrong.
    assert audit.main([str(tmp_path), "--what_if", "max_images_per_text=20"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and "Traceback" not in err, err
    assert WHAT_IF_DAMAGE[name][1] in err, err
    # The plain audit: the report is written, the explorer says what is wrong, the funnel is shown.
    assert audit.main([str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    page = open(os.path.join(stats_dir, read_stats.REPORT_FILE), encoding="utf-8").read()
    assert "what_if.json is damaged" in page and 'class="banner ok"' in page


FUNNEL_DAMAGE = {
    "nested 100,000 deep": (lambda text: DEEP, "nested 100,000 deep"),
    "nan input": (lambda text: text.replace('"input": 10000', '"input": NaN', 1), "input: NaN"),
    "a stage that is a string": (lambda text: json.dumps(dict(json.loads(text), stages=["read"])),
                                 "stages[0]"),
    "huge float count": (lambda text: text.replace('"input": 10000', '"input": 1e300', 1), "input: 1e+300"),
}


@pytest.mark.parametrize("name", list(FUNNEL_DAMAGE))
def test_a_damaged_funnel_is_one_line_naming_it(tmp_path, capsys, name):
    stats_dir = fixtures.write_fixture_stats(tmp_path, omit=fixtures.NO_PLOTS)
    path = os.path.join(stats_dir, read_stats.FUNNEL_FILE)
    damage, what = FUNNEL_DAMAGE[name]
    text = open(path).read()
    damaged = damage(text)
    assert damaged != text
    open(path, "w").write(damaged)
    assert audit.main([str(tmp_path), "--no_html"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and "Traceback" not in err, err
    assert what in err, err


def test_a_deeply_nested_distributions_file_is_named_in_the_report(tmp_path, capsys):
    stats_dir = fixtures.write_fixture_stats(tmp_path, omit=fixtures.NO_PLOTS)
    open(os.path.join(stats_dir, read_stats.DISTRIBUTIONS_FILE), "w").write(DEEP)
    assert audit.main([str(tmp_path)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    page = open(os.path.join(stats_dir, read_stats.REPORT_FILE), encoding="utf-8").read()
    assert "distributions.json: JSON nested 100,000 deep" in page


def test_a_damaged_distribution_is_left_out_and_the_others_are_drawn(tmp_path, capsys):
    stats_dir = fixtures.write_fixture_stats(tmp_path)
    distributions = fixtures.make_distributions()
    distributions["aspect_ratio"]["counts"][0] = float("nan")
    distributions["words_per_text"]["edges"] = "many"
    open(os.path.join(stats_dir, read_stats.DISTRIBUTIONS_FILE), "w").write(json.dumps(distributions))
    assert audit.main([str(tmp_path)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    page = open(os.path.join(stats_dir, read_stats.REPORT_FILE), encoding="utf-8").read()
    assert "aspect_ratio is not shown: distributions.json is damaged there (aspect_ratio.counts[0]: NaN" in page
    assert "words_per_text is not shown" in page
    assert 'alt="shorter_side' in page or "shorter_side" in page  # an undamaged entry is still drawn
    assert page.count("<img") >= 3


def test_damaged_lines_of_the_jsonl_stats_are_skipped_and_counted(tmp_path):
    stats_dir = fixtures.write_fixture_stats(tmp_path, omit=fixtures.NO_PLOTS)
    with open(os.path.join(stats_dir, read_stats.SAMPLES_FILE), "a") as handle:
        handle.write("[" * 100_000 + "\n")  # nested past the bound
        handle.write('{"reason": 7}\n')  # a number where the reason belongs
    with open(os.path.join(stats_dir, read_stats.NEAR_DUPLICATES_FILE), "a") as handle:
        handle.write('{"key": "k", "index_set": "s", "index_key": "i", "cosine": NaN}\n')
    loaded = read_stats.load_stats(str(tmp_path))
    assert loaded["unreadable"][read_stats.SAMPLES_FILE].startswith("2 unreadable line(s) skipped")
    assert ".cosine: NaN, not a finite number" in loaded["unreadable"][read_stats.NEAR_DUPLICATES_FILE], loaded["unreadable"]
    assert loaded["samples"] and loaded["near_duplicates"]


def test_a_damaged_concepts_file_is_said_in_the_report(tmp_path):
    stats_dir = fixtures.write_fixture_stats(tmp_path, omit=fixtures.NO_PLOTS)
    open(os.path.join(stats_dir, read_stats.CONCEPTS_FILE), "w").write('{"classes": [], "splits": 3}')
    loaded = read_stats.load_stats(str(tmp_path))
    assert loaded["concepts"] is None and "splits" in loaded["unreadable"][read_stats.CONCEPTS_FILE]


def test_the_command_line_prints_no_traceback_for_a_deep_what_if(tmp_path):
    """The light twin of the in-process cases through ``python -m``: the parser's recursion never runs out."""
    stats_dir = fixtures.write_fixture_stats(tmp_path, omit=fixtures.NO_PLOTS)
    path = _write_what_if(stats_dir, "nested 100,000 deep")
    done = subprocess.run([sys.executable, "-m", "pipeline.audit", str(tmp_path), "--what_if",
                           "max_images_per_text=20"], cwd=repo_root.ROOT, capture_output=True, text=True,
                          env=dict(os.environ, ALT_TEXT_CORPUS_LOG_DIR=str(tmp_path / "logs")))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {path}: ") and "Traceback" not in done.stderr
