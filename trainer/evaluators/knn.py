"""k-nearest-neighbour classification on frozen image embeddings.

Embeds a labelled train folder and a labelled test folder (layout
``<dir>/<class>/*.{jpg,jpeg,png}``) and classifies each test image by its
neighbours among the train images (cosine similarity).

``top1`` is ALIGN's "ImageNet KNN R@1" (Jia et al. 2021, Table 4, as in
Wu et al. 2018's "R@1" of the nearest neighbour): a hit when the single
nearest train image has the test image's label. ``weighted_vote_k`` (e.g. 20)
adds ``weighted_vote_top1``: the ``k`` nearest train images vote for their
class with weight ``exp(similarity / temperature)`` (Wu et al.'s weighted
kNN classifier, temperature 0.07); a different, smoother number, reported
under its own name.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from trainer.evaluators import chunks, encode_image_files, image_folder

_TEST_CHUNK = 1024  # bounds the [chunk, num_train] similarity matrix


def nearest_neighbours(train_embeddings: np.ndarray, test_embeddings: np.ndarray) -> np.ndarray:
    """Index of each test point's most similar train point (ties: the lowest index)."""
    out = []
    for chunk in chunks(np.asarray(test_embeddings, dtype=np.float32), _TEST_CHUNK):
        out.append(np.argmax(chunk @ np.asarray(train_embeddings, dtype=np.float32).T, axis=1))
    return np.concatenate(out)


def knn_class_scores(
    train_embeddings: np.ndarray,
    train_labels: np.ndarray,
    test_embeddings: np.ndarray,
    num_classes: int,
    k: int,
    temperature: float,
) -> np.ndarray:
    """``[num_test, num_classes]`` weighted votes of each test point's ``k`` nearest train points."""
    k = min(k, len(train_embeddings))
    scores = []
    for chunk in chunks(np.asarray(test_embeddings, dtype=np.float32), _TEST_CHUNK):
        similarity = chunk @ train_embeddings.T
        neighbours = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
        weights = np.exp(np.take_along_axis(similarity, neighbours, axis=1) / temperature)
        votes = np.zeros((len(chunk), num_classes), dtype=np.float64)
        np.add.at(votes, (np.arange(len(chunk))[:, None], train_labels[neighbours]), weights)
        scores.append(votes)
    return np.concatenate(scores)


class KnnEvaluator:
    """kwargs: ``train_dir``, ``test_dir``, ``image_size``, ``batch_size``; optional
    ``weighted_vote_k`` (off), ``temperature`` (0.07, for the weighted vote),
    ``resize_size``.

    Reports ``top1`` (nearest neighbour, ALIGN's KNN R@1), ``top1_chance``
    (1 / classes), ``num_train``, ``num_test`` and, with ``weighted_vote_k``,
    ``weighted_vote_top1``. Class names are matched between the folders by name.
    """

    def __init__(
        self,
        train_dir: str,
        test_dir: str,
        *,
        image_size: int,
        batch_size: int = 64,
        weighted_vote_k: Optional[int] = None,
        temperature: float = 0.07,
        resize_size: Optional[int] = None,
    ):
        self.train_dir = train_dir
        self.test_dir = test_dir
        self.image_size = image_size
        self.resize_size = resize_size
        self.batch_size = batch_size
        self.weighted_vote_k = weighted_vote_k
        self.temperature = temperature

    def run(self, encode_images: Callable, encode_texts: Callable = None) -> dict:
        del encode_texts  # image features only
        train_paths, train_labels, train_classes = image_folder(self.train_dir)
        test_paths, test_labels, test_classes = image_folder(self.test_dir)
        class_names = sorted(set(train_classes) | set(test_classes))
        train_labels = np.searchsorted(class_names, np.asarray(train_classes)[train_labels])
        test_labels = np.searchsorted(class_names, np.asarray(test_classes)[test_labels])

        def embed(paths):
            return encode_image_files(
                encode_images, paths, image_size=self.image_size, resize_size=self.resize_size,
                batch_size=self.batch_size,
            )

        train_embeddings, test_embeddings = embed(train_paths), embed(test_paths)
        nearest = nearest_neighbours(train_embeddings, test_embeddings)
        metrics = {
            "top1": float(np.mean(train_labels[nearest] == test_labels)),
            "top1_chance": 1.0 / len(class_names),
            "num_train": float(len(train_paths)),
            "num_test": float(len(test_paths)),
        }
        if self.weighted_vote_k:
            scores = knn_class_scores(train_embeddings, train_labels, test_embeddings, len(class_names),
                                      self.weighted_vote_k, self.temperature)
            metrics["weighted_vote_top1"] = float(np.mean(scores.argmax(axis=1) == test_labels))
        return metrics
