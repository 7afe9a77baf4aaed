"""The TOnICS ontology as data: the built-in English one, and a user's file validated with one-line errors."""

import json

import pytest

from common import ontology
from common.ontology import OntologyError

COCO = (
    "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant stop_sign "
    "parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe backpack umbrella handbag tie "
    "suitcase frisbee skis snowboard sports_ball kite baseball_bat baseball_glove skateboard surfboard "
    "tennis_racket bottle wine_glass cup fork knife spoon bowl banana apple sandwich orange broccoli carrot "
    "hot_dog pizza donut cake chair couch potted_plant bed dining_table toilet tv laptop mouse remote keyboard "
    "cell_phone microwave oven toaster sink refrigerator book clock vase scissors teddy_bear hair_drier "
    "toothbrush"
).split()


def test_default_covers_coco_with_plurals_and_synonyms():
    default = ontology.load("default")
    assert len(COCO) == 80
    assert default.class_names[:80] == tuple(COCO)
    nouns = default.nouns()
    assert nouns["dog"] == nouns["dogs"] == nouns["puppy"] == "dog"        # the paper's example
    assert nouns["hot dog"] == "hot_dog" and nouns["sofa"] == "couch" and nouns["mice"] == "mouse"
    for name, words in default.classes:
        assert len(words) >= 1
        if name not in ("broccoli", "scissors", "sheep"):
            assert len(words) >= 2, name                                  # a plural or synonym at least


def test_user_file(tmp_path):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"root": "thing", "classes": {"circle": ["Circle", "circles", " round  dot "]}}))
    loaded = ontology.load(str(path))
    assert loaded.root == "thing" and loaded.class_names == ("circle",)
    assert loaded.classes[0][1] == ("circle", "circles", "round dot")
    assert ontology.from_dict(loaded.to_json()).classes == loaded.classes


@pytest.mark.parametrize("data, message", [
    ([1, 2], "expected a JSON object"),
    ({"classes": {}}, "non-empty object"),
    ({"classes": {"Dog": ["dog"]}}, "'Dog' must be a lower-case word"),
    ({"classes": {"entity": ["thing"]}}, "other than the root"),
    ({"classes": {"dog": "dog"}}, "non-empty list of nouns"),
    ({"classes": {"dog": ["dog", ""]}}, "non-empty string"),
    ({"classes": {"dog": ["dog"], "puppy": ["dog"]}}, "'dog' is in both 'dog' and 'puppy'"),
    ({"classes": {"dog": ["dog"]}, "colour": 1}, "unknown field"),
    ({"root": "The Root", "classes": {"dog": ["dog"]}}, "root must be"),
])
def test_invalid_ontologies_are_refused_in_one_line(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(OntologyError, match=message) as caught:
        ontology.load(str(path))
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(OntologyError, match="no such file"):
        ontology.load(str(tmp_path / "absent.json"))
    (tmp_path / "broken.json").write_text("{classes: ")
    with pytest.raises(OntologyError, match="not valid JSON"):
        ontology.load(str(tmp_path / "broken.json"))
