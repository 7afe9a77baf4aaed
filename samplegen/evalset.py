"""The evaluation set: labelled drawn shapes, ``eval/{train,test}/<class>/<class>_NNN.png``.

The eval/test images are the near-duplicate index of the sample's build
(set ``EVAL_SET``) and the zero-shot set of the trainer's evaluators.
"""

from __future__ import annotations

from typing import List, Tuple

from samplegen import scenes
from samplegen.drawers import draw_content
from samplegen.plan import STREAM_EVAL, seeded


EVAL_SET = "sample_eval"
EVAL_PER_CLASS = {"train": 20, "test": 10}
EVAL_SIZES = (256, 320)


def eval_path(split: str, label: str, index: int) -> str:
    return f"eval/{split}/{label}/{label}_{index:03d}.png"


def eval_specs(seed: int) -> List[Tuple[str, str, int, dict]]:
    """(split, class, index, spec) of every evaluation image."""
    specs = []
    for split_id, (split, per_class) in enumerate(EVAL_PER_CLASS.items()):
        for class_id, label in enumerate(scenes.SHAPES):
            for index in range(per_class):
                rng = seeded(seed, STREAM_EVAL, split_id, class_id, index)
                side = int(rng.integers(*EVAL_SIZES))
                spec = draw_content(rng, size=(side, side), photo_share=0, dominant=label, second_group=0.3,
                                    second_fewer=True)
                specs.append((split, label, index, spec))
    return specs
