"""Evaluation data from local files, in the layouts people already have.

Three layouts, no download at run time:

* a shard directory (TFDS layout: ``<name>-<split>.tfrecord-*-of-*``, this
  project's shards and anything with the same features): ``shard_split``
  checks it and says what is wrong in one line; the evaluators read it with
  ``trainer.input_pipeline``;
* a captions file in the Karpathy-split JSON of Flickr8K/30K and MSCOCO
  (``{"images": [{"filename", "filepath"?, "split", "sentences": [{"raw"}]}]}``)
  beside a folder of images: ``karpathy_split`` gives the images of one split
  (``test`` by default) with their several captions each;
* an image-folder classification set ``<root>/<class>/*.{jpg,jpeg,png}`` with
  an optional class-name file: ``labelled_folder``.

Every problem with a file (missing, unreadable JSON, a record without
captions, an image the JSON names but the folder lacks) raises
``EvalDataError`` whose message is one line naming the file; the command
lines print it as is.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Optional

import numpy as np


class EvalDataError(ValueError):
    """A missing or malformed evaluation file; the message is one line for the person."""


@dataclass(frozen=True)
class CaptionedImages:
    """Images with one or more captions each (Flickr30K: 5 per image)."""

    image_paths: list  # [num_images] str
    captions: list     # [num_images] list of str, at least one each

    @property
    def num_captions(self) -> int:
        return sum(len(c) for c in self.captions)

    def pairs(self) -> tuple[list, np.ndarray]:
        """(every caption, the index of its image): the flat form the retrieval metric takes."""
        flat = [caption for captions in self.captions for caption in captions]
        image_of = np.repeat(np.arange(len(self.captions)), [len(c) for c in self.captions])
        return flat, image_of


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def shard_split(data_dir: str, split: str) -> list[str]:
    """The shard files of ``split`` in ``data_dir``; one-line errors when there are none."""
    from trainer.input_pipeline import list_shards

    gfile = _gfile()
    if not gfile.isdir(data_dir):
        raise EvalDataError(f"{data_dir}: no such directory (expected a shard directory)")
    try:
        return list_shards(data_dir, split)
    except FileNotFoundError:
        from common.corpus_dir import read_dir

        splits = sorted({m.group(1) for name in gfile.listdir(read_dir(data_dir))
                         if (m := re.search(r"-([^-]+)\.tfrecord-\d+-of-\d+$", name))})
        raise EvalDataError(f"{data_dir}: no shards of split {split!r} (splits present: "
                            f"{', '.join(splits) or 'none'})") from None


def karpathy_split(captions_file: str, image_dir: str, split: str = "test") -> CaptionedImages:
    """The images of ``split`` in a Karpathy-split JSON, with their captions, in file order.

    An image's path is ``<image_dir>/<filepath>/<filename>`` when the record
    has a ``filepath`` (MSCOCO: ``val2014``) and that file exists, else
    ``<image_dir>/<filename>`` (Flickr). ``restval`` is a split of its own.
    """
    gfile = _gfile()
    if not gfile.exists(captions_file):
        raise EvalDataError(f"{captions_file}: no such captions file")
    if not gfile.isdir(image_dir):
        raise EvalDataError(f"{image_dir}: no such image directory")
    try:
        with gfile.GFile(captions_file, "r") as f:
            table = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EvalDataError(f"{captions_file}: not JSON ({error})") from None
    records = table.get("images") if isinstance(table, dict) else None
    if not isinstance(records, list):
        raise EvalDataError(f"{captions_file}: not a Karpathy-split file (no top-level \"images\" list)")
    paths, captions, missing, splits = [], [], [], set()
    for number, record in enumerate(records):
        where = f"{captions_file}: images[{number}]"
        if not isinstance(record, dict) or not isinstance(record.get("filename"), str):
            raise EvalDataError(f"{where} has no \"filename\"")
        splits.add(str(record.get("split")))
        if record.get("split") != split:
            continue
        sentences = record.get("sentences")
        if not isinstance(sentences, list):
            raise EvalDataError(f"{where} ({record['filename']}) has no \"sentences\" list")
        raws = []
        for sentence in sentences:
            raw = sentence.get("raw") if isinstance(sentence, dict) else None
            if raw is None and isinstance(sentence, dict) and isinstance(sentence.get("tokens"), list):
                raw = " ".join(sentence["tokens"])   # some copies keep only the tokens
            if not isinstance(raw, str) or not raw.strip():
                raise EvalDataError(f"{where} ({record['filename']}) has a sentence without \"raw\" text")
            raws.append(raw.strip())
        if not raws:
            raise EvalDataError(f"{where} ({record['filename']}) has no captions")
        path = os.path.join(image_dir, record["filename"])
        if record.get("filepath"):
            nested = os.path.join(image_dir, record["filepath"], record["filename"])
            if gfile.exists(nested) or not gfile.exists(path):
                path = nested
        if not gfile.exists(path):
            missing.append(path)
        paths.append(path)
        captions.append(raws)
    if not paths:
        raise EvalDataError(f"{captions_file}: no images in split {split!r} (splits present: "
                            f"{', '.join(sorted(splits)) or 'none'})")
    if missing:
        raise EvalDataError(f"{captions_file}: {len(missing)} of {len(paths)} {split} images are not in "
                            f"{image_dir} (first: {missing[0]})")
    return CaptionedImages(paths, captions)


def read_class_names(path: str, directories: list) -> list:
    """Prompt names for the class directories, from ``path``.

    Accepted: JSON (a ``{directory: name}`` object, or a list of names in the
    directories' sorted order); or text, one class a line, either
    ``directory<TAB>name`` or just the name (then in the directories' sorted
    order, as ImageNet's ``classnames.txt`` is). Directories the file does
    not name keep their own name (underscores read as spaces).
    """
    gfile = _gfile()
    if not gfile.exists(path):
        raise EvalDataError(f"{path}: no such class-name file")
    with gfile.GFile(path, "r") as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            table = json.loads(text)
        except json.JSONDecodeError as error:
            raise EvalDataError(f"{path}: not JSON ({error})") from None
    else:
        lines = [line.rstrip("\r") for line in text.splitlines() if line.strip()]
        tabbed = [line for line in lines if "\t" in line]
        if tabbed and len(tabbed) != len(lines):
            raise EvalDataError(f"{path}: mixes 'directory<TAB>name' lines and bare names")
        table = dict(line.split("\t", 1) for line in lines) if tabbed else [line.strip() for line in lines]
    if isinstance(table, list):
        if len(table) != len(directories) or not all(isinstance(n, str) for n in table):
            raise EvalDataError(f"{path}: {len(table)} class names for {len(directories)} class directories")
        return list(table)
    if not isinstance(table, dict):
        raise EvalDataError(f"{path}: expected a list of names or a {{directory: name}} object")
    unknown = sorted(set(table) - set(directories))
    if unknown:
        raise EvalDataError(f"{path}: names classes that have no directory: {', '.join(unknown[:5])}")
    return [str(table.get(d, d.replace("_", " "))) for d in directories]


def labelled_folder(root: str, class_names_file: Optional[str] = None):
    """``<root>/<class>/*`` -> (paths, labels, directory names, prompt names)."""
    from trainer.evaluators import image_folder

    if not _gfile().isdir(root):
        raise EvalDataError(f"{root}: no such image folder (expected <root>/<class>/*.jpg)")
    try:
        paths, labels, directories = image_folder(root)
    except FileNotFoundError as error:
        raise EvalDataError(str(error)) from None
    names = (read_class_names(class_names_file, directories) if class_names_file
             else [d.replace("_", " ") for d in directories])
    return paths, labels, directories, names
