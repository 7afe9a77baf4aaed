"""Evaluators on hand-made embeddings and fake encoders whose answers are known."""

import os

import numpy as np
import pytest

from common.vectors import l2_normalize
from trainer import evaluators
from trainer.evaluators import knn, retrieval, zeroshot
from trainer.input_pipeline import make_dataset

IMAGE_SIZE = 32
BATCH = 4
SHAPES = ("circle", "square", "triangle")  # tiny_eval_folder's classes
FILL_FRACTION = {"circle": np.pi / 4, "square": 1.0, "triangle": 0.5}  # of the bounding box


def one_hot(indices, depth):
    return np.eye(depth, dtype=np.float32)[np.asarray(indices)]


def fixed_batch(encode, batch_size):
    """Wraps a fake encoder, checking the evaluator always sends ``batch_size`` rows."""

    def wrapped(x):
        assert len(x) == batch_size, len(x)
        return encode(x)

    return wrapped


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    return tiny_tokenizer


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


def test_registry_maps_names_to_evaluators():
    assert evaluators.names() == ["gallery", "karpathy", "knn", "retrieval", "zeroshot"]
    assert evaluators.get("retrieval") is retrieval.RetrievalEvaluator
    assert evaluators.get("zeroshot") is zeroshot.ZeroShotEvaluator
    assert evaluators.get("knn") is knn.KnnEvaluator
    with pytest.raises(KeyError, match="unknown evaluator"):
        evaluators.get("linear_probe")


def test_encode_in_batches_pads_the_last_batch_and_drops_the_padding():
    batches = [np.arange(8.0).reshape(4, 2), np.arange(4.0).reshape(2, 2)]
    out = evaluators.encode_in_batches(fixed_batch(lambda x: x * 2, 4), batches, 4)
    np.testing.assert_array_equal(out, np.concatenate(batches) * 2)


# ---------------------------------------------------------------------------
# Retrieval metrics
# ---------------------------------------------------------------------------


def test_identity_embeddings_retrieve_perfectly_with_chance_reported():
    n = 50
    metrics = retrieval.retrieval_metrics(np.eye(n), np.eye(n), range(n), range(n))
    for direction in ("i2t", "t2i"):
        for k in (1, 5, 10):
            assert metrics[f"{direction}_R@{k}"] == 1.0
        assert metrics[f"{direction}_R@1_chance"] == pytest.approx(1 / n)
        assert metrics[f"{direction}_R@5_chance"] == pytest.approx(5 / n)
    assert metrics["num_pairs"] == metrics["num_images"] == metrics["num_captions"] == n


def test_random_embeddings_score_near_chance():
    rng = np.random.default_rng(0)
    n, dim = 1000, 32
    images = l2_normalize(rng.normal(size=(n, dim)))
    texts = l2_normalize(rng.normal(size=(n, dim)))
    metrics = retrieval.retrieval_metrics(images, texts, range(n), range(n))
    for direction in ("i2t", "t2i"):
        assert metrics[f"{direction}_R@10_chance"] == pytest.approx(0.01)
        assert abs(metrics[f"{direction}_R@10"] - 0.01) < 0.01  # 1000 queries: sd ~0.003
        assert metrics[f"{direction}_R@1"] < 0.006


def test_a_permutation_of_captions_scores_zero_at_rank_one():
    n = 20
    metrics = retrieval.retrieval_metrics(np.eye(n), np.roll(np.eye(n), 1, axis=0), range(n), range(n))
    assert metrics["i2t_R@1"] == metrics["t2i_R@1"] == 0.0


def test_ties_count_against_the_query_so_a_collapsed_model_scores_zero():
    n = 20
    same = np.ones((n, 4)) / 2.0
    metrics = retrieval.retrieval_metrics(same, same, range(n), range(n))
    assert all(metrics[f"{d}_R@{k}"] == 0.0 for d in ("i2t", "t2i") for k in (1, 5, 10))


