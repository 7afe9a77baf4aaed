"""python -m pipeline.select: a selection over the candidate table written as a new committed corpus.

One tiny real build (the candidate table's planted inputs) is selected from
by an expression and by keys; the new corpus holds exactly the chosen
records, with the source corpus's bytes, in the same splits, and its own
funnel and table account for them. Bad selections end in one line and touch
nothing.
"""

import glob
import json
import os
import shutil

import pytest

from common import tfrecord_io
from common.corpus_dir import resolve
from pipeline.build import launcher
from pipeline.funnel import candidate_counts
from pipeline.select import selector
from pipeline.write.candidate_table import read_table
from tests.pipeline.build.test_build_safety import QUICK, snapshot
from tests.pipeline.write.test_candidate_table import write_planted

FEATURES = ("key", "image", "texts", "url", "width", "height", "sha256")


def records(version_dir):
    """``{key: (split, {feature: bytes})}`` of every record in a version's TFRecord shards."""
    found = {}
    for path in sorted(glob.glob(f"{version_dir}/*.tfrecord-*")):
        split = path.rsplit("-", 4)[-4].split(".")[0]
        with open(path, "rb") as handle:
            for payload in tfrecord_io.read_frames(handle):
                example = tfrecord_io.decode_example(payload, names=FEATURES)
                values = {name: [bytes(v) if isinstance(v, (bytes, memoryview)) else v for v in example[name]]
                          for name in FEATURES}
                found[values["key"][0].decode()] = (split, values)
    return found


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("select")
    pattern = write_planted(root / "in")
    launcher.run(["--input", str(pattern), "--output", str(root / "corpus"), *QUICK])
    return root


def test_a_where_selection_writes_exactly_its_records_with_the_same_bytes(source):
    selector.select([str(source / "corpus"), "--output", str(source / "long"), "--where", "words >= 7"])
    table = read_table(resolve(str(source / "corpus"))).to_pandas()
    chosen = set(table[(table["words"] >= 7) & table["split"].notna()]["key"])
    assert 0 < len(chosen) < (table["split"].notna()).sum()
    before, after = records(resolve(str(source / "corpus"))), records(resolve(str(source / "long")))
    assert set(after) == chosen
    assert all(after[key] == before[key] for key in chosen)  # same split, same stored picture and features


def test_a_selection_is_a_committed_corpus_whose_table_accounts_for_it(source):
    selector.select([str(source / "corpus"), "--output", str(source / "sel"), "--where", "width > 0"])
    version = resolve(str(source / "sel"))
    funnel = json.loads(open(f"{version}/stats/funnel.json").read())
    summary = json.loads(open(f"{version}/{candidate_counts.SUMMARY_FILE}").read())
    assert funnel["conserved"] and funnel["input"] == summary["rows"] == sum(funnel["written"].values()) == 4
    assert candidate_counts.table_problems(summary, funnel) == []
    manifest = json.loads(open(f"{version}/manifest.json").read())
    assert manifest["candidates"]["rows"] == 4
    request = json.loads(open(f"{version}/_BUILD.json").read())
    assert request["selected_from"]["selection"] == {"where": "width > 0"}


def test_an_empty_selection_writes_a_table_file_with_the_columns_and_no_rows(source, tmp_path):
    import pandas as pd

    from pipeline.write.candidate_table import SCHEMA

    selector.select([str(source / "corpus"), "--output", str(tmp_path / "none"), "--where", "words > 10000"])
    version = resolve(str(tmp_path / "none"))
    assert records(version) == {}
    table = pd.read_parquet(f"{version}/stats/candidates")  # the docs' snippet
    assert list(table.columns) == SCHEMA.names and len(table) == 0
    assert len(table[table["split"].isna()].groupby("reason").size()) == 0
    summary = json.loads(open(f"{version}/{candidate_counts.SUMMARY_FILE}").read())
    assert summary["rows"] == 0 and [entry["rows"] for entry in summary["files"].values()] == [0]


def test_a_keys_selection_writes_exactly_those_keys(source):
    table = read_table(resolve(str(source / "corpus"))).to_pandas()
    keys = sorted(table[table["split"].notna()]["key"])[:2]
    (source / "keys.txt").write_text("\n".join(keys) + "\n")
    selector.select([str(source / "corpus"), "--output", str(source / "two"), "--keys", str(source / "keys.txt")])
    assert sorted(records(resolve(str(source / "two")))) == keys


