"""Shared trainer fixtures: a tiny corpus in the shard format, a tiny eval folder.

``tiny_corpus`` is a TFDS-layout directory written with the pipeline's own
pieces (``common.tfrecord_io`` Examples of ``common.schema.FEATURES``, file
names from ``common.schema.shard_filename``, ``dataset_info.json`` and
``features.json`` from ``pipeline.publish.tfds_metadata.write_metadata``; so
``tfds.builder_from_directory`` loads it), filled with procedurally drawn
scenes (one coloured shape on a plain background) and alt-texts describing
them, plus a ``vocab.txt`` learned from those alt-texts by ``trainer.vocab``.

Layout (all numbers are module constants so tests can assert against them):
  train:      64 pairs in 3 shards of unequal size (22, 21, 21)
  validation: 16 pairs in 2 shards (8, 8)
"""

from __future__ import annotations

import hashlib
import io
import os

import numpy as np
import pytest
from PIL import Image, ImageDraw

from common import schema
from common import tfrecord_io as tfrecord

CORPUS_NAME = "tiny_corpus"
SPLIT_SIZES = {"train": 64, "validation": 16}
SPLIT_NUM_SHARDS = {"train": 3, "validation": 2}
TINY_VOCAB_SIZE = 200
TINY_MAX_LEN = 16

SHAPES = ("circle", "square", "triangle")
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (30, 60, 220),
    "yellow": (235, 215, 40),
    "purple": (140, 40, 170),
    "orange": (245, 140, 20),
}
BACKGROUNDS = {"white": (245, 245, 245), "grey": (128, 128, 128), "black": (15, 15, 15)}
CAPTION_TEMPLATES = (
    "a {size} {colour} {shape} on a {background} background",
    "{colour} {shape}",
    "photo of a {colour} {shape}",
    "a {colour} {shape} drawn on {background}",
    "simple {size} {shape} in {colour}",
)

EVAL_SPLIT_SIZES = {"train": 4, "test": 3}  # images per class


def draw_shape(shape, colour, background, width, height, rng, scale=(0.3, 0.45), offset=0.1):
    """One RGB scene: a filled shape roughly centred on a plain background."""
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    half = rng.uniform(*scale) * min(width, height)
    cx = width / 2 + rng.uniform(-offset, offset) * width
    cy = height / 2 + rng.uniform(-offset, offset) * height
    box = (cx - half, cy - half, cx + half, cy + half)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - half), (cx + half, cy + half), (cx - half, cy + half)], fill=colour)
    else:
        raise ValueError(shape)
    return image, half


def write_split(data_dir, name, split, records, num_shards):
    """Writes ``records`` as ``num_shards`` contiguous shards; returns the shard lengths."""
    from pipeline.write.shards import write_contiguous_shards

    return write_contiguous_shards(data_dir, name, split, [tfrecord.encode_example(r) for r in records], num_shards)


def make_scene_record(rng, split, index):
    shape = SHAPES[index % len(SHAPES)]
    colour = list(COLOURS)[rng.integers(len(COLOURS))]
    background = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
    width, height = int(rng.integers(64, 113)), int(rng.integers(56, 97))
    image, half = draw_shape(shape, COLOURS[colour], BACKGROUNDS[background], width, height, rng)
    size = "large" if half > 0.38 * min(width, height) else "small"
    template = CAPTION_TEMPLATES[rng.integers(len(CAPTION_TEMPLATES))]
    text = template.format(size=size, colour=colour, shape=shape, background=background)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    jpeg = buffer.getvalue()
    url = f"https://example.com/{split}/{index}.jpg"
    record = {
        "image": jpeg,
        "texts": text,
        "key": schema.make_key(url, text),
        "url": url,
        "width": width,
        "height": height,
        "original_width": width,
        "original_height": height,
        "sha256": hashlib.sha256(jpeg).hexdigest(),
        "phash": f"{int(rng.integers(2**63)):016x}",
    }
    assert list(record) == list(schema.FEATURES)  # the Example's feature order is the contract's
    return record


@pytest.fixture(scope="session")
def tiny_corpus(made_once):
    """Path (str) of a tiny shard directory with train/validation splits and vocab.txt.

    Made once per test run (``made_once``) and read by every worker process: tests never change it (they copy
    it first), and ``tiny_trained``, made once too, names it in its config.
    """
    from pipeline.publish.tfds_metadata import write_metadata as write_tfds_metadata
    from trainer.vocab import build_vocab

    def make(directory):
        data_dir = str(directory)
        rng = np.random.default_rng(0)
        shard_lengths = {}
        for split, size in SPLIT_SIZES.items():
            records = [make_scene_record(rng, split, i) for i in range(size)]
            shard_lengths[split] = write_split(data_dir, CORPUS_NAME, split, records, SPLIT_NUM_SHARDS[split])
        write_tfds_metadata(data_dir, CORPUS_NAME, shard_lengths, description="trainer test corpus")
        build_vocab(data_dir, TINY_VOCAB_SIZE)
        open(os.path.join(data_dir, "COMPLETED"), "w").close()  # a finished build

    return str(made_once(CORPUS_NAME, make))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_corpus):
    """``Tokenizer`` over the tiny corpus's vocab, ``max_len=TINY_MAX_LEN``.

    Shared because building one traces the BERT ops (seconds on a busy core).
    """
    from trainer.tokenizer import Tokenizer

    return Tokenizer(os.path.join(tiny_corpus, "vocab.txt"), max_len=TINY_MAX_LEN)