def test_duplicate_captions_and_images_are_one_candidate_with_several_positives():
    e = np.eye(4, dtype=np.float32)
    shared = l2_normalize(e[0] + e[1])
    # Pairs 0 and 1: two images with the same caption; pairs 2 and 3: one image with two captions.
    images = np.stack([e[0], e[1], e[2], e[2]])
    texts = np.stack([shared, shared, e[2] + 0.1 * e[3], e[2] + 0.2 * e[3]])
    texts = l2_normalize(texts)
    metrics = retrieval.retrieval_metrics(images, texts, ["a", "b", "c", "c"], ["x", "x", "y", "z"])
    assert (metrics["num_pairs"], metrics["num_images"], metrics["num_captions"]) == (4, 3, 3)
    # Any tie-break among the copies is a hit: both directions are perfect.
    assert metrics["i2t_R@1"] == metrics["t2i_R@1"] == 1.0
    # i2t: images a, b have 1 positive of 3 captions, c has 2 -> (1/3 + 1/3 + 2/3) / 3.
    assert metrics["i2t_R@1_chance"] == pytest.approx(4 / 9)
    # t2i: caption x has 2 positive images of 3, y and z have 1 each.
    assert metrics["t2i_R@1_chance"] == pytest.approx(4 / 9)


def test_chance_recall_formula():
    assert retrieval.chance_recall(np.array([1]), 10, 5) == pytest.approx(0.5)
    assert retrieval.chance_recall(np.array([2]), 4, 1) == pytest.approx(0.5)
    assert retrieval.chance_recall(np.array([2]), 4, 2) == pytest.approx(1 - (2 / 4) * (1 / 3))
    assert retrieval.chance_recall(np.array([1]), 3, 10) == 1.0


def test_retrieval_evaluator_end_to_end_with_an_oracle_encoder(tiny_corpus, tokenizer):
    # The oracle knows which caption each validation image came with, read
    # through the same eval pipeline, so its recalls must be exactly 1.
    dataset = make_dataset(
        tiny_corpus, "validation", global_batch_size=BATCH, image_size=IMAGE_SIZE, train=False,
        seed=0, tokenizer=tokenizer, process_index=0, process_count=1,
    )
    caption_of_image, caption_index = {}, {}
    for batch in dataset.as_numpy_iterator():
        for image, text in zip(batch["image"], batch["text"]):
            caption = caption_index.setdefault(text.tobytes(), len(caption_index))
            caption_of_image[image.tobytes()] = caption
    depth = len(caption_index)

    def encode_texts(tokens):
        return one_hot([caption_index[row.tobytes()] for row in tokens], depth)

    def encode_images(images):
        return one_hot([caption_of_image[im.tobytes()] for im in images], depth)

    evaluator = evaluators.get("retrieval")(
        data_dir=tiny_corpus, split="validation", image_size=IMAGE_SIZE, tokenizer=tokenizer, batch_size=BATCH
    )
    metrics = evaluator.run(fixed_batch(encode_images, BATCH), fixed_batch(encode_texts, BATCH))
    assert metrics["num_pairs"] == 16 and metrics["num_captions"] == depth
    assert all(metrics[f"{d}_R@{k}"] == 1.0 for d in ("i2t", "t2i") for k in (1, 5, 10))
    assert metrics["i2t_R@1_chance"] == pytest.approx(1 / depth)


# ---------------------------------------------------------------------------
# Zero-shot and kNN with a fake encoder that recognises shapes
# ---------------------------------------------------------------------------


def shape_of(image):
    """Circle / square / triangle from how much of its bounding box the shape fills."""
    background = np.median(np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]]), axis=0)
    mask = np.abs(image - background).max(axis=-1) > 0.25
    ys, xs = np.nonzero(mask)
    fill = mask.sum() / ((np.ptp(ys) + 1) * (np.ptp(xs) + 1))
    return min(SHAPES, key=lambda s: abs(FILL_FRACTION[s] - fill))


def encode_shapes(images):
    return one_hot([SHAPES.index(shape_of(image)) for image in images], len(SHAPES))


def shape_text_encoder(tokenizer, order=SHAPES):
    """One-hot of the shape word in the tokens, in ``order`` (permute it to be wrong)."""
    ids = [tokenizer.tokens.index(word) for word in order]

    def encode(tokens):
        found = np.stack([(tokens == i).any(axis=1) for i in ids], axis=1).astype(np.float32)
        assert (found.sum(axis=1) == 1).all()  # every prompt names exactly one class
        return found

    return encode