@pytest.mark.parametrize("choice,message", [
    (["--where", "colour == 'red'"], "--where \"colour == 'red'\": name 'colour' is not defined"),
    (["--where", "words + 1"], "not a condition"),
    (["--keys", "KEYS:0123456789abcdef01234567"], "1 key(s) are not in the corpus's candidate table"),
    (["--keys", "KEYS:REJECTED"], "1 key(s) were rejected by the build"),
    (["--keys", "KEYS:"], "holds no key"),
])
def test_a_bad_selection_is_one_line_and_touches_nothing(source, tmp_path, capsys, choice, message):
    if choice[0] == "--keys":
        keys = choice[1].split(":", 1)[1]
        if keys == "REJECTED":
            table = read_table(resolve(str(source / "corpus"))).to_pandas()
            written = set(table[table["split"].notna()]["key"])  # a repeat's key is written once: selectable
            keys = next(k for k in table[table["split"].isna()]["key"] if k not in written)
        (tmp_path / "keys.txt").write_text(keys)
        choice = ["--keys", str(tmp_path / "keys.txt")]
    with pytest.raises(SystemExit) as exited:
        selector.main([str(source / "corpus"), "--output", str(tmp_path / "new"), *choice])
    assert exited.value.code == selector.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "new").exists()


def test_a_corpus_without_a_table_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        selector.main([str(tmp_path), "--output", str(tmp_path / "new"), "--where", "words > 1"])
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("state", ["no such path", "an empty directory", "a version never committed"])
def test_a_source_that_is_not_a_committed_corpus_is_one_line_exit_2(source, tmp_path, capsys, state):
    corpus = tmp_path / "corpus"
    if state == "an empty directory":
        corpus.mkdir()
    elif state == "a version never committed":
        shutil.copytree(source / "corpus", corpus)
        os.remove(corpus / "dataset_info.json")  # the commit object: a build killed before its commit
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exited:
        selector.main([str(corpus), "--output", str(tmp_path / "new"), "--where", "words > 1"])
    assert exited.value.code == selector.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {corpus}") and "selection failed" not in err, err
    assert "--allow_incomplete" not in err, err  # select has no such option
    assert snapshot(tmp_path) == before and not (tmp_path / "new").exists()


def test_a_non_empty_output_is_refused_naming_no_option_select_lacks(source, tmp_path, capsys):
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exited:
        selector.main([str(source / "corpus"), "--output", str(tmp_path / "new"), "--where", "words > 1"])
    assert exited.value.code == selector.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not empty" in err and "--overwrite" not in err, err
    assert snapshot(tmp_path / "new") == {"notes.txt": b"mine"}


def test_a_selection_copies_re_encoded_pictures_from_the_source_shards(tmp_path, monkeypatch):
    """Pictures re-encoded by the build (output_max_side below their size) are copied, never made again: the
    selection succeeds with the picture maker disabled, and writes the build's bytes."""
    from pipeline.write import second_pass

    pattern = write_planted(tmp_path / "in")
    launcher.run(["--input", str(pattern), "--output", str(tmp_path / "corpus"), *QUICK,
                  "--set", "output_max_side=128"])
    before = records(resolve(str(tmp_path / "corpus")))
    assert {features["width"][0] for _, features in before.values()} == {128}  # re-encoded by the build

    def no_decoding(*_):
        raise AssertionError("a selection decoded a picture")

    monkeypatch.setattr(second_pass, "read_header", no_decoding)
    monkeypatch.setattr(second_pass, "stored_picture", no_decoding)
    selector.select([str(tmp_path / "corpus"), "--output", str(tmp_path / "sel"), "--where", "width > 0"])
    assert records(resolve(str(tmp_path / "sel"))) == before


@pytest.fixture(scope="module")
def rebuilt7(source):
    """The source's input rebuilt with --set min_words=7 (once for the tests that compare a selection with it)."""
    launcher.run(["--input", str(source / "in" / "*.parquet"), "--output", str(source / "rebuilt7"), *QUICK,
                  "--set", "min_words=7"])
    return resolve(str(source / "rebuilt7"))


def test_a_where_on_a_rules_measure_writes_what_a_rebuild_with_that_threshold_writes(source, rebuilt7):
    """words >= 7 over the table, and a rebuild with --set min_words=7: the same keys in the same splits, the same
    bytes (a per-record text rule, with the corpus-wide counts over the raw pool, which it does not change)."""
    selector.select([str(source / "corpus"), "--output", str(source / "seven"), "--where", "words >= 7"])
    rebuilt, selected = records(rebuilt7), records(resolve(str(source / "seven")))
    assert len(selected) == 2 and selected == rebuilt


