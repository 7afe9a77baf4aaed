"""The evidence harness's figures (``benchmarks.model_score_figures``) and its command line; the runs
themselves are a benchmark, not a test."""

import json
import subprocess
import sys

from benchmarks import model_score_figures as figures


def test_removal_counts_the_pairs_that_reach_the_stage_per_pairing_and_kind():
    rows = [{"pipeline_key": "a", "pairing": "mismatched", "kind": "another_image"},
            {"pipeline_key": "b", "pairing": "mismatched", "kind": "wrong_count"},
            {"pipeline_key": "c", "pairing": "mismatched", "kind": "boilerplate"},  # never scored: did not reach
            {"pipeline_key": "d", "pairing": "clean", "kind": "clean"},
            {"pipeline_key": "e", "pairing": "clean", "kind": "clean"}]
    found = figures.removal(rows, {"a": 0.0, "b": 0.3, "d": 0.1, "e": 0.5}, 0.2)
    assert found["mismatched"] == {"reach": 2, "removed": 1, "share": 0.5}
    assert found["clean"] == {"reach": 2, "removed": 1, "share": 0.5}
    assert found["kind:boilerplate"] == {"reach": 0, "removed": 0, "share": None}
    assert found["kind:wrong_count"]["removed"] == 0


def _run(work, name, step, r1, knn):
    run = work / "runs" / name / "eval"
    run.mkdir(parents=True)
    metrics = {"heldout": {"i2t_R@1": r1, "t2i_R@1": r1 + 0.01, "i2t_R@5": 0.5, "t2i_R@5": 0.5},
               "knn": {"top1": knn}, "zeroshot": {"top1": 0.3}}
    (run / "evidence.json").write_text(json.dumps({"step": step, "evals": {
        k: {"metrics": v} for k, v in metrics.items()}}))


def test_arms_get_mean_and_spread_and_seeds_are_paired(tmp_path):
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "manifest.jsonl").write_text(json.dumps(
        {"pipeline_key": "a", "pairing": "clean", "kind": "clean", "part": "pool"}) + "\n")
    for seed, (r_align, r_ms) in enumerate([(0.30, 0.34), (0.32, 0.33), (0.28, None)]):
        _run(tmp_path, f"align_s{seed}", 1200, r_align, 0.5)
        if r_ms is not None:
            _run(tmp_path, f"ms_s{seed}", 1200, r_ms, 0.6)
    found = figures.summarize(str(tmp_path), [0, 1, 2])
    assert found["arms"]["align"]["i2t_R@1"] == {"n": 3, "mean": 0.3, "sd": 0.02}
    assert found["arms"]["ms"]["i2t_R@1"]["n"] == 2
    paired = found["paired"]["ms-align"]
    assert set(paired["per_seed"]) == {"0", "1"}  # seed 2 has no ms run: not paired
    assert paired["per_seed"]["0"]["i2t_R@1"] == 0.04 and paired["per_seed"]["1"]["i2t_R@1"] == 0.01
    assert paired["i2t_R@1"]["mean"] == 0.025 and paired["knn_top1"]["mean"] == 0.1
    assert "align-none" not in found["paired"] and found["corpora"]["ms"] is None
    picture = figures.plot(found, str(tmp_path / "evidence.png"))  # the arms alone: no scoring build yet
    assert picture and (tmp_path / "evidence.png").read_bytes().startswith(b"\x89PNG")


def test_no_picture_before_anything_finished(tmp_path):
    assert figures.plot({}, str(tmp_path / "x.png")) is None and not (tmp_path / "x.png").exists()


def test_the_command_line_errors_are_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.model_score_evidence", "--work", str(tmp_path),
                           "--only", "pool,everything"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--only names steps of" in done.stderr