def test_zeroshot_with_a_shape_recognising_encoder(tiny_eval_folder, tokenizer):
    evaluator = evaluators.get("zeroshot")(
        image_dir=os.path.join(tiny_eval_folder, "test"), image_size=IMAGE_SIZE, tokenizer=tokenizer,
        batch_size=BATCH,
    )
    metrics = evaluator.run(fixed_batch(encode_shapes, BATCH), fixed_batch(shape_text_encoder(tokenizer), BATCH))
    assert metrics == {"top1": 1.0, "top5": 1.0, "top1_chance": 1 / 3, "num_images": 9.0, "num_classes": 3.0}

    rotated = shape_text_encoder(tokenizer, order=SHAPES[1:] + SHAPES[:1])
    assert evaluator.run(encode_shapes, rotated)["top1"] == 0.0


def test_class_embedding_is_the_normalised_mean_over_templates(tokenizer):
    table = np.random.default_rng(0).normal(size=(tokenizer.vocab_size, 8))

    def encode(tokens):  # a bag-of-wordpieces text encoder
        return l2_normalize(table[tokens].sum(axis=1))

    templates = ("a {}.", "photo of a {}", "{} drawn on white")
    got = zeroshot.class_embeddings(fixed_batch(encode, 4), tokenizer, ["circle", "large_square"], templates, 4)
    for row, name in zip(got, ["circle", "large square"]):
        per_template = encode(tokenizer.tokenize_numpy([t.format(name) for t in templates]))
        np.testing.assert_allclose(row, l2_normalize(per_template.mean(axis=0)), rtol=1e-5)


def test_topk_accuracy():
    scores = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.3], [0.2, 0.3, 0.5]])
    labels = np.array([1, 2, 0])
    assert zeroshot.topk_accuracy(scores, labels, 1) == pytest.approx(1 / 3)
    assert zeroshot.topk_accuracy(scores, labels, 2) == pytest.approx(2 / 3)
    assert zeroshot.topk_accuracy(scores, labels, 5) == 1.0


def test_knn_with_a_shape_recognising_encoder(tiny_eval_folder):
    evaluator = evaluators.get("knn")(
        train_dir=os.path.join(tiny_eval_folder, "train"), test_dir=os.path.join(tiny_eval_folder, "test"),
        image_size=IMAGE_SIZE, batch_size=BATCH, weighted_vote_k=3,
    )
    metrics = evaluator.run(fixed_batch(encode_shapes, BATCH), None)
    assert metrics == {"top1": 1.0, "top1_chance": 1 / 3, "num_train": 12.0, "num_test": 9.0,
                       "weighted_vote_top1": 1.0}
    # Without the option only ALIGN's nearest-neighbour R@1 is reported.
    evaluator.weighted_vote_k = None
    assert "weighted_vote_top1" not in evaluator.run(encode_shapes, None)


def test_knn_r1_is_the_nearest_neighbours_label_not_a_vote():
    # Test point at angle 0; its nearest train point is class 1, the next two are class 0.
    angles = np.array([0.6, 0.05, 0.65, 2.5])
    train = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = np.array([0, 1, 0, 0])
    test = np.array([[1.0, 0.0], [np.cos(2.4), np.sin(2.4)]])
    np.testing.assert_array_equal(knn.nearest_neighbours(train, test), [1, 3])
    votes = knn.knn_class_scores(train, labels, test, num_classes=2, k=3, temperature=100.0)
    assert votes[0].argmax() == 0  # a 3-NN vote would say class 0 where R@1 says class 1


def test_knn_votes_are_similarity_weighted():
    # Test point at angle 0; one class-1 neighbour very close, two class-0 ones further away.
    angles = np.array([0.05, 0.6, 0.65, 2.5])
    train = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = np.array([1, 0, 0, 0])
    test = np.array([[1.0, 0.0]])
    sharp = knn.knn_class_scores(train, labels, test, num_classes=2, k=3, temperature=0.05)
    flat = knn.knn_class_scores(train, labels, test, num_classes=2, k=3, temperature=100.0)
    assert sharp.argmax() == 1  # the close neighbour outweighs the two far ones
    assert flat.argmax() == 0  # near-uniform weights: majority of the 3 nearest
    np.testing.assert_allclose(flat[0], [2.0, 1.0], rtol=0.02)  # the 4th point is not a neighbour


def test_prompt_ensembles_ship_clips_short_imagenet_set():
    clip = zeroshot.prompt_templates("clip_short_imagenet")
    assert clip == ("itap of a {}.", "a bad photo of the {}.", "a origami {}.", "a photo of the large {}.",
                    "a {} in a video game.", "art of the {}.", "a photo of the small {}.")
    default = zeroshot.prompt_templates()
    assert default[: len(clip)] == clip and len(default) > len(clip)
    assert all(t.count("{}") == 1 for t in default)
    assert zeroshot.ZeroShotEvaluator("d", image_size=8, tokenizer=None, templates="drawings").templates == (
        zeroshot.prompt_templates("drawings"))
    with pytest.raises(KeyError, match="unknown prompt ensemble"):
        zeroshot.prompt_templates("imagenet_80")