def test_a_set_selection_writes_what_a_rebuild_with_the_same_set_writes(source, rebuilt7):
    """--set min_words=7 re-applied to the table: the same written records and bytes as the rebuild, and the
    records it now rejects under the rebuild's reasons."""
    selector.select([str(source / "corpus"), "--output", str(source / "set7"), "--set", "min_words=7"])
    rebuilt, selected = rebuilt7, resolve(str(source / "set7"))
    assert records(selected) == records(rebuilt) and len(records(selected)) == 2
    fate = {}
    for name, version in (("rebuilt", rebuilt), ("selected", selected)):
        table = read_table(version).to_pandas()
        fate[name] = {(r.source, r.ordinal): r.split if isinstance(r.split, str) else r.reason
                      for r in table.itertuples()}
    assert fate["selected"] and all(fate["rebuilt"][place] == got for place, got in fate["selected"].items())
    assert sum(got == "text_length/too_few_words" for got in fate["selected"].values()) == 3


def test_a_selection_of_a_selection_records_and_checks_the_thresholds_its_records_obey(source, tmp_path, capsys):
    """--set min_words=5, then --set max_words=19 on that: each new corpus's recorded config (its _BUILD.json's
    command line, its funnel's preset) says min_words=5, so a later --set min_words=4 is looser, and refused;
    7 is tighter, and its records hold 7 words or more."""
    selector.select([str(source / "corpus"), "--output", str(tmp_path / "five"), "--set", "min_words=5"])
    selector.select([str(tmp_path / "five"), "--output", str(tmp_path / "capped"), "--set", "max_words=19"])
    for name, max_words in (("five", 20), ("capped", 19)):
        version = resolve(str(tmp_path / name))
        preset = json.loads(open(f"{version}/stats/funnel.json").read())["preset"]
        request = json.loads(open(f"{version}/_BUILD.json").read())
        config, _ = selector.source_config(request, str(tmp_path / "elsewhere"), [])
        recorded = config.preset._by_name()
        assert (preset["min_words"], preset["max_words"]) == (recorded["min_words"], recorded["max_words"]) == (
            5, max_words), name
    with pytest.raises(SystemExit) as exited:
        selector.main([str(tmp_path / "capped"), "--output", str(tmp_path / "four"), "--set", "min_words=4"])
    assert exited.value.code == selector.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "looser than the build's min_words=5" in err, err
    assert not (tmp_path / "four").exists()
    selector.select([str(tmp_path / "capped"), "--output", str(tmp_path / "seven"), "--set", "min_words=7"])
    seven = resolve(str(tmp_path / "seven"))
    assert json.loads(open(f"{seven}/stats/funnel.json").read())["preset"]["min_words"] == 7
    assert records(seven) and all(len(features["texts"][0].split()) >= 7 for _, features in records(seven).values())


@pytest.mark.parametrize("item,message", [
    ("min_shorter_side=300", "cannot answer this rule"),
    ("min_words=2", "looser than the build's min_words=3"),
    ("nsfw_threshold=0.3", "did not run the NSFW stage"),
    ("min_words=many", "min_words"),
])
def test_a_set_the_table_cannot_answer_is_one_line(source, tmp_path, capsys, item, message):
    with pytest.raises(SystemExit) as exited:
        selector.main([str(source / "corpus"), "--output", str(tmp_path / "new"), "--set", item])
    assert exited.value.code == selector.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_an_nsfw_set_selection_writes_what_a_rebuild_with_the_same_set_writes(tmp_path):
    """The NSFW scorer on (open_nsfw): a threshold between the planted pictures' scores, re-applied to the table,
    gives the rebuild's records and reasons. (Slow: three builds with the scorer; the min_words test is its twin.)"""
    pattern = write_planted(tmp_path / "in")
    launcher.run(["--input", str(pattern), "--output", str(tmp_path / "corpus"), "--set", "vocab_size=0"])
    table = read_table(resolve(str(tmp_path / "corpus"))).to_pandas()
    scores = sorted(table[table["split"].notna()]["nsfw_score"])
    threshold = (scores[1] + scores[2]) / 2  # two of the four written pictures at or above it
    launcher.run(["--input", str(pattern), "--output", str(tmp_path / "rebuilt"), "--set", "vocab_size=0",
                  "--set", f"nsfw_threshold={threshold!r}"])
    selector.select([str(tmp_path / "corpus"), "--output", str(tmp_path / "sel"),
                     "--set", f"nsfw_threshold={threshold!r}"])
    rebuilt, selected = resolve(str(tmp_path / "rebuilt")), resolve(str(tmp_path / "sel"))
    assert records(selected) == records(rebuilt) and len(records(selected)) == 2
    fate = {}
    for name, version in (("rebuilt", rebuilt), ("selected", selected)):
        frame = read_table(version).to_pandas()
        fate[name] = {(r.source, r.ordinal): r.split if isinstance(r.split, str) else r.reason
                      for r in frame.itertuples()}
    assert all(fate["rebuilt"][place] == got for place, got in fate["selected"].items())
    assert sum(got == "nsfw/pornographic" for got in fate["selected"].values()) == 2
