"""Every command that reads a corpus refuses the output of a build that never committed, the same way.

A killed build leaves ``versions/<id>/`` with its shards and no top-level
commit (``dataset_info.json``); each command stops with exit status 2 and
one line (``common.corpus_dir.IncompleteCorpus``) that names the output and
the flag that reads the newest version anyway.
"""

import os
import shutil

import pytest
from conftest import tiny_train_config

from common import corpus_dir

VERSION = "20250101T000000Z-0123abcd"


@pytest.fixture
def killed_output(tiny_corpus, tmp_path):
    """A build's output whose job was killed before the commit: one version, no top-level commit."""
    output = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, output / corpus_dir.VERSIONS / VERSION)
    os.remove(output / corpus_dir.VERSIONS / VERSION / corpus_dir.COMPLETED)
    return str(output)


@pytest.fixture
def run_dir(tiny_corpus, tmp_path):
    """A training run's workdir as far as the commands read it before a checkpoint (its config.json)."""
    from trainer import checkpoint

    workdir = tmp_path / "run"
    workdir.mkdir()
    config = tiny_train_config(tiny_corpus, str(tmp_path / "cache"), evals={"retrieval": {"split": "validation"}})
    checkpoint.save_config(config, str(workdir))
    return str(workdir)


def _refused(capsys, output, flag="--allow_incomplete"):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {output} has no committed corpus: its build did not commit"), err
    assert flag in err, err


def _exit_status(main, argv):
    try:
        return main(argv)
    except SystemExit as done:
        return done.code


def test_the_audit_refuses_it(killed_output, capsys):
    from pipeline.audit import auditor

    assert _exit_status(auditor.main, [killed_output, "--no_html"]) == 2
    _refused(capsys, killed_output)


def test_the_vocabulary_refuses_it_and_reads_it_when_asked(killed_output, capsys, tmp_path):
    from trainer import vocab

    assert _exit_status(vocab.main, ["--data_dir", killed_output, "--vocab_size", "50"]) == 2
    _refused(capsys, killed_output)
    out = str(tmp_path / "vocab.txt")
    assert _exit_status(vocab.main, ["--data_dir", killed_output, "--vocab_size", "50", "--allow_incomplete",
                                     "--output", out]) == 0
    assert os.path.getsize(out) > 0


def test_evaluation_on_it_refuses_it(killed_output, run_dir, capsys):
    from trainer import evaluate

    assert _exit_status(evaluate.main, [run_dir, "--data_dir", killed_output]) == 2
    _refused(capsys, killed_output)


def test_an_evaluation_naming_it_in_its_own_arguments_refuses_it(killed_output, run_dir, capsys):
    """``--eval NAME=retrieval:data_dir=OUT``: the run's own corpus is committed, the one named is not."""
    from trainer import evaluate

    spec = f"held_out=retrieval:data_dir={killed_output},split=validation"
    assert _exit_status(evaluate.main, [run_dir, "--eval", spec]) == 2
    _refused(capsys, killed_output)
    assert not os.path.exists(os.path.join(run_dir, "eval"))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):  # with the flag it goes on, to the checkpoint
        evaluate.evaluate(run_dir, specs=[spec], allow_incomplete=True)


def test_the_embedding_export_refuses_it(killed_output, run_dir, capsys, tmp_path):
    from trainer import embed

    assert _exit_status(embed.main, [run_dir, "--shards", killed_output, "--out", str(tmp_path / "emb")]) == 2
    _refused(capsys, killed_output)
    assert not os.path.exists(tmp_path / "emb")


def test_crossfit_refuses_it(killed_output, capsys, tmp_path):
    from trainer import crossfit

    config = tmp_path / "config.py"
    config.write_text("from trainer.configs.tiny import get_config\n")
    assert _exit_status(crossfit.main, ["--config", str(config), "--data_dir", killed_output,
                                        "--workdir", str(tmp_path / "folds")]) == 2
    _refused(capsys, killed_output, "--allow_incomplete")


def test_training_refuses_it(killed_output, tmp_path):
    from trainer import train

    config = tiny_train_config(killed_output, str(tmp_path / "cache"))
    with pytest.raises(corpus_dir.IncompleteCorpus) as error:
        train.train_and_evaluate(config, str(tmp_path / "run"))
    assert str(error.value).startswith(f"{killed_output} has no committed corpus: its build did not commit")
    assert "--config.allow_incomplete=true" in str(error.value)