# ---------------------------------------------------------------------------
# The retrieval page
# ---------------------------------------------------------------------------


def test_gallery_page_shows_held_out_queries_and_marks_the_true_partners(tiny_corpus, tokenizer, tmp_path):
    import html
    import re

    from trainer.evaluators import gallery

    dataset = make_dataset(
        tiny_corpus, "validation", global_batch_size=BATCH, image_size=IMAGE_SIZE, train=False,
        seed=0, tokenizer=tokenizer, process_index=0, process_count=1, extra_features=("texts",),
    )
    caption_of_image, caption_index, captions = {}, {}, set()
    for batch in dataset.as_numpy_iterator():
        for image, text, raw in zip(batch["image"], batch["text"], batch["texts"]):
            caption_of_image[image.tobytes()] = caption_index.setdefault(text.tobytes(), len(caption_index))
            captions.add(raw.decode())
    depth = len(caption_index)

    def oracle_images(images):
        return one_hot([caption_of_image[im.tobytes()] for im in images], depth)

    def oracle_texts(tokens):
        return one_hot([caption_index[row.tobytes()] for row in tokens], depth)

    evaluator = evaluators.get("gallery")(
        data_dir=tiny_corpus, workdir=str(tmp_path), image_size=IMAGE_SIZE, tokenizer=tokenizer,
        batch_size=BATCH, num_queries=4, top_k=3,
    )
    assert evaluator.run(fixed_batch(oracle_images, BATCH), fixed_batch(oracle_texts, BATCH)) == {
        "text_queries": 4.0, "image_queries": 4.0}
    page = (tmp_path / gallery.PAGE_NAME).read_text()
    text_rows = re.findall(r"<tr class='text-query'>(.*?)</tr>", page)
    image_rows = re.findall(r"<tr class='image-query'>(.*?)</tr>", page)
    assert len(text_rows) == len(image_rows) == 4
    for row in text_rows:
        caption = html.unescape(re.search(r"<td class='query'>(.*?)</td>", row).group(1))
        assert caption in captions
        thumbs = re.findall(r"<img src='data:image/png;base64,[A-Za-z0-9+/=]+' class='(\w*)'", row)
        assert len(thumbs) == 3 and thumbs[0] == "hit"  # the oracle ranks the true image first
    for row in image_rows:
        assert "src='data:image/png;base64," in row
        ranked = re.findall(r"<li class='(\w*)'>(.*?) <span", row)
        assert len(ranked) == 3 and ranked[0][0] == "hit" and html.unescape(ranked[0][1]) in captions
    assert "src='http" not in page and "<script" not in page  # self-contained

    # A wrong model's page marks no true partner at rank 1.
    shifted = lambda tokens: np.roll(oracle_texts(tokens), 1, axis=1)  # noqa: E731
    evaluator.run(oracle_images, shifted)
    page = (tmp_path / gallery.PAGE_NAME).read_text()
    firsts = re.findall(r"<td><img src='data:[^']*' class='(\w*)'", page)
    assert len(firsts) == 4 and "hit" not in firsts


# ---------------------------------------------------------------------------
# Hand-computed answers: several captions per image, ties
# ---------------------------------------------------------------------------


