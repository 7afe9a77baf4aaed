"""Zero-shot classification of a labelled image folder with prompt ensembles.

ALIGN (like CLIP) turns each class name into several prompts, embeds them with
the text tower, averages the prompt embeddings and re-normalises: the class
embedding. An image is assigned the class whose embedding is most similar.
The folder layout is ``<image_dir>/<class_name>/*.{jpg,jpeg,png}``; underscores
in directory names become spaces in prompts.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from trainer.evaluators import chunks, encode_image_files, encode_in_batches, image_folder, l2_normalize

#: Prompt templates (data, not code). CLIP's short ImageNet ensemble plus
#: templates that fit drawn/synthetic scenes such as the sample corpus.
PROMPT_TEMPLATES = (
    "a photo of a {}.",
    "a photo of the {}.",
    "itap of a {}.",
    "a bad photo of the {}.",
    "a photo of the large {}.",
    "a photo of the small {}.",
    "art of the {}.",
    "a drawing of a {}.",
    "a rendering of a {}.",
    "a {}.",
)


def class_embeddings(encode_texts: Callable, tokenizer, class_names, templates, batch_size: int) -> np.ndarray:
    """``[num_classes, D]``: mean of each class's normalised prompt embeddings, re-normalised."""
    prompts = [template.format(name.replace("_", " ")) for name in class_names for template in templates]
    tokens = tokenizer.tokenize_numpy(prompts)
    embedded = encode_in_batches(encode_texts, chunks(tokens, batch_size), batch_size)
    per_class = l2_normalize(embedded).reshape(len(class_names), len(templates), -1)
    return l2_normalize(per_class.mean(axis=1))


def topk_accuracy(scores: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of rows whose label is among the ``k`` highest scores."""
    k = min(k, scores.shape[1])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return float(np.mean((top == labels[:, None]).any(axis=1)))


class ZeroShotEvaluator:
    """kwargs: ``image_dir``, ``image_size``, ``tokenizer``, ``batch_size``; optional
    ``resize_size``, ``templates`` (default ``PROMPT_TEMPLATES``).

    Reports ``top1``, ``top5`` (top-k with k capped at the number of classes),
    ``top1_chance``, ``num_images``, ``num_classes``.
    """

    def __init__(
        self,
        image_dir: str,
        *,
        image_size: int,
        tokenizer,
        batch_size: int = 64,
        resize_size: Optional[int] = None,
        templates: Sequence[str] = PROMPT_TEMPLATES,
    ):
        self.image_dir = image_dir
        self.image_size = image_size
        self.resize_size = resize_size
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.templates = tuple(templates)

    def run(self, encode_images: Callable, encode_texts: Callable) -> dict:
        paths, labels, class_names = image_folder(self.image_dir)
        classes = class_embeddings(encode_texts, self.tokenizer, class_names, self.templates, self.batch_size)
        images = encode_image_files(
            encode_images, paths, image_size=self.image_size, resize_size=self.resize_size,
            batch_size=self.batch_size,
        )
        scores = images @ classes.T
        return {
            "top1": topk_accuracy(scores, labels, 1),
            "top5": topk_accuracy(scores, labels, 5),
            "top1_chance": 1.0 / len(class_names),
            "num_images": float(len(paths)),
            "num_classes": float(len(class_names)),
        }
