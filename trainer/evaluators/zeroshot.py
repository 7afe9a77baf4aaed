"""Zero-shot classification of a labelled image folder with prompt ensembles.

ALIGN (like CLIP) turns each class name into several prompts, embeds them with
the text tower, averages the prompt embeddings and re-normalises: the class
embedding. An image is assigned the class whose embedding is most similar.
The folder layout is ``<image_dir>/<class_name>/*.{jpg,jpeg,png}``; underscores
in directory names become spaces in prompts.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional, Sequence, Union

import numpy as np

from common.vectors import l2_normalize
from trainer.evaluators import chunks, encode_image_files, encode_in_batches

#: The prompt ensembles, by name (``prompt_templates.json`` next to this module).
TEMPLATES_FILE = os.path.join(os.path.dirname(__file__), "prompt_templates.json")


def prompt_templates(names: Union[str, Sequence[str]] = "default") -> tuple[str, ...]:
    """The templates of one or several named ensembles, in order ("default": the file's default list)."""
    with open(TEMPLATES_FILE) as f:
        table = json.load(f)
    names = [names] if isinstance(names, str) else list(names)
    if names == ["default"]:
        names = table["default"]
    unknown = [n for n in names if n not in table or n.startswith("_") or n == "default"]
    if unknown:
        raise KeyError(f"unknown prompt ensemble(s) {unknown}; known: "
                       f"{sorted(k for k in table if not k.startswith('_') and k != 'default')}")
    return tuple(t for name in names for t in table[name])


def class_embeddings(encode_texts: Callable, tokenizer, class_names, templates, batch_size: int) -> np.ndarray:
    """``[num_classes, D]``: mean of each class's normalised prompt embeddings, re-normalised."""
    prompts = [template.format(name.replace("_", " ")) for name in class_names for template in templates]
    tokens = tokenizer.tokenize_numpy(prompts)
    embedded = encode_in_batches(encode_texts, chunks(tokens, batch_size), batch_size)
    per_class = l2_normalize(embedded).reshape(len(class_names), len(templates), -1)
    return l2_normalize(per_class.mean(axis=1))


def topk_accuracy(scores: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of rows whose label is among the ``k`` highest scores.

    A tie counts against the image (as in ``retrieval``): the label is in the
    top ``k`` when fewer than ``k`` other classes score at least as high, so
    a model that scores every class alike gets 0, not an arbitrary pick.
    """
    scores = np.asarray(scores)
    own = np.take_along_axis(scores, labels[:, None], axis=1)
    others_at_least = (scores >= own).sum(axis=1) - 1
    return float(np.mean(others_at_least < k))


class ZeroShotEvaluator:
    """kwargs: ``image_dir``, ``image_size``, ``tokenizer``, ``batch_size``; optional
    ``resize_size``, ``templates``: ensemble name(s) of ``prompt_templates.json``
    (default: CLIP's short ImageNet ensemble plus the drawing prompts) or a
    list of ``str.format`` templates with one ``{}``; ``class_names``: a
    class-name file (``trainer.eval_data.read_class_names``) when the
    directory names are ids (ImageNet's ``n01440764``), not words.

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
        templates: Union[str, Sequence[str]] = "default",
        class_names: Optional[str] = None,
    ):
        self.image_dir = image_dir
        self.image_size = image_size
        self.resize_size = resize_size
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        if isinstance(templates, str) or all("{}" not in t for t in templates):
            templates = prompt_templates(templates)
        self.templates = tuple(templates)
        self.class_names_file = class_names

    def run(self, encode_images: Callable, encode_texts: Callable) -> dict:
        from trainer.eval_data import labelled_folder

        paths, labels, _, class_names = labelled_folder(self.image_dir, self.class_names_file)
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
