"""TOnICS tagging: the text filters' words, nouns as phrases, longest match, image-side labels."""

from common.ontology import from_dict, load
from filters.concepts import Tagger, encode, parse_labels

SHAPES = from_dict({"classes": {"circle": ["circle", "circles"], "star": ["star", "stars"],
                                "ring": ["ring", "rings"]}})


def test_nouns_match_whole_words_case_and_punctuation_insensitive():
    tag = Tagger(SHAPES).tag
    assert tag("Two RED Circles, one star!") == ("circle", "star")     # ontology order, once each
    assert tag("a starfish near the ring-road") == ("ring",)           # "starfish" is not "star"
    assert tag("a semicircle") == ()
    assert tag("") == ()


def test_longest_noun_wins_where_nouns_overlap():
    tag = Tagger(load("default")).tag
    assert tag("a hot dog stand") == ("hot_dog",)
    assert tag("a dog eating a hot dog") == ("dog", "hot_dog")
    assert tag("Puppies on a sofa") == ("dog", "couch")
    assert tag("a teddy bear and a brown bear") == ("bear", "teddy_bear")


def test_image_labels_narrow_the_text_classes():
    tag = Tagger(SHAPES).tag
    assert tag("a circle and a star", image_labels=parse_labels("star, square")) == ("star",)
    assert tag("a circle", image_labels=parse_labels("")) == ()
    assert parse_labels(" Star;circle  ring ") == ("star", "circle", "ring")
    assert encode(("circle", "star")) == "circle star"
