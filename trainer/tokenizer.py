"""BERT WordPiece tokenizer over the corpus vocabulary, usable inside tf.data.

Output layout is BERT's single-segment format, fixed length: ``[CLS]``, up to
``max_len - 2`` wordpieces (the tail of longer texts is cut), ``[SEP]``, then
``[PAD]`` = 0 up to ``max_len`` (ALIGN: 64). The text encoder reads the
``[CLS]`` position and masks ``ids == 0``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from trainer import vocab as vocab_lib


class Tokenizer:
    """``Tokenizer(vocab_path, max_len=64)``; ``vocab_path`` may be local or gs://."""

    def __init__(self, vocab_path: str, max_len: int = 64):
        if max_len < 2:
            raise ValueError("max_len must leave room for [CLS] and [SEP]")
        with tf.io.gfile.GFile(vocab_path) as f:
            tokens = [line.rstrip("\n") for line in f]
        if tokens[: len(vocab_lib.RESERVED_TOKENS)] != list(vocab_lib.RESERVED_TOKENS):
            raise ValueError(f"{vocab_path}: must start with {vocab_lib.RESERVED_TOKENS}")
        self.vocab_path = vocab_path
        self.max_len = max_len
        self.tokens = tokens
        self.vocab_size = len(tokens)
        self.cls_id = tokens.index(vocab_lib.CLS)
        self.sep_id = tokens.index(vocab_lib.SEP)
        # A table built from the lines read above (not a TextFileInitializer)
        # so gs:// vocabularies need no extra filesystem support in the op.
        table = tf.lookup.StaticVocabularyTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(tokens), tf.range(len(tokens), dtype=tf.int64)
            ),
            num_oov_buckets=1,
        )
        self._bert = tf_text.BertTokenizer(
            table, token_out_type=tf.int32, unknown_token=vocab_lib.UNK,
            **vocab_lib.BERT_TOKENIZER_PARAMS,
        )
        # Traced once per tokenizer: tracing the BERT ops takes seconds, and
        # every tf.data map / evaluator call would otherwise pay it again.
        self._tokenize_batch = tf.function(
            self._tokenize_batch_eager,
            input_signature=[tf.TensorSpec([None], tf.string)],
            autograph=False,
        )

    def _tokenize_batch_eager(self, texts):
        pieces = self._bert.tokenize(texts).merge_dims(-2, -1)[:, : self.max_len - 2]
        ids, _ = tf_text.combine_segments([pieces], self.cls_id, self.sep_id)
        return tf.cast(ids.to_tensor(default_value=0, shape=[None, self.max_len]), tf.int32)

    def tokenize(self, texts) -> tf.Tensor:
        """tf.string ``[B]`` (or scalar) -> int32 ``[B, max_len]`` (or ``[max_len]``)."""
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        ids = self._tokenize_batch(tf.reshape(texts, [-1]))
        return ids[0] if texts.shape.rank == 0 else ids

    def tokenize_numpy(self, texts: Sequence[str]) -> np.ndarray:
        """list[str] -> np.int32 ``[len(texts), max_len]``."""
        return self.tokenize(tf.constant(list(texts), dtype=tf.string)).numpy()

    def decode(self, ids) -> list[str]:
        """Token strings of one id row, without padding (for debugging and tests)."""
        return [self.tokens[i] for i in np.asarray(ids).tolist() if i != 0]
