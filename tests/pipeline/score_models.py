"""Pair models a user could register, for the build's model-score tests (``--model_score tests.pipeline.score_models:NAME``).

Named ``MODULE:NAME`` in a build, each worker process imports this module
before it looks the model up, as a user's own module would be.

- ``colour_words``: the cosine of the picture's mean colour and the colour
  its alt-text names (mid-grey when it names none), both around mid-grey;
  cheap, deterministic, spread over [-1, 1], with ties (same picture, same
  colour word).
- ``loads``: how many times this process built a model, per name.
"""

import collections

import numpy as np

from filters import model_score

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 60, 220), "yellow": (235, 215, 40),
           "orange": (245, 140, 20), "purple": (140, 40, 170), "white": (250, 250, 250), "black": (10, 10, 10)}
LOADS = collections.Counter()


def _around_grey(vectors):
    vectors = np.asarray(vectors, np.float64) - 127.5
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def named_colour(text: str):
    for word in text.lower().split():
        if word in COLOURS:
            return COLOURS[word]
    return (128.0, 127.0, 127.0)  # none named: nearly grey, a weak direction of its own


class ColourWords:
    name = "colour_words"
    decode_size = 32

    def __init__(self, batch_size=8):
        self.batch_size = int(batch_size)
        self.batches = []

    def describe(self):
        return f"colour words (batches of {self.batch_size})"

    def score_images(self, images, texts):
        self.batches.append(len(images))
        means = _around_grey([np.asarray(image, np.float64).reshape(-1, 3).mean(0) for image in images])
        named = _around_grey([named_colour(text) for text in texts])
        return np.einsum("nd,nd->n", means, named).astype(np.float32)


@model_score.register("colour_words")
def colour_words(batch_size=8):
    LOADS["colour_words"] += 1
    return ColourWords(batch_size)
