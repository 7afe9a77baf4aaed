"""``trainer.evaluate`` on a trained checkpoint: the run's own numbers back, and other eval sets."""

import json
import os

import pytest

from trainer import evaluate


def last_logged_evals(workdir):
    """The eval metrics the run logged at its last eval point: {"name/metric": value}."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    evals = [row for row in rows if any(k.startswith("retrieval/") for k in row)]
    return evals[-1]


def test_evaluate_reproduces_the_numbers_the_run_logged_at_its_last_step(tiny_trained, tmp_path, capsys):
    workdir, final = tiny_trained
    output = tmp_path / "result.json"
    assert evaluate.main([workdir, "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(output.read_text())
    logged = last_logged_evals(workdir)
    assert result["step"] == logged["step"] == final["step"] == 2
    assert sorted(result["evals"]) == ["knn", "retrieval", "zeroshot"]
    compared = 0
    for name, entry in result["evals"].items():
        for metric, value in entry["metrics"].items():
            assert value == pytest.approx(logged[f"{name}/{metric}"], abs=1e-6), f"{name}/{metric}"
            compared += 1
    assert compared == len([k for k in logged if "/" in k]) >= 20
    # The table shows each recall with its chance level.
    line = next(line for line in printed.splitlines() if "i2t_R@1 " in line)
    assert line.split() == ["retrieval", "i2t_R@1", f"{logged['retrieval/i2t_R@1']:.4f}",
                            f"{logged['retrieval/i2t_R@1_chance']:.4f}"]
    assert f"results: {output}" in printed


def test_evaluate_named_sets_at_a_chosen_step(tiny_trained, tiny_karpathy, tiny_eval_folder, tmp_path):
    workdir, _ = tiny_trained
    captions_file, image_dir = tiny_karpathy
    result = evaluate.evaluate(workdir, step=2, output=str(tmp_path / "r.json"), specs=[
        f"flickr=karpathy:captions_file={captions_file},image_dir={image_dir},ks=1;2",
        f"shapes=zeroshot:image_dir={tiny_eval_folder}/test,templates=drawings",
    ])
    flickr = result["evals"]["flickr"]
    assert flickr["type"] == "karpathy" and flickr["arguments"]["ks"] == [1, 2]
    assert (flickr["metrics"]["num_images"], flickr["metrics"]["num_captions"]) == (3, 6)
    assert set(flickr["metrics"]) >= {"i2t_R@1", "i2t_R@2", "t2i_R@1", "t2i_R@2"}
    assert result["evals"]["shapes"]["metrics"]["num_classes"] == 3
    assert json.loads((tmp_path / "r.json").read_text())["evals"]["flickr"] == flickr


def test_eval_spec_parsing():
    assert evaluate.parse_eval_spec("f=karpathy:captions_file=a.json,max_images=10,ks=1;5") == (
        "f", "karpathy", {"captions_file": "a.json", "max_images": 10, "ks": [1, 5]})
    assert evaluate.parse_eval_spec("val=retrieval") == ("val", "retrieval", {})
    for bad in ("retrieval", "=retrieval", "x=retrieval:split"):
        with pytest.raises(evaluate.UsageError):
            evaluate.parse_eval_spec(bad)


@pytest.mark.parametrize("spec, message", [
    ("x=linear_probe", "unknown evaluator type 'linear_probe'"),
    ("x=zeroshot:image_folder=a", "zeroshot takes no image_folder"),
])
def test_a_bad_eval_spec_is_a_usage_error_before_anything_loads(tiny_trained, spec, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([tiny_trained[0], "--eval", spec])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_eval_files_are_one_line_errors(tiny_trained, tmp_path, capsys):
    workdir, _ = tiny_trained
    code = evaluate.main([workdir, "--eval", f"f=karpathy:captions_file={tmp_path}/no.json,image_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err == f"error: {tmp_path}/no.json: no such captions file"
    assert evaluate.main([str(tmp_path)]) == 1
    assert "not a training workdir" in capsys.readouterr().err
    assert evaluate.main([workdir, "--step", "7"]) == 1
    assert "no checkpoint of step 7" in capsys.readouterr().err
