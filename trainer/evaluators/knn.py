"""k-nearest-neighbour classification on frozen image embeddings.

Embeds a labelled train folder and a labelled test folder (layout
``<dir>/<class>/*.{jpg,jpeg,png}``); each test image takes the ``k`` train
images of highest cosine similarity, and each neighbour votes for its class
with weight ``exp(similarity / temperature)`` (the weighted kNN of Wu et
al. 2018, used for ALIGN's "ImageNet KNN R@1"). Reports top-1 accuracy.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from trainer.evaluators import chunks, encode_image_files, image_folder

_TEST_CHUNK = 1024  # bounds the [chunk, num_train] similarity matrix


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
    ``k`` (20), ``temperature`` (0.07), ``resize_size``.

    Reports ``knn_top1``, ``knn_top1_chance`` (1 / classes), ``num_train``,
    ``num_test``. Class names are matched between the folders by name.
    """

    def __init__(
        self,
        train_dir: str,
        test_dir: str,
        *,
        image_size: int,
        batch_size: int = 64,
        k: int = 20,
        temperature: float = 0.07,
        resize_size: Optional[int] = None,
    ):
        self.train_dir = train_dir
        self.test_dir = test_dir
        self.image_size = image_size
        self.resize_size = resize_size
        self.batch_size = batch_size
        self.k = k
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

        scores = knn_class_scores(
            embed(train_paths), train_labels, embed(test_paths), len(class_names), self.k, self.temperature
        )
        return {
            "knn_top1": float(np.mean(scores.argmax(axis=1) == test_labels)),
            "knn_top1_chance": 1.0 / len(class_names),
            "num_train": float(len(train_paths)),
            "num_test": float(len(test_paths)),
        }
