"""Held-out image<->text retrieval (R@1/5/10) on a split of the shards.

Exact duplicates. Web alt-text repeats itself ("image", a product name), and
the same picture can come with several alt-texts. Two captions with the same
token ids, or two images with the same bytes (sha256), get identical
embeddings from any model, so which of them ranks first is an arbitrary tie.
Retrieval therefore runs over *unique* captions (by token ids, i.e. what the
model sees after lower-casing and truncation) and *unique* images (by
sha256): image->text ranks each unique image against the unique captions and
counts a hit if any caption it was paired with is in the top k; text->image
is the mirror. Without this, an image whose caption is shared by five others
would lose rank to its own caption's copies, and R@1 would be capped below 1
even for a perfect model. Chance levels use the same groups: a query with
``m`` positives among ``n`` candidates hits the top ``k`` at random with
probability ``1 - C(n - m, k) / C(n, k)``, averaged over queries
(R@1 chance = 1/N when nothing is duplicated).

Recalls are fractions in [0, 1]. Ties in score count against the query
(rank = number of non-positive candidates scoring at least as high as its
best positive): exact duplicates are already merged, so a remaining tie is
the model failing to tell two things apart, and a collapsed model that embeds
everything alike must score 0, not 1.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from trainer.evaluators import chunks, encode_in_batches

KS = (1, 5, 10)
_QUERY_CHUNK = 1024  # bounds the [chunk, candidates] score matrix


def best_positive_ranks(queries, candidates, pairs_query, pairs_candidate) -> np.ndarray:
    """For every query, how many non-positive candidates score at least as high as its best positive.

    ``(pairs_query[i], pairs_candidate[i])`` lists the positive pairs; every
    query needs at least one.
    """
    if len(np.unique(pairs_query)) != len(queries):
        raise ValueError("every query needs a positive")
    ranks = []
    for start, chunk in zip(range(0, len(queries), _QUERY_CHUNK), chunks(queries, _QUERY_CHUNK)):
        scores = chunk @ candidates.T
        in_chunk = (pairs_query >= start) & (pairs_query < start + len(chunk))
        positive = np.zeros(scores.shape, dtype=bool)
        positive[pairs_query[in_chunk] - start, pairs_candidate[in_chunk]] = True
        best = np.where(positive, scores, -np.inf).max(axis=1, keepdims=True)
        ranks.append(((scores >= best) & ~positive).sum(axis=1))
    return np.concatenate(ranks)


def chance_recall(num_positives: np.ndarray, num_candidates: int, k: int) -> float:
    """Mean probability that a random ranking puts a positive in the top ``k``."""
    miss = np.ones(len(num_positives))
    for j in range(min(k, num_candidates)):
        miss *= np.clip((num_candidates - num_positives - j) / (num_candidates - j), 0.0, 1.0)
    return float(np.mean(1.0 - miss))


def retrieval_metrics(
    image_embeddings: np.ndarray,
    text_embeddings: np.ndarray,
    image_ids: Sequence,
    caption_ids: Sequence,
    ks: Sequence[int] = KS,
) -> dict:
    """Metrics for N pairs; pair i is (image_embeddings[i], text_embeddings[i]).

    ``image_ids`` / ``caption_ids`` say which pairs share an identical image /
    caption (any hashable per pair, e.g. sha256 and the token-id row); pairs
    with the same id must have the same embedding, the first one is used.
    """
    image_group, image_first = _groups(list(image_ids))
    caption_group, caption_first = _groups(list(caption_ids))
    images = np.asarray(image_embeddings, dtype=np.float32)[image_first]
    captions = np.asarray(text_embeddings, dtype=np.float32)[caption_first]
    # Unique (image, caption) positive pairs.
    pairs = np.unique(np.stack([image_group, caption_group], axis=1), axis=0)
    metrics = {
        "num_pairs": float(len(image_group)),
        "num_images": float(len(images)),
        "num_captions": float(len(captions)),
    }
    directions = {
        "i2t": (images, captions, pairs[:, 0], pairs[:, 1]),
        "t2i": (captions, images, pairs[:, 1], pairs[:, 0]),
    }
    for name, (queries, candidates, pair_query, pair_candidate) in directions.items():
        ranks = best_positive_ranks(queries, candidates, pair_query, pair_candidate)
        num_positives = np.bincount(pair_query, minlength=len(queries))
        for k in ks:
            metrics[f"{name}_R@{k}"] = float(np.mean(ranks < k))
            metrics[f"{name}_R@{k}_chance"] = chance_recall(num_positives, len(candidates), k)
    return metrics


def _groups(ids):
    """Group index of every item (groups numbered by first appearance), and each group's first item."""
    group_of, first = {}, []
    groups = np.empty(len(ids), dtype=np.int64)
    for i, key in enumerate(ids):
        if key not in group_of:
            group_of[key] = len(first)
            first.append(i)
        groups[i] = group_of[key]
    return groups, np.asarray(first, dtype=np.int64)


class RetrievalEvaluator:
    """Image->text and text->image recall on ``split`` of a shard directory.

    kwargs: ``data_dir``, ``split="validation"``, ``image_size``, ``tokenizer``,
    ``batch_size``; optional ``resize_size`` (default: ALIGN's 346/289 ratio),
    ``ks``, ``max_pairs`` (the first pairs in file order, to bound the cost).
    """

    def __init__(
        self,
        data_dir: str,
        *,
        image_size: int,
        tokenizer,
        batch_size: int = 64,
        split: str = "validation",
        resize_size: Optional[int] = None,
        ks: Sequence[int] = KS,
        max_pairs: Optional[int] = None,
    ):
        self.data_dir = data_dir
        self.split = split
        self.image_size = image_size
        self.resize_size = resize_size
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.ks = tuple(ks)
        self.max_pairs = max_pairs

    def _batches(self):
        """This split's eval batches (image, text, key, sha256), all on this process."""
        from trainer import input_pipeline

        dataset = input_pipeline.make_dataset(
            self.data_dir,
            self.split,
            global_batch_size=self.batch_size,
            image_size=self.image_size,
            resize_size=self.resize_size,
            train=False,
            seed=0,
            tokenizer=self.tokenizer,
            process_index=0,
            process_count=1,
            extra_features=("sha256",),
        )
        if self.max_pairs is not None:
            dataset = dataset.unbatch().take(self.max_pairs).batch(self.batch_size)
        return dataset.as_numpy_iterator()

    def run(self, encode_images: Callable, encode_texts: Callable) -> dict:
        texts, sha256s = [], []

        def images():
            for batch in self._batches():
                texts.append(batch["text"])
                sha256s.extend(batch["sha256"])
                yield batch["image"]

        image_embeddings = encode_in_batches(encode_images, images(), self.batch_size)
        texts = np.concatenate(texts)
        caption_ids = [row.tobytes() for row in texts]
        # Embed each distinct caption once.
        group, first = _groups(caption_ids)
        unique_embeddings = encode_in_batches(encode_texts, chunks(texts[first], self.batch_size), self.batch_size)
        return retrieval_metrics(image_embeddings, unique_embeddings[group], sha256s, caption_ids, self.ks)
