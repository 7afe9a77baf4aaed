"""Evaluation data from local files: Karpathy-split JSON, class-name files, shard and image folders."""

import json
import os

import pytest

from trainer import eval_data
from trainer.eval_data import EvalDataError

SHAPES = ("circle", "square", "triangle")  # tiny_eval_folder's classes


def test_karpathy_reader_takes_the_test_split_with_every_caption(tiny_karpathy):
    captions_file, image_dir = tiny_karpathy
    data = eval_data.karpathy_split(captions_file, image_dir)
    assert data.image_paths == [os.path.join(image_dir, "test", shape, "000.png") for shape in SHAPES]
    assert data.captions == [[f"a {s} on a plain background.", f"A drawing of one {s}"] for s in SHAPES]
    assert data.num_captions == 6
    captions, image_of = data.pairs()
    assert captions[2:4] == data.captions[1] and image_of.tolist() == [0, 0, 1, 1, 2, 2]
    train = eval_data.karpathy_split(captions_file, image_dir, split="train")
    assert len(train.image_paths) == 6


def test_karpathy_reader_follows_mscoco_filepath_and_token_only_sentences(tmp_path):
    (tmp_path / "val2014").mkdir()
    (tmp_path / "val2014" / "COCO_val2014_000000000042.jpg").write_bytes(b"jpeg")
    table = {"images": [{"filepath": "val2014", "filename": "COCO_val2014_000000000042.jpg", "split": "test",
                         "cocoid": 42, "sentences": [{"tokens": ["a", "dog"]}, {"raw": " A cat. "}]}]}
    (tmp_path / "dataset_coco.json").write_text(json.dumps(table))
    data = eval_data.karpathy_split(str(tmp_path / "dataset_coco.json"), str(tmp_path))
    assert data.image_paths == [str(tmp_path / "val2014" / "COCO_val2014_000000000042.jpg")]
    assert data.captions == [["a dog", "A cat."]]


@pytest.mark.parametrize("content, message", [
    (None, "no such captions file"),
    ("{not json", "not JSON"),
    (json.dumps({"annotations": []}), "no top-level \"images\" list"),
    (json.dumps({"images": [{"split": "test"}]}), "images\\[0\\] has no \"filename\""),
    (json.dumps({"images": [{"filename": "a.png", "split": "test", "sentences": [{"raw": ""}]}]}),
     "sentence without \"raw\" text"),
    (json.dumps({"images": [{"filename": "a.png", "split": "train", "sentences": [{"raw": "x"}]}]}),
     "no images in split 'test' \\(splits present: train\\)"),
    (json.dumps({"images": [{"filename": "missing.png", "split": "test", "sentences": [{"raw": "x"}]}]}),
     "1 of 1 test images are not in .* \\(first: .*missing.png\\)"),
])
def test_karpathy_reader_errors_are_one_line_naming_the_file(tmp_path, content, message):
    path = tmp_path / "captions.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(EvalDataError, match=message) as error:
        eval_data.karpathy_split(str(path), str(tmp_path))
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_a_missing_image_directory_is_named(tiny_karpathy, tmp_path):
    with pytest.raises(EvalDataError, match="no such image directory"):
        eval_data.karpathy_split(tiny_karpathy[0], str(tmp_path / "nowhere"))


@pytest.mark.parametrize("name, content, expected", [
    ("names.txt", "round thing\nbox\n", ["round thing", "box", "triangle"][:2]),
    ("names.txt", "square\tsquare box\n", ["circle", "square box"]),
    ("names.json", json.dumps({"circle": "round thing"}), ["round thing", "square"]),
    ("names.json", json.dumps(["a", "b"]), ["a", "b"]),
])
def test_class_name_files(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    assert eval_data.read_class_names(str(path), ["circle", "square"]) == expected


@pytest.mark.parametrize("name, content, message", [
    ("names.txt", "one\n", "1 class names for 2 class directories"),
    ("names.txt", "circle\tround\nbox\n", "mixes"),
    ("names.json", json.dumps({"hexagon": "six"}), "no directory: hexagon"),
    ("names.json", "[", "not JSON"),
])
def test_class_name_file_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(EvalDataError, match=message):
        eval_data.read_class_names(str(path), ["circle", "square"])


def test_labelled_folder_with_and_without_class_names(tiny_eval_folder, tmp_path):
    root = os.path.join(tiny_eval_folder, "test")
    paths, labels, directories, names = eval_data.labelled_folder(root)
    assert directories == list(SHAPES) and names == list(SHAPES) and len(paths) == 9
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    names_file = tmp_path / "names.txt"
    names_file.write_text("disc\nbox\npyramid\n")
    assert eval_data.labelled_folder(root, str(names_file))[3] == ["disc", "box", "pyramid"]
    with pytest.raises(EvalDataError, match="no such image folder"):
        eval_data.labelled_folder(str(tmp_path / "nowhere"))
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(EvalDataError, match="no images under"):
        eval_data.labelled_folder(str(tmp_path / "empty"))


def test_shard_split_names_the_splits_that_exist(tiny_corpus, tmp_path):
    assert len(eval_data.shard_split(tiny_corpus, "validation")) == 2
    with pytest.raises(EvalDataError, match="no shards of split 'test' \\(splits present: train, validation\\)"):
        eval_data.shard_split(tiny_corpus, "test")
    with pytest.raises(EvalDataError, match="no such directory"):
        eval_data.shard_split(str(tmp_path / "nowhere"), "validation")
