"""Cross-fitted scoring models (``trainer.crossfit``) and the pair model that routes each pair to the model that
never saw its fold (``trainer.pair_score.CrossFitPairModel``)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from common.schema import fold_of, key_fraction
from common.tfrecord_io import decode_example, read_frames
from filters import model_score
from trainer import crossfit, pair_score
from trainer.input_pipeline import list_shards


def _keys(directory, split):
    keys = []
    for path in list_shards(directory, split):
        with open(path, "rb") as f:
            keys += [decode_example(p, names=("key",))["key"][0].decode() for p in read_frames(f)]
    return keys


def test_folds_are_by_key_hash_and_apart_from_the_split():
    keys = [f"{i:024x}" for i in range(4000)]
    folds = [fold_of(k, 2) for k in keys]
    assert 0.45 < np.mean(folds) < 0.55
    assert set(fold_of(k, 3) for k in keys) == {0, 1, 2}
    # A salt of its own: the validation split (the lowest key_fraction under "split") is spread over both folds.
    validation = [k for k in keys if key_fraction(k, salt="split") < 0.05]
    assert 0.3 < np.mean([fold_of(k, 2) for k in validation]) < 0.7


def test_each_fold_data_is_the_train_split_without_that_fold(tiny_corpus, tmp_path):
    train = _keys(tiny_corpus, "train")
    seen = []
    for fold in range(2):
        out = str(tmp_path / f"data_{fold}")
        count = crossfit.write_fold_data(tiny_corpus, out, fold, 2)
        kept = _keys(out, "train")
        assert count == len(kept) and kept and all(fold_of(k, 2) != fold for k in kept)
        assert sorted(_keys(out, "validation")) == sorted(_keys(tiny_corpus, "validation"))
        seen += kept
        assert crossfit.write_fold_data(tiny_corpus, out, fold, 2) == count  # written once, then reused
    assert sorted(seen) == sorted(train)  # each train pair is in exactly one model's data (the other folds')


def test_train_folds_trains_each_model_once_and_writes_the_manifest_last(tiny_corpus, tiny_trained, tmp_path,
                                                                        monkeypatch):
    calls = []

    def fake_train(command):
        calls.append(command)
        workdir = next(a.split("=", 1)[1] for a in command if a.startswith("--workdir="))
        assert not os.path.exists(tmp_path / "w" / crossfit.MANIFEST)
        shutil.copytree(tiny_trained[0], workdir)  # a finished run (its config's total_steps reached)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(crossfit.subprocess, "run", fake_train)
    workdir = str(tmp_path / "w")
    manifest = crossfit.train_folds("cfg.py", tiny_corpus, workdir, 2, ["--config.seed=3"], log=lambda _: None)
    assert len(calls) == 2
    assert calls[0][:3] == [sys.executable, "-m", "trainer.train"]
    assert f"--config.data_dir={crossfit.data_dir(workdir, 1)}" in calls[1] and "--config.seed=3" in calls[1]
    assert f"--config.vocab_path={os.path.join(tiny_corpus, 'vocab.txt')}" in calls[0]  # the corpus's vocabulary
    assert manifest["models"] == ["fold_0", "fold_1"]
    assert sum(manifest["trained_on"].values()) == len(_keys(tiny_corpus, "train"))
    with open(os.path.join(workdir, crossfit.MANIFEST)) as f:
        assert json.load(f)["folds"] == 2
    crossfit.train_folds("cfg.py", tiny_corpus, workdir, 2, ["--config.seed=3"], log=lambda _: None)
    assert len(calls) == 2  # run again: both models are finished, nothing is trained


def test_a_model_that_does_not_finish_is_one_line(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(crossfit.subprocess, "run", lambda command: subprocess.CompletedProcess(command, 1))
    with pytest.raises(crossfit.CrossFitError, match=r"^model 0 did not finish \(exit status 1\); see .*train.log"):
        crossfit.train_folds("cfg.py", tiny_corpus, str(tmp_path / "w"), 2, [], log=lambda _: None)
    assert not os.path.exists(tmp_path / "w" / crossfit.MANIFEST)


# ``main`` in this process in the default run; ``python -m trainer.crossfit`` in CI's integration run.
@pytest.mark.parametrize("process", ["this", pytest.param("own", marks=pytest.mark.integration)])
def test_the_command_line_errors_are_one_line(process, tmp_path, capsys):
    def run(*argv):
        if process == "own":
            done = subprocess.run([sys.executable, "-m", "trainer.crossfit", *argv], capture_output=True, text=True)
            return done.returncode, done.stderr
        try:
            status = crossfit.main(list(argv))
        except SystemExit as exit_:
            status = exit_.code
        return status, capsys.readouterr().err

    config = "trainer/configs/tiny.py"
    for argv, message in [
        (["--config", config, "--data_dir", str(tmp_path), "--workdir", str(tmp_path / "w"), "--folds", "1"],
         "--folds must be >= 2"),
        (["--config", config, "--data_dir", str(tmp_path), "--workdir", str(tmp_path / "w"), "--seed", "1"],
         "unrecognized arguments: --seed 1"),
        (["--config", config, "--data_dir", str(tmp_path / "none"), "--workdir", str(tmp_path / "w")], ""),
    ]:
        status, stderr = run(*argv)
        assert status != 0 and len(stderr.strip().splitlines()) == 1, stderr
        assert stderr.startswith("error: ") and message in stderr


def _crossfit_dir(tiny_trained, tmp_path):
    workdir = tmp_path / "crossfit"
    for fold in range(2):
        shutil.copytree(tiny_trained[0], workdir / f"fold_{fold}")
    (workdir / crossfit.MANIFEST).write_text(json.dumps({"folds": 2, "models": ["fold_0", "fold_1"]}))
    return str(workdir)


def test_each_pair_is_scored_by_the_model_trained_without_its_fold(tiny_trained, tmp_path):
    from PIL import Image

    model = pair_score.CrossFitPairModel(_crossfit_dir(tiny_trained, tmp_path), batch_size=4)
    assert model.keyed and model.folds == 2 and "2 models (steps 2, 2)" in model.describe()
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)) for _ in range(9)]
    texts = [f"a drawing of {n} circles" for n in range(9)]
    keys = [f"{i:024x}" for i in range(9)]
    plain = model.models[0].score_images(images, texts)
    np.testing.assert_allclose(model.score_images(images, texts, keys), plain, atol=1e-6)  # equal copies
    # Model 1 shifted: exactly the pairs of fold 1 change.
    one = model.models[1]
    model.models[1] = type("Shifted", (), {"score_images": lambda self, i, t: one.score_images(i, t) + 10})()
    got = model.score_images(images, texts, keys)
    folds = np.array([fold_of(k, 2) for k in keys])
    assert set(folds) == {0, 1}
    np.testing.assert_allclose(got, plain + 10 * folds, atol=1e-5)


def test_a_keyed_model_needs_the_keys_and_a_finished_workdir(tiny_trained, tmp_path):
    scorer = model_score.PairScorer("crossfit", workdir=_crossfit_dir(tiny_trained, tmp_path))
    with pytest.raises(ValueError, match="scores by the pair's key: pass keys"):
        scorer.score([b""], ["text"])
    unfinished = model_score.PairScorer("crossfit", workdir=str(tmp_path))
    with pytest.raises(ValueError, match=r"^model score crossfit .*: no crossfit.json, not a finished trainer"):
        unfinished.check()
    with pytest.raises(ValueError, match="needs workdir="):
        model_score.PairScorer("crossfit").check()
    (tmp_path / "crossfit.json").write_text('{"folds": 2.5, "models": []}')  # damaged: one line naming it
    with pytest.raises(ValueError, match=r"^model score crossfit .*crossfit.json: folds: 2.5, not a whole number"):
        model_score.PairScorer("crossfit", workdir=str(tmp_path)).check()


@pytest.mark.slow
def test_the_command_trains_the_folds_and_a_build_scores_with_them(tiny_corpus, tmp_path, jax_cache_dir):
    """End to end: python -m trainer.crossfit (two real 2-step runs), then a build whose model-score stage is
    cross-fitted: each recorded cosine is the one the pair's fold model gives."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    from common.schema import make_key
    from corpus_paths import committed
    from pipeline.build import launcher
    from trainer.input_pipeline import parse_fields

    config = tmp_path / "tiny_test.py"
    config.write_text("from trainer.configs import tiny\n\n\ndef get_config(arg=None):\n    return tiny.get_config()\n")
    small = ["--config.total_steps=2", "--config.batch_size=8", "--config.image_size=32", "--config.resize_size=36",
             "--config.max_text_len=16", "--config.eval_batch_size=8", "--config.evals.retrieval.every=0",
             f"--config.compilation_cache_dir={jax_cache_dir}", "--config.xla_cpu_fast_compile=True"]
    workdir = tmp_path / "x"
    done = subprocess.run([sys.executable, "-m", "trainer.crossfit", "--config", str(config), "--data_dir",
                           tiny_corpus, "--workdir", str(workdir), *small], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"crossfit: 2 models -> {workdir / crossfit.MANIFEST}"
    assert all(crossfit.trained_to_end(crossfit.fold_dir(str(workdir), k)) for k in range(2))

    records = []
    for path in list_shards(tiny_corpus, "train")[:1]:
        with open(path, "rb") as f:
            records += [parse_fields(tf.constant(p), ("image", "texts")) for p in read_frames(f)]
    urls = [f"https://example.com/{i}.jpg" for i in range(len(records))]
    texts = [r["texts"].numpy().decode() for r in records]
    images = [r["image"].numpy() for r in records]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"url": urls, "caption": texts, "jpg": images}), tmp_path / "in" / "part-0.parquet")
    launcher.run(["--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out"),
                  "--set", "min_shorter_side=0", "--set", "min_words=1", "--set", "vocab_size=0",
                  "--set", "nsfw_threshold=1", "--model_score", "crossfit", "--model_score_arg", f"workdir={workdir}",
                  "--set", "model_score_threshold=1.0"])
    recorded = {}
    for path in (committed(tmp_path / "out") / "stats" / "rejected").glob("*.jsonl"):
        recorded.update((row["key"], row["model_score"]) for row in map(json.loads, path.read_text().splitlines()))
    keys = [make_key(url, text) for url, text in zip(urls, texts)]
    folds = [fold_of(key, 2) for key in keys]
    assert set(folds) == {0, 1}
    for fold in range(2):
        own = model_score.PairScorer("checkpoint", workdir=crossfit.fold_dir(str(workdir), fold))
        rows = [i for i, f in enumerate(folds) if f == fold]
        want = own.score([images[i] for i in rows], [texts[i] for i in rows])
        np.testing.assert_allclose([recorded[keys[i]] for i in rows], want, atol=2e-6)
