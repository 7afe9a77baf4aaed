"""The rules a selection's --set re-applies: first reason wins, and a key's first kept row by keep_order is written."""

import math

import apache_beam as beam
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from filters.presets import get_preset
from pipeline.select.thresholds import ApplyThresholds, apply_to_rows, new_reason
from pipeline.stages.light_rows import LightRow
from pipeline.stages.verdicts import REPEAT


def row(key, sha, ordinal, nsfw=-math.inf, score=-math.inf):
    return LightRow(key, "https://e.x/" + key, "text", "", True, sha * 64, "p" * 16, 300, 300, "JPEG", "f", "parquet",
                    ordinal, nsfw_score=nsfw, model_score=score)


VALUES = get_preset("align", ["nsfw_threshold=0.5", "min_words=3", "max_word_repetition=0.5",
                              "model_score_threshold=0.2"])._by_name()


def test_the_first_rule_in_stage_order_gives_the_reason():
    assert new_reason(row("a", "1", 0), 2, 0.0, VALUES) == "text_length/too_few_words"
    assert new_reason(row("a", "1", 0, nsfw=0.9), 2, 0.0, VALUES) == "text_length/too_few_words"
    assert new_reason(row("a", "1", 0, nsfw=0.9, score=0.0), 5, 0.6, VALUES) == "text_repetition/repetitive"
    assert new_reason(row("a", "1", 0, nsfw=0.9, score=0.0), 5, 0.0, VALUES) == "nsfw/pornographic"
    assert new_reason(row("a", "1", 0, nsfw=0.1, score=0.0), 5, 0.0, VALUES) == "model_score/below_threshold"
    assert new_reason(row("a", "1", 0, nsfw=0.1, score=0.3), 5, 0.0, VALUES) == ""
    assert new_reason(row("a", "1", 0), 5, 0.0, VALUES) == ""  # unscored: the rules that score keep it


def measured():
    # key a: its written row (sha 1) now fails NSFW, its repeat (sha 2) passes and is written instead;
    # key b: both rows pass, the first by keep_order stays; key c: one row, rejected by words.
    return [(row("a", "1", 0, nsfw=0.9), 5, 0.0), (row("a", "2", 1, nsfw=0.1), 5, 0.0),
            (row("b", "3", 2), 5, 0.0), (row("b", "4", 3), 5, 0.0), (row("c", "5", 4), 1, 0.0)]


def fates(rows):
    return sorted((r.key, r.ordinal, r.reason) for r in rows)


def test_a_keys_first_kept_row_is_written_and_the_others_are_repeats():
    assert fates(apply_to_rows(measured(), VALUES)) == [
        ("a", 0, "nsfw/pornographic"), ("a", 1, ""), ("b", 2, ""), ("b", 3, REPEAT),
        ("c", 4, "text_length/too_few_words")]


def test_the_beam_transform_decides_as_the_list_rule():
    with test_pipeline.TestPipeline() as p:
        got = p | beam.Create(measured()) | ApplyThresholds(VALUES) | beam.Map(lambda r: (r.key, r.ordinal, r.reason))
        assert_that(got, equal_to(fates(apply_to_rows(measured(), VALUES))))
