"""The what-if of the model-score cuts (threshold and top fraction) against real rebuilds of a small scored pool.

The model is ``tests.pipeline.score_models:colour_words`` (a registered pair model, cheap, no JAX); the pool
is the model-score stage tests' (162 pairs, ties, one alt-text on 12 pictures).
"""

import json
import os

import pytest

import repo_root
from pipeline.audit import auditor as audit
from pipeline.audit import what_if_section
from pipeline.build import launcher
from pipeline.what_if import answer as wi
from pipeline.what_if import rules
from tests.pipeline.stages.test_model_score_stage import MODEL, QUICK, write_pairs
from tests.pipeline.what_if.test_what_if import predicted, stage_counts

from corpus_paths import committed


def build(root, output, *sets):
    os.environ["PYTHONPATH"] = repo_root.ROOT
    extra = [arg for value in sets for arg in ("--set", value)]
    return launcher.run(["--input", str(root / "in" / "*.parquet"), "--output", str(root / output), *QUICK,
                         "--model_score", MODEL, *extra])


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """The pool built with the model and a threshold: (root, committed output, funnel)."""
    root = tmp_path_factory.mktemp("what_if_scored")
    write_pairs(root / "in")
    funnel = build(root, "built", "model_score_threshold=0.2")
    return root, committed(root / "built"), funnel


def test_the_scores_histogram_gives_back_the_built_funnel(scored):
    _, output, funnel = scored
    doc = json.loads((output / "stats" / rules.WHAT_IF_FILE).read_text())
    built = stage_counts(funnel)
    conds = wi.rule_conditions("model_score", doc["built"], doc)
    assert conds == [(">=", 0.2)]
    ended = {}
    for cls, pairs in doc["rules"]["model_score"].items():
        for b, n in pairs:
            where = cls if rules.bin_keeps(rules.COSINES, b, conds) else wi._earliest("model_score", cls, doc["order"])
            ended[where] = ended.get(where, 0) + n
    assert ended["model_score"] == built["model_score"] > 0
    assert ended["written"] == built["written"]
    assert ended["images_per_text"] == built["images_per_text"] > 0  # the shared alt-text, scored above the cut


@pytest.mark.parametrize("assignments, claim", [
    (["model_score_threshold=0.5"], "exact"),     # on the grid's edges: exact
    pytest.param(["model_score_threshold=-1"], "exact", marks=pytest.mark.slow),  # off
    (["model_score_top_fraction=0.5"], "estimate"),  # the cut falls inside a bin of the scores
    pytest.param(["model_score_threshold=0.5", "model_score_top_fraction=0.3"], "estimate", marks=pytest.mark.slow),
])
def test_the_score_what_if_equals_the_rebuild(scored, tmp_path, assignments, claim):
    root, output, funnel = scored
    counts, result = predicted(output, assignments)
    assert sum(counts.values()) == funnel["input"]
    assert counts != stage_counts(funnel)
    assert ("exact" if result.bound == 0 else "estimate") == claim, result.bound_parts
    actual = stage_counts(build(root, tmp_path.name, *assignments))
    off = {stage: counts[stage] - actual.get(stage, 0) for stage in counts if counts[stage] != actual.get(stage, 0)}
    assert max(map(abs, off.values()), default=0) <= result.bound, (off, result.bound_parts)


def test_the_fraction_cut_is_read_off_the_histogram():
    hist = {"written": {rules.COSINES.bin(0.1005): 4, rules.COSINES.bin(0.3005): 4},
            "images_per_text": {rules.COSINES.bin(0.3005): 2}}
    assert rules.fraction_cut(hist, 1.0) is None
    low_of_03 = rules.COSINES.ends(rules.COSINES.bin(0.3005))[0]
    assert rules.fraction_cut(hist, 0.6) == low_of_03  # the 6 highest: exactly the 0.3 bin
    inside = rules.fraction_cut(hist, 0.8)  # 8 of 10: two of the 0.1 bin's four
    low, high = rules.COSINES.ends(rules.COSINES.bin(0.1005))
    assert low < inside < high and inside == pytest.approx((low + high) / 2)
    assert rules.fraction_cut(hist, 0.0) > rules.COSINES.ends(rules.COSINES.bin(0.3005))[1]


def test_the_command_and_the_explorer_answer_the_score_cuts(scored, capsys):
    _, output, funnel = scored
    assert audit.main([str(output), "--what_if", "model_score_top_fraction=0.5"]) == 0
    assert capsys.readouterr().out.startswith("what if model_score_top_fraction=0.5 (built 1):")
    doc = wi.load(str(output / "stats"))
    for param in ("model_score_threshold", "model_score_top_fraction"):
        points = what_if_section.curve(param, doc, funnel)
        assert len(points) > 10
        written = [w for _, w, _ in points]
        assert written == (sorted(written, reverse=True) if param.endswith("threshold") else sorted(written))
    html = what_if_section.section(doc, funnel)
    assert 'alt="written vs model_score_threshold"' in html and 'alt="written vs model_score_top_fraction"' in html


def test_without_a_model_the_score_cuts_are_not_answered(scored, tmp_path, capsys):
    root, _, _ = scored
    launcher.run(["--input", str(root / "in" / "*.parquet"), "--output", str(tmp_path / "plain"), *QUICK])
    assert audit.main([str(tmp_path / "plain"), "--what_if", "model_score_threshold=0.3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model_score" in err and "Traceback" not in err
