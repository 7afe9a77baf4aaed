"""A trained checkpoint's pair scores (``trainer.pair_score`` through ``filters.model_score``).

The score of a pair is the cosine ``trainer.embed`` exports for it: the same
checkpoint (the session's tiny run), the same pairs (its validation split,
and the same images with other pairs' alt-texts), compared number by number.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from filters import model_score
from trainer import embed, pair_score, preprocess
from trainer.input_pipeline import parse_fields


@pytest.fixture(scope="module")
def exported(tiny_trained, tiny_corpus, tmp_path_factory):
    """trainer.embed's export of the validation split: (keys, captions, image vectors, text vectors)."""
    out = str(tmp_path_factory.mktemp("pair_embeddings"))
    embed.export(tiny_trained[0], embed.ShardSource(tiny_corpus, "validation"), out)
    table, _ = embed.read_embeddings(out)
    return (table.column("key").to_pylist(), table.column("caption").to_pylist(),
            np.stack(table.column("image_embedding").to_pylist()),
            np.stack(table.column("text_embedding").to_pylist()))


@pytest.fixture(scope="module")
def shard_pairs(tiny_corpus):
    """(keys, image bytes, captions) of the validation split, in the order trainer.embed reads it."""
    (serialized, _), = [raw for _, raw in embed.ShardSource(tiny_corpus, "validation").parts(10_000)]
    rows = [parse_fields(tf.constant(record), ("image", "texts", "key")) for record in serialized]
    return ([r["key"].numpy().decode() for r in rows], [r["image"].numpy() for r in rows],
            [r["texts"].numpy().decode() for r in rows])


@pytest.fixture(scope="module")
def scorer(tiny_trained):
    return model_score.PairScorer("checkpoint", workdir=tiny_trained[0], batch_size=5)


def test_scores_are_the_cosines_trainer_embed_gives(exported, shard_pairs, scorer, monkeypatch):
    keys, captions, image_vectors, text_vectors = exported
    pair_keys, images, texts = shard_pairs
    assert pair_keys == keys and texts == captions and len(keys) == 16
    # The pairs as written, and the same images with other pairs' alt-texts.
    other = np.roll(np.arange(len(keys)), 5)
    want = np.concatenate([np.einsum("nd,nd->n", image_vectors, text_vectors),
                           np.einsum("nd,nd->n", image_vectors, text_vectors[other])])
    texts = texts + [texts[i] for i in other]
    images = images + images
    model = scorer.model
    assert model.decode_size == 36 and model.image_size == 32  # the tiny test run's resize and crop
    # Pixels decoded by the trainer's own decode op: the same numbers (batches of 5, padded; the run's are 8).
    decode = preprocess.get_preprocess_fn(f"decode({model.decode_size})")
    pixels = [Image.fromarray(decode({"image": tf.constant(data)})["image"].numpy()) for data in images]
    np.testing.assert_allclose(scorer.score_decoded(pixels, texts), want, atol=1e-5)
    # Images of different sizes share a padded batch (64-113 px here); alone they score the same.
    monkeypatch.setattr(pair_score, "GROUP_PIXELS", 1)
    np.testing.assert_allclose(scorer.score_decoded(pixels, texts), want, atol=1e-5)
    monkeypatch.undo()
    # From the bytes, decoded as the build decodes (PIL): up to the IDCT's rounding (PIL's accurate
    # one, TensorFlow's fast one; a squashed instead of cropped image is ~0.02 off here).
    from_bytes = scorer.score(images, texts)
    np.testing.assert_allclose(from_bytes, want, atol=4e-3)
    assert np.abs(from_bytes - want).mean() < 1e-3


def _copy_run(tiny_trained, tmp_path, edit_config=None):
    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_trained[0], workdir)
    if edit_config:
        path = os.path.join(workdir, "config.json")
        with open(path) as f:
            config = json.load(f)
        edit_config(config)
        with open(path, "w") as f:
            json.dump(config, f)
    return workdir


def _set(path, value):
    def edit(config):
        *parents, last = path.split(".")
        for name in parents:
            config = config[name]
        config[last] = value
    return edit


def _no_checkpoints(tiny_trained, tmp_path):
    workdir = _copy_run(tiny_trained, tmp_path)
    shutil.rmtree(os.path.join(workdir, "checkpoints"))
    return workdir


