"""The audit's what-if against real rebuilds of the sample: exact where it says exact, within its bound elsewhere."""

import json

import pytest

from conftest import build_args
from corpus_paths import committed
from pipeline.audit import auditor as audit
from pipeline.build import launcher
from pipeline.what_if import answer as wi
from pipeline.what_if.rules import WHAT_IF_FILE
from tests.pipeline.build.test_build_safety import QUICK
from tests.pipeline.funnel.test_verdict_accounting import candidates


def stage_counts(funnel):
    counts = {s["stage"]: sum(s["rejected"].values()) for s in funnel["stages"] if s["ran"]}
    counts["written"] = sum(funnel["written"].values())
    return counts


def predicted(output, assignments):
    stats = output / "stats"
    funnel = json.loads((stats / "funnel.json").read_text())
    doc = wi.load(str(stats))
    result = wi.what_if(doc, funnel, wi.parse_assignments(assignments, doc["built"]))
    counts = {stage: result.rejected.get(stage, 0) for stage in stage_counts(funnel) if stage != "written"}
    counts["written"] = result.written
    return counts, result


def rebuilt(sample_dir, tmp_path, assignments):
    out = tmp_path / "rebuilt"
    extra = [arg for assignment in assignments for arg in ("--set", assignment)]
    return stage_counts(launcher.run(build_args(sample_dir, out, *extra)))


def check_against_rebuild(sample_build, sample_dir, tmp_path, assignments, claim):
    output, built_funnel = sample_build
    check(output, built_funnel, assignments, claim, lambda: rebuilt(sample_dir, tmp_path, assignments))


def check(output, built_funnel, assignments, claim, rebuild):
    """The what-if of ``assignments`` over a built corpus against ``rebuild()``'s stage counts."""
    counts, result = predicted(output, assignments)
    assert sum(counts.values()) == built_funnel["input"]  # the what-if conserves records
    assert counts != stage_counts(built_funnel), "the threshold must change the funnel to check anything"
    assert ("exact" if result.bound == 0 else "estimate") == claim, result.bound_parts
    actual = rebuild()
    off = {stage: counts[stage] - actual.get(stage, 0) for stage in counts if counts[stage] != actual.get(stage, 0)}
    assert max(map(abs, off.values()), default=0) <= result.bound, (off, result.bound_parts)


# A rebuild of the sample is a minute of CPU: CI's integration run. Its light twin below takes the same path
# (the what-if, a rebuild with the limit, the comparison) on sixteen records.
@pytest.mark.integration
def test_a_sharing_limit_what_if_equals_the_rebuild(sample_build, sample_dir, tmp_path):
    check_against_rebuild(sample_build, sample_dir, tmp_path, ["max_images_per_text=20"], "exact")


@pytest.fixture(scope="module")
def shared_logo(tmp_path_factory):
    """Twelve images under one alt-text and four ordinary pairs, built: (root, committed output, funnel)."""
    root = tmp_path_factory.mktemp("what_if_shared")
    pattern = candidates(root / "in")
    funnel = launcher.run(["--input", str(pattern), "--output", str(root / "built"), *QUICK])
    return root, committed(root / "built"), funnel


def test_a_sharing_limit_what_if_equals_the_rebuild_of_a_small_pool(shared_logo):
    root, output, funnel = shared_logo
    assert stage_counts(funnel)["images_per_text"] == 12  # the built limit (10) rejects the twelve

    def rebuild():
        args = ["--input", str(root / "in" / "*.parquet"), "--output", str(root / "rebuilt"), *QUICK]
        return stage_counts(launcher.run(args + ["--set", "max_images_per_text=20"]))

    check(output, funnel, ["max_images_per_text=20"], "exact", rebuild)


@pytest.mark.slow
@pytest.mark.parametrize("assignments, claim", [
    (["vocab_size=300"], "exact"),
    (["max_texts_per_image=1500"], "exact"),
    (["min_shorter_side=300"], "exact"),
    (["max_aspect_ratio=2"], "exact"),
    (["max_words=10"], "exact"),
    (["max_word_repetition=0.1"], "exact"),
    (["min_words=2"], "estimate"),  # the records it lets through were never decoded
    (["vocab_size=300", "max_images_per_text=3"], "estimate"),
])
def test_what_if_equals_the_rebuild(sample_build, sample_dir, tmp_path, assignments, claim):
    check_against_rebuild(sample_build, sample_dir, tmp_path, assignments, claim)


