"""WordPiece vocabulary learned from the corpus's own alt-texts.

ALIGN trains BERT from scratch with a 100k wordpiece vocabulary "generated
from the training dataset"; small corpora get proportionally smaller ones.
The vocabulary is learned with tensorflow-text's BERT vocabulary learner (the
same word splitting and lower-casing the tokenizer applies later, so the two
cannot disagree), fully offline, and written as ``<data_dir>/vocab.txt``, one
token per line, line number = token id.

    python -m trainer.vocab --data_dir DIR --vocab_size 100000 [--split train]
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from common import cli

#: Fixed ids: [PAD] must be 0 because the tokenizer pads with 0 and the text
#: encoder derives its attention mask from ``ids != 0``.
RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = RESERVED_TOKENS

#: Shared with ``trainer.tokenizer`` so vocabulary and tokenizer split and
#: normalise words identically.
BERT_TOKENIZER_PARAMS = {"lower_case": True}

VOCAB_FILENAME = "vocab.txt"


def learn_vocab(texts, vocab_size: int, min_count: int = 2) -> list[str]:
    """Learns a wordpiece vocabulary from a ``tf.data.Dataset`` of strings.

    ``min_count`` is the lowest word frequency the learner's threshold search
    may go down to (the library default of 10 leaves a small corpus with
    little more than single characters); words seen once in noisy alt-text
    are mostly junk, so it stays at 2.
    """
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bert_vocab

    vocab = bert_vocab.bert_vocab_from_dataset(
        texts.batch(1024).prefetch(2),
        vocab_size=vocab_size,
        reserved_tokens=list(RESERVED_TOKENS),
        bert_tokenizer_params=BERT_TOKENIZER_PARAMS,
        learn_params={"lower_thresh": min_count},
    )
    # The learner puts reserved tokens first, in order; the tokenizer relies on
    # it ([PAD] = 0), so check rather than trust.
    if tuple(vocab[: len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
        raise RuntimeError(f"reserved tokens not at the start of the vocabulary: {vocab[:8]}")
    return vocab


def build_vocab(
    data_dir: str,
    vocab_size: int,
    split: str = "train",
    *,
    min_count: int = 2,
    max_texts: Optional[int] = None,
    output_path: Optional[str] = None,
) -> str:
    """Learns the vocabulary of ``split``'s alt-texts; returns the vocab path.

    ``max_texts`` bounds how many alt-texts are counted (word counting runs in
    this one process; a few million texts already pin down a 100k vocabulary).
    Works for local and ``gs://`` directories. A damaged shard raises
    ``trainer.shard_reader.DamagedShard`` (one line naming it).
    """
    import tensorflow as tf

    from trainer.input_pipeline import read_texts
    from trainer.shard_reader import damage_in

    texts = read_texts(data_dir, split)
    if max_texts is not None:
        texts = texts.take(max_texts)
    try:
        vocab = learn_vocab(texts, vocab_size, min_count=min_count)
    except tf.errors.OpError as error:  # raised inside tf.data: the reader's own one-line error
        raise damage_in(error) or error
    from common.corpus_dir import read_dir

    path = output_path or os.path.join(read_dir(data_dir), VOCAB_FILENAME)
    with tf.io.gfile.GFile(path, "w") as f:
        f.write("".join(token + "\n" for token in vocab))
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli.ArgumentParser(prog="python -m trainer.vocab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="shard directory (local or gs://)")
    parser.add_argument("--vocab_size", type=int, required=True, help="target size (ALIGN: 100000)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--min_count", type=int, default=2)
    parser.add_argument("--max_texts", type=int, default=None)
    parser.add_argument("--output", default=None, help="default: <data_dir>/vocab.txt")
    parser.add_argument("--allow_incomplete", action="store_true",
                        help="read a corpus whose build did not finish (no COMPLETED)")
    args = parser.parse_args(argv)
    from common import console
    from common.corpus_dir import DamagedFile, IncompleteCorpus, require_completed

    try:
        data_dir = require_completed(args.data_dir, args.allow_incomplete, "--allow_incomplete")
    except IncompleteCorpus as error:
        parser.exit(2, f"error: {error}\n")
    log = console.route_library_output("vocab") if argv is None else "the log"
    try:
        path = build_vocab(data_dir, args.vocab_size, args.split, min_count=args.min_count,
                           max_texts=args.max_texts, output_path=args.output)
    except Exception as error:  # one line for the person, the traceback in the log
        return console.failure(error, "vocabulary", log, expected=(DamagedFile, FileNotFoundError))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
