"""What the sample's pictures and alt-texts say: the wording of drawn scenes and the labelled evaluation set.

The demo's model learns what these alt-texts tell pictures apart by; the
shares they name colours and backgrounds at are part of the sample's
contract with ``trainer/configs/tiny.py`` (RESULTS "Tiny demo").
"""

import numpy as np
import pytest

from filters.text import normalize_text, words
from samplegen import content, evalset, generate, scenes


@pytest.fixture(scope="module")
def scene_rows():
    """The drawn scenes among a plan's (not written) 400 ordinary candidates: ~320."""
    plan = generate.build_plan(400, seed=4)
    return [r for r in plan.rows if r.case == "ordinary" and r.recipe.content["kind"] == "scene"]


def caption_words(row) -> set:
    return set(words(normalize_text(row.caption)))


def test_scene_alt_texts_name_the_dominant_shape(scene_rows):
    assert len(scene_rows) > 30
    for row in scene_rows:
        shape = scenes.dominant_class(row.recipe.content)
        assert {shape, scenes.PLURALS[shape]} & caption_words(row), row.caption


def test_scene_alt_texts_seldom_name_colour_or_background(scene_rows):
    """Shape and count first, colour and background now and then (``content.COLOUR_NAMED``,
    ``BACKGROUND_NAMED``): with colour in nearly every alt-text, a small model matched
    pairs by colour and hardly learnt shape."""
    pairs = sum(len(r.recipe.content["groups"]) > 1 for r in scene_rows) / len(scene_rows)
    first, second = content.COLOUR_NAMED
    expected_colour = first + (1 - first) * second * pairs
    colour_words = {w for name in scenes.COLOURS for w in name.split()}
    named = [bool(colour_words & caption_words(r)) for r in scene_rows]
    backdrop = [bool({"background", "backdrop"} & caption_words(r)) for r in scene_rows]
    # ~320 rows: 0.08 is over 3 standard errors of either share.
    assert abs(np.mean(named) - expected_colour) < 0.08, (np.mean(named), expected_colour)
    assert abs(np.mean(backdrop) - content.BACKGROUND_NAMED) < 0.08, np.mean(backdrop)


def test_eval_pictures_show_their_class_most():
    """A labelled picture's second group is never more numerous than the labelled one, and covers less."""
    specs = evalset.eval_specs(seed=0)
    with_second = 0
    for _, label, _, spec in specs:
        labelled, *others = spec["groups"]
        assert labelled["shape"] == label
        for other in others:
            with_second += 1
            assert other["shape"] != label and other["count"] <= labelled["count"]
            assert sum(r * r for _, _, r, _ in other["items"]) < sum(r * r for _, _, r, _ in labelled["items"])
    assert with_second > 0.15 * len(specs)  # distractors stay
