"""``--nsfw_accelerator``: the NSFW score as its own RunInference step writes exactly what the fused build writes.

The planted records (a repeat pair, a picture too small to score) with the
NSFW stage at a cut that rejects two of the four distinct pictures
(open_nsfw fp32 scores them 0.00018 and 0.00044; the others 0.00016 and
0.00013), an evaluation set holding one kept picture (a match, a pairs
report) and a pair model after the verdict: built fused, then with the
option, on the FnApiRunner (the CPU provider). Every file but the build's
own names and command line must be the same bytes. fp32 in both: with the
option ``auto`` is the accelerator's fp32 (``pipeline.stages.nsfw_inference``).
Then Dataflow's translation of the job with the option (``--dry_run=true``):
the scoring step carries the accelerator hint, nothing else does.
"""

import contextlib
import io
import pathlib

import pytest

from common.corpus_dir import resolve
from pipeline.build import dry_run, launcher
from pipeline.build.options import UsageError
from tests.pipeline.build.test_reuse import assert_same_corpus, no_work, read_note
from tests.pipeline.write.test_candidate_table import photo, write_planted

ACCELERATOR = "type:nvidia-tesla-t4;count:1;install-nvidia-driver"
ARGS = ["--set", "vocab_size=0", "--set", "nsfw_precision=fp32", "--set", "nsfw_threshold=0.00017",
        "--model_score", "tests.pipeline.score_models:colour_words"]
DATAFLOW = ["--runner", "DataflowRunner", "--project", "my-project", "--region", "us-central1",
            "--temp_location", "gs://my-bucket/tmp", "--dry_run=true"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("nsfw_accelerator")
    evals = root / "eval"
    evals.mkdir()
    (evals / "4.jpg").write_bytes(photo(4))
    return root, str(write_planted(root / "in")), ["--eval_images", f"test={evals}"]


def build(root, pattern, name, *args):
    launcher.run(["--input", pattern, "--output", str(root / name), *ARGS, *args])
    return pathlib.Path(resolve(str(root / name)))


@pytest.fixture(scope="module")
def fused(planted):
    root, pattern, evals = planted
    return build(root, pattern, "fused", *evals)


def test_the_scoring_step_writes_what_the_fused_build_writes(planted, fused):
    root, pattern, evals = planted
    split = build(root, pattern, "split", *evals, "--nsfw_accelerator", ACCELERATOR)
    assert_same_corpus(fused, split)
    funnel = (split / "stats" / "funnel.json").read_text()
    assert '"nsfw/pornographic": 2' in funnel and "scored by open_nsfw fp32" in funnel
    assert '"near_duplicate_eval/test": 1' in funnel


def test_a_rebuild_with_the_scoring_step_reuses_the_old_scores(planted, fused, monkeypatch):
    """The step takes the fused build's scores (its scorer made them): nothing is scored or decoded again."""
    root, pattern, evals = planted
    no_work(monkeypatch)
    reused = build(root, pattern, "reused", *evals, "--nsfw_accelerator", ACCELERATOR, "--reuse", str(root / "fused"))
    assert_same_corpus(fused, reused)
    assert "6 records' facts reused, 0 derived again" in read_note(reused)


def test_a_malformed_or_unusable_accelerator_is_one_line(planted):
    root, pattern, _ = planted
    base = ["--input", pattern, "--output", str(root / "never"), *ARGS]
    for value, said in (("count:1", "names no accelerator type"), ("type:t4;count:0", "count:0"),
                        ("type:t4;gpus:2", "'gpus:2' is not one of"), ("type:t4;type:l4", "type is given twice")):
        with pytest.raises(UsageError, match=f"^--nsfw_accelerator '{value}': .*{said}"):
            launcher.run([*base, "--nsfw_accelerator", value])
    with pytest.raises(UsageError, match="NSFW stage is off"):
        launcher.run([*base, "--set", "nsfw_threshold=1.0", "--nsfw_accelerator", ACCELERATOR])
    assert not (root / "never").exists()


def test_dry_run_shows_the_accelerator_on_the_scoring_step_only(planted, monkeypatch):
    root, pattern, _ = planted
    jobs = []
    real = dry_run.build_job
    monkeypatch.setattr(dry_run, "build_job", lambda *a, **k: jobs.append(real(*a, **k)) or jobs[-1])
    printed = []
    for extra in ([], ["--nsfw_accelerator", ACCELERATOR]):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            launcher.main(["--input", pattern, "--output", str(root / "dry"), *ARGS, *extra, *DATAFLOW])
        printed.append(out.getvalue())
    fused, split = (dry_run.accelerators(job.proto) for job in jobs)
    assert fused == {} and "on accelerator workers" not in printed[0]
    assert split and set(split.values()) == {ACCELERATOR}
    assert all(name.startswith("FirstPass/ScoreNsfw/RunInference/") for name in split), sorted(split)
    assert any(name.endswith("BeamML_RunInference") for name in split), sorted(split)
    assert f"on accelerator workers ({ACCELERATOR}): {len(split)} step(s) of FirstPass/ScoreNsfw/RunInference" \
        in printed[1]