def test_several_captions_per_image_with_ties_against_a_hand_computed_answer():
    from trainer.evaluators import karpathy

    a = 1 / np.sqrt(2)
    images = np.array([[1, 0], [0, 1], [a, a]], np.float32)
    # Captions 0, 1 describe image 0; 2, 3 image 1; 4 image 2.
    captions = np.array([[1, 0], [0, 1], [0, 1], [0.6, 0.8], [0.8, 0.6]], np.float32)
    metrics = karpathy.captioned_retrieval_metrics(images, captions, [0, 0, 1, 1, 2], ks=(1, 2, 5))
    # image -> text (any of its captions counts):
    #   image 0: its caption 0 scores 1, nothing else reaches 1      -> rank 0
    #   image 1: its caption 2 scores 1, tied with image 0's caption 1 -> rank 1 (a tie counts against)
    #   image 2: its caption 4 scores 1.4a, tied with caption 3       -> rank 1
    assert metrics["i2t_R@1"] == pytest.approx(1 / 3)
    assert metrics["i2t_R@2"] == metrics["i2t_R@5"] == 1.0
    # text -> image (one query per caption):
    #   0: image 0 first; 1: image 0 scores 0, images 1 and 2 above -> rank 2;
    #   2: image 1 first; 3: image 2 (1.4a) above image 1 (0.8) -> rank 1; 4: image 2 first
    assert metrics["t2i_R@1"] == pytest.approx(3 / 5)
    assert metrics["t2i_R@2"] == pytest.approx(4 / 5)
    assert metrics["t2i_R@5"] == 1.0
    assert (metrics["num_images"], metrics["num_captions"], metrics["num_pairs"]) == (3, 5, 5)
    # Chance: images 0 and 1 have 2 of 5 captions, image 2 has 1; every caption 1 of 3 images.
    assert metrics["i2t_R@1_chance"] == pytest.approx((2 / 5 + 2 / 5 + 1 / 5) / 3)
    assert metrics["t2i_R@1_chance"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="at least one caption"):
        karpathy.captioned_retrieval_metrics(images, captions[:2], [0, 0])


def test_identical_captions_of_different_images_are_separate_queries_in_the_karpathy_protocol():
    from trainer.evaluators import karpathy

    images = np.eye(2, dtype=np.float32)
    same = np.array([[1, 0], [1, 0]], np.float32)  # image 1's caption reads like image 0's
    metrics = karpathy.captioned_retrieval_metrics(images, same, [0, 1], ks=(1,))
    assert metrics["num_captions"] == 2           # not merged into one candidate
    assert metrics["t2i_R@1"] == 0.5              # caption 1 retrieves image 0
    assert metrics["i2t_R@1"] == 0.0              # image 0: tie between its caption and caption 1


def test_topk_accuracy_ties_count_against_the_image():
    scores = np.array([[1.0, 1.0, 0.0], [0.2, 0.5, 0.5], [0.3, 0.3, 0.3]])
    labels = np.array([0, 2, 1])
    # Row 0: class 1 ties its label; row 1: class 1 ties its label; row 2: all alike.
    assert zeroshot.topk_accuracy(scores, labels, 1) == 0.0
    assert zeroshot.topk_accuracy(scores, labels, 2) == pytest.approx(2 / 3)
    assert zeroshot.topk_accuracy(scores, labels, 3) == 1.0


def test_knn_nearest_neighbour_ties_go_to_the_lowest_index():
    train = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    test = np.array([[1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_array_equal(knn.nearest_neighbours(train, test), [1, 0])


def test_zeroshot_uses_the_class_name_file(tiny_eval_folder, tokenizer, tmp_path):
    names = tmp_path / "names.json"
    names.write_text('{"circle": "square", "square": "triangle", "triangle": "circle"}')
    evaluator = evaluators.get("zeroshot")(
        image_dir=os.path.join(tiny_eval_folder, "test"), image_size=IMAGE_SIZE, tokenizer=tokenizer,
        batch_size=BATCH, class_names=str(names))
    # Every class is prompted with another shape's name: the right images, the wrong words.
    assert evaluator.run(encode_shapes, shape_text_encoder(tokenizer))["top1"] == 0.0


def test_karpathy_evaluator_with_a_shape_recognising_encoder(tiny_karpathy, tokenizer):
    captions_file, image_dir = tiny_karpathy
    evaluator = evaluators.get("karpathy")(
        captions_file=captions_file, image_dir=image_dir, image_size=IMAGE_SIZE, tokenizer=tokenizer,
        batch_size=BATCH)
    metrics = evaluator.run(fixed_batch(encode_shapes, BATCH), fixed_batch(shape_text_encoder(tokenizer), BATCH))
    # The test split: 3 images of different shapes, 2 captions each naming the shape.
    assert (metrics["num_images"], metrics["num_captions"]) == (3, 6)
    assert all(metrics[f"{d}_R@{k}"] == 1.0 for d in ("i2t", "t2i") for k in (1, 5, 10))
    assert metrics["t2i_R@1_chance"] == pytest.approx(1 / 3)
    rotated = shape_text_encoder(tokenizer, order=SHAPES[1:] + SHAPES[:1])
    wrong = evaluator.run(encode_shapes, rotated)
    assert wrong["i2t_R@1"] == wrong["t2i_R@1"] == 0.0
