"""What the sample's pictures and alt-texts say: the wording of drawn scenes and the labelled evaluation set.

The demo's model learns what these alt-texts tell pictures apart by; the
shares they name colours and backgrounds at are part of the sample's
contract with ``trainer/configs/tiny.py`` (RESULTS "Tiny demo").
"""

import numpy as np
import pytest

from filters.text import normalize_text, words
from filters import text as text_rules
from samplegen import content, evalset, generate, scenes
from samplegen import plan as plan_lib


NUM_ORDINARY = 400


@pytest.fixture(scope="module")
def plan():
    """A plan (not written) of 400 ordinary candidates and every planted case."""
    return generate.build_plan(NUM_ORDINARY, seed=4)


@pytest.fixture(scope="module")
def scene_rows(plan):
    """The drawn scenes among the plan's ordinary candidates: ~320."""
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


def shape_words(caption: str) -> set:
    """The shapes an alt-text names (singular or plural)."""
    said = set(words(normalize_text(caption)))
    return {shape for shape in scenes.SHAPES if {shape, scenes.PLURALS[shape]} & said}


def test_mismatched_pairs_are_the_stated_share_and_describe_another_scene(plan):
    """Well-formed alt-texts of drawn scenes, on pictures that show none of the shapes they name."""
    found = [r for r in plan.rows if r.case == "mismatched_pair"]
    assert len(found) == round(plan_lib.MISMATCHED_SHARE * NUM_ORDINARY) > 0
    assert 0.02 <= plan_lib.MISMATCHED_SHARE <= 0.1  # "a few percent", as web alt-text noise
    kinds = set()
    for row in found:
        assert row.pairing == plan_lib.MISMATCHED and row.expected == plan_lib.WRITTEN
        picture = row.recipe.content
        kinds.add(picture["kind"])
        named = shape_words(row.caption)
        assert named, row.caption  # worded for a drawn scene: it names its shapes
        assert named.isdisjoint(scenes.scene_shapes(picture)), (row.caption, scenes.scene_shapes(picture))
        # What ALIGN's per-record text rules ask (the build keeps them: tests/pipeline/build/test_build_sample.py).
        text = normalize_text(row.caption)
        assert 3 <= text_rules.word_count(text) <= 20 and text == normalize_text(text)
    assert kinds == {"scene", "photo"}  # pictures drawn as ordinary ones are
    # No word gives them away: every word of theirs is in the clean alt-texts too.
    clean = set()
    for row in plan.rows:
        if row.pairing == plan_lib.CLEAN:
            clean.update(caption_words(row))
    for row in found:
        assert caption_words(row) <= clean, row.caption


def test_every_row_to_be_written_states_its_pairing(plan):
    written = [r for r in plan.rows if r.expected in (plan_lib.WRITTEN, plan_lib.WRITTEN_ONCE)]
    pairings = {r.pairing for r in written}
    assert pairings == {plan_lib.CLEAN, plan_lib.MISMATCHED}
    assert {r.case for r in written if r.pairing == plan_lib.MISMATCHED} == {"mismatched_pair"}
    # A clean drawn scene's alt-text names only shapes the picture shows.
    for row in written:
        if row.pairing == plan_lib.CLEAN and row.recipe.content["kind"] == "scene":
            assert shape_words(row.caption) <= set(scenes.scene_shapes(row.recipe.content)), row.caption