@pytest.fixture(scope="session")
def tiny_eval_folder(made_once):
    """Root (str) of ``{train,test}/<shape>/*.png``: the sample corpus's eval layout (made once per test run).

    Shapes stay inside the central 85% so ALIGN's eval crop (289 of 346,
    about 83.5% of the side) never cuts them.
    """
    def make(root):
        rng = np.random.default_rng(1)
        for split, per_class in EVAL_SPLIT_SIZES.items():
            for shape in SHAPES:
                class_dir = root / split / shape
                class_dir.mkdir(parents=True)
                for i in range(per_class):
                    colour = list(COLOURS.values())[rng.integers(len(COLOURS))]
                    background = list(BACKGROUNDS.values())[rng.integers(len(BACKGROUNDS))]
                    image, _ = draw_shape(shape, colour, background, 64, 64, rng, scale=(0.22, 0.3), offset=0.05)
                    image.save(class_dir / f"{i:03d}.png")

    return str(made_once("tiny_eval", make))


@pytest.fixture(scope="session")
def tiny_karpathy(tiny_eval_folder, tmp_path_factory):
    """(captions_file, image_dir): a Karpathy-split JSON in Flickr30K's format over tiny_eval_folder.

    The ``test`` split holds one image per shape with two captions each
    naming the shape; the train images of the folder form the ``train``
    split (which the evaluators must ignore). Real-format records:
    ``filename``, ``imgid``, ``split``, ``sentids`` and ``sentences`` with
    ``tokens``, ``raw``, ``imgid``, ``sentid``.
    """
    import json

    images, sentid = [], 0
    for split, folder_split, per_class in (("train", "train", 2), ("test", "test", 1)):
        for shape in SHAPES:
            for i in range(per_class):
                raws = [f"a {shape} on a plain background.", f"A drawing of one {shape}"]
                sentences = [{"tokens": raw.lower().rstrip(".").split(), "raw": raw, "imgid": len(images),
                              "sentid": sentid + j} for j, raw in enumerate(raws)]
                images.append({"filename": f"{folder_split}/{shape}/{i:03d}.png", "imgid": len(images),
                                "split": split, "sentids": [s["sentid"] for s in sentences],
                                "sentences": sentences})
                sentid += len(raws)
    path = tmp_path_factory.mktemp("karpathy") / "dataset_tiny.json"
    path.write_text(json.dumps({"images": images, "dataset": "tiny"}))
    return str(path), tiny_eval_folder


def tiny_train_config(data_dir, cache_dir, **overrides):
    """The ``tiny`` config shrunk to a few CPU seconds per step (image 32, batch 8, 16 tokens)."""
    from trainer.configs import tiny

    config = tiny.get_config()
    config.data_dir = data_dir
    config.total_steps = 2
    config.batch_size = 8
    config.image_size = 32
    config.resize_size = 36
    config.max_text_len = TINY_MAX_LEN
    config.log_every = 1
    config.checkpoint_every = 100
    config.eval_batch_size = 8
    config.compilation_cache_dir = cache_dir
    config.xla_cpu_fast_compile = True
    config.update(overrides)
    return config


@pytest.fixture(scope="session")
def tiny_trained(tiny_corpus, tiny_eval_folder, made_once, jax_cache_dir):
    """(workdir, final metrics) of a 2-step tiny run with retrieval, zero-shot and kNN evaluators, and a
    checkpoint at each step (``test_damaged_checkpoint`` damages copies of the newest).

    Trained once per test run (``made_once``: the worker processes read one run instead of training their
    own); tests never change its workdir (they copy it first).
    """
    import json

    from trainer import train

    def make(directory):
        workdir = str(directory / "run")
        config = tiny_train_config(tiny_corpus, jax_cache_dir, eval_dir=tiny_eval_folder, checkpoint_every=1,
                                   keep_checkpoints=5)
        config.evals = {"retrieval": {"split": "validation"},
                        "zeroshot": {"image_dir": "{eval_dir}/test"},
                        "knn": {"train_dir": "{eval_dir}/train", "test_dir": "{eval_dir}/test"}}
        final = train.train_and_evaluate(config, workdir)
        (directory / "final.json").write_text(json.dumps(final))

    made = made_once("tiny_trained", make)
    return str(made / "run"), json.loads((made / "final.json").read_text())