def test_the_histograms_give_back_the_built_funnel(sample_build):
    """Under the built thresholds every rule's classes are where the records ended: nothing moves."""
    output, built_funnel = sample_build
    doc = json.loads((output / "stats" / WHAT_IF_FILE).read_text())
    built = stage_counts(built_funnel)
    assert set(doc["rules"]) == {"image_size", "image_aspect", "text_length", "text_repetition", "nsfw",
                                 "texts_per_image", "images_per_text", "rare_ngrams"}
    for stage, classes in doc["rules"].items():
        rule = wi.rules.RULES_BY_STAGE[stage]
        conds = wi.rule_conditions(stage, doc["built"], doc)
        ended = {}
        for cls, pairs in classes.items():
            for b, n in pairs:
                kept = b == wi.ABOVE_REACH or wi.rules.bin_keeps(rule.grid, b, conds)
                where = cls if kept else wi._earliest(stage, cls, doc["order"])
                ended[where] = ended.get(where, 0) + n
        for where, n in ended.items():
            assert n <= built[where], (stage, where)
        assert ended.get("written") == built["written"], stage  # every written record is measured by every rule
        if rule.corpus:
            assert ended.get(stage, 0) == built[stage]
        if stage == "nsfw":  # every record that reached the stage was scored (open_nsfw is a base requirement)
            later = doc["order"][doc["order"].index("nsfw"):] + ["written"]
            assert {s: ended.get(s, 0) for s in later} == {s: built.get(s, 0) for s in later}, stage
        if stage in ("image_size", "image_aspect"):  # every record that reached image_size has its size measured
            later = doc["order"][doc["order"].index("image_size"):] + ["written"]
            assert {s: ended.get(s, 0) for s in later} == {s: built.get(s, 0) for s in later}, stage


def test_the_vocabulary_cut_is_the_builds(sample_build):
    from filters.ngram_vocab import vocabulary_cut

    output, _ = sample_build
    doc = json.loads((output / "stats" / WHAT_IF_FILE).read_text())
    facts = doc["rare_ngrams"]
    table = dict(map(tuple, facts["count_of_counts"]))
    above = facts["ngrams_at_or_above_reach"]
    table[10 ** 9] = above  # the counts above the reach only add up: one stands for them all
    for vocab_size in range(above + 1, above + 800, 7):
        for min_count in (0, 2, 5):
            values = dict(doc["built"], vocab_size=vocab_size, min_ngram_count=min_count)
            assert wi.ngram_cut(doc, values) == vocabulary_cut(table, vocab_size, min_count)


@pytest.mark.parametrize("assignment, message", [
    ("max_images_per_text=500", "exactly up to 100"),
    ("vocab_size=5", "smallest answerable vocab_size"),
    ("num_clusters=3", "cannot change 'num_clusters'"),
    ("min_words", "takes PARAM=VALUE"),
    ("min_words=many", "min_words: must be an integer"),
    ("min_words=30", "must be at most max_words"),
])
def test_a_what_if_it_cannot_answer_is_one_line(sample_build, capsys, assignment, message):
    output, _ = sample_build
    assert audit.main([str(output), "--what_if", assignment]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_command_prints_the_what_if_funnel(sample_build, capsys):
    output, _ = sample_build
    assert audit.main([str(output), "--what_if", "max_images_per_text=20"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("what if max_images_per_text=20 (built 10):")
    assert "exact: a rebuild with these thresholds gives these figures" in out


@pytest.mark.parametrize("damage", [
    lambda doc: doc["rules"]["images_per_text"].update({"written": [[2, "many"]]}),
    lambda doc: doc["rules"].update({"no_such_rule": {}}),
    lambda doc: doc.pop("order"),
])
def test_a_damaged_what_if_file_is_one_line(sample_build, tmp_path, capsys, damage):
    import shutil

    output, _ = sample_build
    corpus = tmp_path / "corpus"
    shutil.copytree(output, corpus)
    doc = json.loads((corpus / "stats" / WHAT_IF_FILE).read_text())
    damage(doc)
    (corpus / "stats" / WHAT_IF_FILE).write_text(json.dumps(doc))
    assert audit.main([str(corpus), "--what_if", "max_images_per_text=20"]) == 2
    err = capsys.readouterr().err
    assert WHAT_IF_FILE in err and err.count("\n") == 1 and "Traceback" not in err
