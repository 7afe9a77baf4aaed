"""Vocabulary builder and tokenizer on the tiny corpus."""

import os

import numpy as np
import pytest
import tensorflow as tf

from trainer import vocab as vocab_lib
from trainer.tokenizer import Tokenizer

#: Words of every few tiny_corpus alt-texts (see conftest.CAPTION_TEMPLATES).
FREQUENT_WORDS = ["circle", "square", "triangle", "red", "green", "blue", "background", "photo"]


def read_vocab(path):
    with open(path) as f:
        return [line.rstrip("\n") for line in f]


@pytest.fixture(scope="module")
def vocab_path(tiny_corpus):
    return os.path.join(tiny_corpus, vocab_lib.VOCAB_FILENAME)


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    assert tiny_tokenizer.max_len == 16
    return tiny_tokenizer


def test_vocab_starts_with_reserved_tokens_pad_is_zero(vocab_path):
    tokens = read_vocab(vocab_path)
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(set(tokens)) == len(tokens)


def test_vocab_holds_the_frequent_words_lower_cased(vocab_path):
    tokens = set(read_vocab(vocab_path))
    for word in FREQUENT_WORDS:
        assert word in tokens
    assert "zebra" not in tokens  # never in the corpus
    assert all(t == t.lower() for t in tokens - set(vocab_lib.RESERVED_TOKENS))


def test_cli_with_smaller_target_writes_smaller_vocab(tiny_corpus, vocab_path, tmp_path):
    out = tmp_path / "vocab.txt"
    vocab_lib.main(["--data_dir", tiny_corpus, "--vocab_size", "40", "--output", str(out)])
    small = read_vocab(out)
    assert small[:5] == read_vocab(vocab_path)[:5]
    assert len(small) < len(read_vocab(vocab_path))


def test_cli_refuses_a_corpus_whose_build_did_not_finish(tiny_corpus, tmp_path, capsys):
    import shutil

    killed = tmp_path / "killed"
    shutil.copytree(tiny_corpus, killed)
    os.remove(killed / "COMPLETED")
    out = tmp_path / "vocab.txt"
    with pytest.raises(SystemExit) as exit_info:
        vocab_lib.main(["--data_dir", str(killed), "--vocab_size", "40", "--output", str(out)])
    assert exit_info.value.code == 2 and not out.exists()
    assert "has no COMPLETED" in capsys.readouterr().err
    vocab_lib.main(["--data_dir", str(killed), "--vocab_size", "40", "--output", str(out), "--allow_incomplete"])
    assert out.exists()


def test_tokenize_cls_first_sep_last_zero_padding(tokenizer):
    ids = tokenizer.tokenize_numpy(["red circle"])
    assert ids.dtype == np.int32 and ids.shape == (1, 16)
    assert tokenizer.decode(ids[0]) == ["[CLS]", "red", "circle", "[SEP]"]
    assert ids[0, 4:].tolist() == [0] * 12


def test_tokenize_truncates_at_max_len(tokenizer):
    colours = ["red", "green", "blue", "yellow", "purple", "orange"]
    ids = tokenizer.tokenize_numpy([" ".join(colours * 3)])[0]
    assert len(ids) == 16 and (ids != 0).all()
    assert tokenizer.decode(ids) == ["[CLS]"] + (colours * 3)[:14] + ["[SEP]"]


def test_tokenize_lower_cases_and_maps_unknown_words(tokenizer):
    upper, lower = tokenizer.tokenize_numpy(["RED Circle", "red circle"])
    assert upper.tolist() == lower.tolist()
    # Never seen in the corpus, not even as a character piece.
    assert "[UNK]" in tokenizer.decode(tokenizer.tokenize_numpy(["red ☃"])[0])


def test_tokenize_scalar_batch_and_inside_tf_data_agree(tokenizer):
    texts = ["a small red circle", "blue square", ""]
    batch = tokenizer.tokenize_numpy(texts)
    assert tokenizer.tokenize(tf.constant(texts[0])).numpy().tolist() == batch[0].tolist()
    mapped = tf.data.Dataset.from_tensor_slices(texts).map(tokenizer.tokenize)
    assert np.stack(list(mapped.as_numpy_iterator())).tolist() == batch.tolist()
    assert tokenizer.decode(batch[2]) == ["[CLS]", "[SEP]"]


def test_vocab_size_and_rejects_vocab_without_reserved_tokens(tokenizer, vocab_path, tmp_path):
    assert tokenizer.vocab_size == len(read_vocab(vocab_path))
    bad = tmp_path / "bad.txt"
    bad.write_text("[UNK]\n[PAD]\nred\n")
    with pytest.raises(ValueError, match="must start with"):
        Tokenizer(str(bad))