def _other_vocabulary(tiny_trained, tmp_path):
    workdir = _copy_run(tiny_trained, tmp_path)
    with open(os.path.join(workdir, "vocab.txt")) as f:
        tokens = f.read().split("\n")
    with open(os.path.join(workdir, "vocab.txt"), "w") as f:
        f.write("\n".join(tokens[: len(tokens) // 2]))  # a vocabulary the text tower was not trained with
    return workdir


def _no_vocabulary(tiny_trained, tmp_path):
    workdir = _copy_run(tiny_trained, tmp_path, _set("vocab_path", str(tmp_path / "nowhere" / "vocab.txt")))
    os.remove(os.path.join(workdir, "vocab.txt"))
    return workdir


@pytest.mark.parametrize("make,kwargs,message", [
    (lambda run, tmp: str(tmp / "no_run"), {}, "no such directory"),
    (lambda run, tmp: str(tmp), {}, "no config.json, not a trainer.train workdir"),
    (_no_checkpoints, {}, "no checkpoint in "),
    (lambda run, tmp: run[0], {"step": 7}, "no checkpoint of step 7 in .* \\(steps: 1, 2\\)"),
    (_no_vocabulary, {}, "its vocabulary .*nowhere/vocab.txt is missing"),
    (lambda run, tmp: _copy_run(run, tmp, _set("model.name", "classifier")), {},
     "not a two-tower image-text model \\(model.name 'classifier'\\)"),
    (lambda run, tmp: _copy_run(run, tmp, _set("model.embed_dim", 64)), {},
     "step 2 does not fit the model its config.json describes \\(.*do not match at params.image_tower"),
    (lambda run, tmp: _copy_run(run, tmp, _set("model.image.filters", [16, 32, 64, 64, 128, 128])), {},
     # whichever array of the changed layers orbax checks first: one dimension 16 where the checkpoint has 32
     "step 2 does not fit .*\\(Requested shape: \\((?P<before>(?:\\d+, )*)16(?P<after>(?:, \\d+)*),?\\) is not "
     "compatible with the stored shape: \\((?P=before)32(?P=after),?\\)\\)"),
    (_other_vocabulary, {}, "step 2 does not fit the model its config.json describes"),
], ids=["missing", "not_a_run", "no_checkpoint", "no_such_step", "no_vocabulary", "not_two_tower",
        "other_embed_dim", "other_image_tower", "other_vocabulary"])
def test_a_missing_or_foreign_checkpoint_is_one_line(tiny_trained, tmp_path, make, kwargs, message):
    workdir = make(tiny_trained, tmp_path)
    scorer = model_score.PairScorer("checkpoint", workdir=workdir, **kwargs)
    with pytest.raises(ValueError) as error:
        scorer.check()
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"model score checkpoint {workdir}: "), text
    assert len(text) < 300
    assert re.search(message, text), text


def test_a_build_records_the_cosines_trainer_embed_gives(tiny_trained, exported, shard_pairs, tmp_path):
    """Through the build's first pass: the validation pairs as candidates, every one cut (threshold 1), so the
    ledger holds each pair's recorded score; and a mismatched copy of each image scores what embed says too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from common.schema import make_key
    from pipeline.build import launcher

    from corpus_paths import committed

    keys, captions, image_vectors, text_vectors = exported
    _, images, texts = shard_pairs
    other = np.roll(np.arange(len(keys)), 5)
    urls = [f"https://example.com/validation/{i}.jpg" for i in range(len(keys))]
    urls += [f"https://example.com/swapped/{i}.jpg" for i in range(len(keys))]
    captions_in = texts + [texts[i] for i in other]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"url": urls, "caption": captions_in, "jpg": images + images}),
                   tmp_path / "in" / "part-0.parquet")
    want = np.concatenate([np.einsum("nd,nd->n", image_vectors, text_vectors),
                           np.einsum("nd,nd->n", image_vectors, text_vectors[other])])
    funnel = launcher.run([
        "--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out"),
        "--set", "min_shorter_side=0", "--set", "min_words=1", "--set", "vocab_size=0", "--set", "nsfw_threshold=1",
        "--model_score", "checkpoint", "--model_score_arg", f"workdir={tiny_trained[0]}",
        "--model_score_arg", "batch_size=5", "--set", "model_score_threshold=1.0"])
    assert next(r for r in funnel["stages"] if r["stage"] == "model_score")["rejected"] == {
        "model_score/below_threshold": 32}
    recorded = {}
    for path in (committed(tmp_path / "out") / "stats" / "rejected").glob("*.jsonl"):
        recorded.update((row["key"], row["model_score"]) for row in map(json.loads, path.read_text().splitlines()))
    got = np.array([recorded[make_key(url, caption)] for url, caption in zip(urls, captions_in)])
    # As PairScorer.score from the same bytes (PIL's decode, not TensorFlow's): up to the IDCT's rounding.
    np.testing.assert_allclose(got, want, atol=4e-3)
    assert np.abs(got - want).mean() < 1e-3
    scorer = model_score.PairScorer("checkpoint", workdir=tiny_trained[0], batch_size=5)
    np.testing.assert_allclose(got, scorer.score(images + images, captions_in), atol=2e-6)  # the ledger's 6 digits
