"""Model architecture checks: published sizes, the fused depthwise conv, two-tower outputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer import models
from trainer.models import bert, convnet, efficientnet, two_tower


KEY = jax.random.key(0, impl="rbg")   # RngBitGenerator: much faster to compile on CPU


def param_count(module, *inputs):
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *inputs))
    return sum(x.size for x in jax.tree.leaves(shapes["params"])), shapes


# Keras' EfficientNet trainable parameter counts minus the classification head
# that ALIGN drops (1x1 conv to 1280*w channels, its BatchNorm, the 1000-way
# classifier): B0 5,288,548 - 409,600 - 2,560 - 1,281,000; B7 66,347,960 -
# 1,638,400 - 5,120 - 2,561,000. Matching them to the parameter checks the
# whole compound-scaling table, block layout, SE widths and rounding.
@pytest.mark.parametrize("variant,expected,blocks", [
    ("b0", 3_595_388, 16),
    pytest.param("b7", 62_143_440, 55, marks=pytest.mark.slow),   # ~20 s of tracing
])
def test_efficientnet_matches_published_sizes(variant, expected, blocks):
    count, shapes = param_count(efficientnet.EfficientNet(variant=variant),
                                np.zeros((1, 32, 32, 3), np.float32))
    assert count == expected
    assert sum(name.startswith("block") for name in shapes["params"]) == blocks


def test_efficientnet_feature_dims_are_aligns_embedding_sizes():
    # ALIGN: B7 -> 640-d, L2 -> 1376-d embeddings straight from global pooling.
    assert efficientnet.feature_dim("b7") == 640
    assert efficientnet.feature_dim("l2") == 1376
    assert [efficientnet.round_filters(f, 4.3) for f in (32, 16, 24, 40)] == [136, 72, 104, 176]


def test_efficientnet_projection_only_when_dims_differ():
    image = np.zeros((1, 32, 32, 3), np.float32)
    _, shapes = param_count(efficientnet.EfficientNet(variant="tiny", embed_dim=80), image)
    assert "projection" not in shapes["params"]
    _, shapes = param_count(efficientnet.EfficientNet(variant="tiny", embed_dim=64), image)
    assert shapes["params"]["projection"]["kernel"].shape == (80, 64)


def test_bert_matches_published_size():
    # BERT-base is 109,482,240 parameters with 512 positions, 2 token types and
    # the pooler; ALIGN's text tower has none of the pooler/types, 64 positions.
    count, _ = param_count(bert.Bert(vocab_size=30522, size="base", max_len=64),
                           np.ones((1, 8), np.int32))
    assert count == 109_482_240 - 590_592 - 2 * 768 - (512 - 64) * 768


@pytest.mark.parametrize("size", sorted(bert.SIZES))
def test_bert_sizes_follow_the_layer_formula(size):
    layers, hidden, _ = bert.SIZES[size]
    vocab, positions = 100, 16
    count, _ = param_count(bert.Bert(vocab_size=vocab, size=size, max_len=positions),
                           np.ones((1, 4), np.int32))
    per_layer = 12 * hidden * hidden + 13 * hidden
    assert count == (vocab + positions + 2) * hidden + layers * per_layer


@pytest.mark.parametrize("kernel,stride,size", [(3, 1, 9), (5, 2, 9), (3, 2, 8)])
def test_fused_depthwise_conv_equals_grouped_convolution(kernel, stride, size):
    rng = np.random.default_rng(kernel * 10 + stride + size)
    x = rng.normal(size=(2, size, size + 1, 6)).astype(np.float32)
    module = efficientnet.DepthwiseConv(kernel, stride)
    variables = module.init(KEY, x)

    @jax.jit
    def both(variables, x):
        grouped = jax.lax.conv_general_dilated(
            x, variables["params"]["kernel"], (stride, stride), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=6)
        return module.apply(variables, x), grouped

    got, want = both(variables, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_two_tower():
    model = models.build(dict(name="two_tower", embed_dim=32, image=dict(variant="tiny"),
                              text=dict(size="tiny", max_len=12)), vocab_size=40)
    images = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)).astype(np.float32)
    texts = np.array([[2, 7, 8, 3, 0, 0, 0, 0], [2, 9, 3, 0, 0, 0, 0, 0],
                      [2, 5, 6, 11, 12, 3, 0, 0], [2, 4, 3, 0, 0, 0, 0, 0]], np.int32)
    variables = jax.jit(lambda: model.init(KEY, images, texts))()
    apply = jax.jit(lambda v, images, texts: model.apply(v, images, texts))
    return model, variables, apply, images, texts


def test_two_tower_outputs_unit_vectors_and_initial_temperature(tiny_two_tower):
    _, variables, apply, images, texts = tiny_two_tower
    zimg, ztxt, out = apply(variables, images, texts)
    assert zimg.shape == ztxt.shape == (4, 32)
    np.testing.assert_allclose(np.linalg.norm(zimg, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ztxt, axis=1), 1.0, rtol=1e-5)
    assert float(variables["params"]["log_temperature"]) == 0.0   # ALIGN: temperature 1.0
    assert float(out["temperature"]) == 1.0


def test_eval_embeddings_are_per_example(tiny_two_tower):
    """Eval mode: BatchNorm uses running averages and [PAD] is masked, so a
    pair's embeddings do not depend on the other rows or on padding content."""
    _, variables, apply, images, texts = tiny_two_tower
    zimg, ztxt, _ = apply(variables, images, texts)
    other_images = images.copy()
    other_images[1:] = -images[1:]
    other_texts = texts.copy()
    other_texts[1:, 1] = 30
    zimg2, ztxt2, _ = apply(variables, other_images, other_texts)
    np.testing.assert_allclose(zimg2[0], zimg[0], atol=1e-6)
    np.testing.assert_allclose(ztxt2[0], ztxt[0], atol=1e-6)
    assert not np.allclose(ztxt2[1], ztxt[1], atol=1e-4)   # a real token changes it


def test_text_embedding_ignores_padding_length():
    model = bert.Bert(vocab_size=40, size="tiny", embed_dim=8, max_len=12)
    texts = np.array([[2, 7, 8, 3, 0, 0], [2, 9, 3, 0, 0, 0]], np.int32)
    variables = jax.jit(lambda: model.init(KEY, texts))()
    encode = jax.jit(model.apply)
    longer = np.concatenate([texts, np.zeros((2, 5), np.int32)], axis=1)
    np.testing.assert_allclose(encode(variables, texts), encode(variables, longer), atol=1e-5)


def test_mean_pooled_text_embedding_is_the_mean_of_the_real_tokens_states():
    texts = np.array([[2, 7, 8, 3, 0, 0], [2, 9, 3, 0, 0, 0]], np.int32)
    states = bert.Bert(vocab_size=40, size="tiny", max_len=12, pool="mean")
    variables = jax.jit(lambda: states.init(KEY, texts))()
    pooled, captured = states.apply(variables, texts, capture_intermediates=True, mutable=["intermediates"])
    full = captured["intermediates"]["layer1"]["__call__"][0]  # the last layer's token states
    np.testing.assert_allclose(pooled[0], full[0, :4].mean(0), atol=1e-5)
    np.testing.assert_allclose(pooled[1], full[1, :3].mean(0), atol=1e-5)
    cls = bert.Bert(vocab_size=40, size="tiny", max_len=12)
    np.testing.assert_allclose(cls.apply(variables, texts), full[:, 0], atol=1e-5)
    longer = np.concatenate([texts, np.zeros((2, 5), np.int32)], axis=1)
    np.testing.assert_allclose(states.apply(variables, longer), pooled, atol=1e-5)
    with pytest.raises(ValueError, match="text pooling"):
        bert.Bert(vocab_size=40, size="tiny", max_len=12, pool="max").apply(variables, texts)


def test_batchnorm_statistics_update_in_training_only(tiny_two_tower):
    model, variables, _, images, _ = tiny_two_tower
    _, updated = jax.jit(lambda v, x: model.apply(v, images=x, train=True,
                                                  mutable=["batch_stats"]))(variables, images)
    before = variables["batch_stats"]["image_tower"]["stem_norm"]["mean"]
    after = updated["batch_stats"]["image_tower"]["stem_norm"]["mean"]
    assert not np.allclose(before, after)
    # The running mean moves 1% (momentum 0.99) towards this batch's mean.
    stem = variables["params"]["image_tower"]["stem"]["kernel"]
    features = jax.lax.conv_general_dilated(images, stem, (2, 2), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(after, 0.99 * before + 0.01 * features.mean(axis=(0, 1, 2)),
                               rtol=1e-4, atol=1e-6)


def test_group_norm_variant_has_no_batch_stats():
    model = efficientnet.EfficientNet(variant="tiny", norm="group")
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), np.zeros((1, 32, 32, 3))))
    assert "batch_stats" not in shapes
    with pytest.raises(ValueError):
        jax.eval_shape(lambda: efficientnet.EfficientNet(variant="tiny", norm="layer").init(
            jax.random.key(0), np.zeros((1, 32, 32, 3))))


def test_fixed_temperature_is_not_a_parameter():
    model = two_tower.TwoTower(vocab_size=20, embed_dim=8, image=dict(variant="tiny"),
                               text=dict(size="tiny", max_len=4), temperature_init=1 / 64,
                               learn_temperature=False)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), np.zeros((1, 32, 32, 3)),
                                               np.ones((1, 4), np.int32)))
    assert "log_temperature" not in shapes["params"]
    assert float(model.apply({}, method=two_tower.TwoTower.temperature)) == pytest.approx(1 / 64)


def test_bfloat16_compute_keeps_float32_params_and_outputs():
    model = models.build(dict(name="two_tower", embed_dim=16, image=dict(variant="tiny"),
                              text=dict(size="tiny", max_len=4)), vocab_size=20,
                         dtype=jnp.bfloat16)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), np.zeros((2, 32, 32, 3)),
                                               np.ones((2, 4), np.int32)))
    assert {x.dtype for x in jax.tree.leaves(shapes["params"])} == {jnp.dtype("float32")}
    out = jax.eval_shape(lambda v: model.apply(v, np.zeros((2, 32, 32, 3)), np.ones((2, 4), np.int32)),
                         shapes)
    assert out[0].dtype == out[1].dtype == jnp.float32


def test_registry():
    assert models.get("two_tower") is two_tower.TwoTower
    with pytest.raises(ValueError):
        models.get("resnet")


def test_head_dropout_only_in_front_of_a_projection():
    # GroupNorm and no stochastic depth: train and eval differ only by the head dropout.
    from trainer.configs import cpu_fast_compile_options

    images = jax.random.normal(jax.random.key(0), (4, 32, 32, 3))
    width = efficientnet.feature_dim("tiny")
    cases = ((None, False), (width, False), (16, True))

    def net(embed_dim):
        return efficientnet.EfficientNet("tiny", embed_dim=embed_dim, norm="group", dropout=0.5, drop_path=0.0)

    # One init (the projecting net's) and one compiled program for the three nets (eager, each op of an
    # EfficientNet compiles on its own: seconds): the others' parameters are its trunk's, without the projection.
    fast = cpu_fast_compile_options()
    variables = jax.jit(net(16).init, compiler_options=fast)(KEY, images)
    trunk = {"params": {name: v for name, v in variables["params"].items() if name != "projection"}}

    @functools.partial(jax.jit, compiler_options=fast)
    def train_and_eval(variables, trunk, images, key):
        return [(net(embed_dim).apply(v, images, train=True, rngs={"dropout": key}), net(embed_dim).apply(v, images))
                for embed_dim, v in ((None, trunk), (width, trunk), (16, variables))]

    outputs = train_and_eval(variables, trunk, images, jax.random.key(2, impl="rbg"))
    for (embed_dim, dropped), (train, evaluated) in zip(cases, outputs):
        assert np.allclose(train, evaluated) != dropped, embed_dim


def test_convnet_tower_strides_where_the_width_changes_and_projects():
    """ConvNet: stride 2 in the first layer and wherever the filter count changes,
    so (16, 16, 32, 64) on 32 px ends at 4x4; the pooled 64 features are projected."""
    tower = convnet.ConvNet(filters=(16, 16, 32, 64), embed_dim=24)
    images = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype(np.float32)
    variables = jax.jit(lambda: tower.init(KEY, images))()
    out, inner = tower.apply(variables, images, capture_intermediates=True)
    assert out.shape == (3, 24)
    sizes = [inner["intermediates"][f"conv{i}"]["__call__"][0].shape[1:] for i in range(4)]
    assert sizes == [(16, 16, 16), (16, 16, 16), (8, 8, 32), (4, 4, 64)]
    assert set(variables["batch_stats"]) == {f"norm{i}" for i in range(4)}


def test_two_tower_picks_its_image_tower_by_name():
    images, texts = np.zeros((2, 32, 32, 3), np.float32), np.array([[2, 5, 3], [2, 6, 3]], np.int32)
    model = two_tower.TwoTower(vocab_size=10, embed_dim=8, text=dict(size="tiny", max_len=4),
                               image=dict(tower="convnet", filters=(8, 16)))
    params = jax.eval_shape(lambda: model.init(KEY, images, texts))["params"]["image_tower"]
    assert set(params) == {"conv0", "norm0", "conv1", "norm1", "projection"}
    default = two_tower.TwoTower(vocab_size=10, embed_dim=8, text=dict(size="tiny", max_len=4),
                                 image=dict(variant="tiny"))
    assert "stem" in jax.eval_shape(lambda: default.init(KEY, images, texts))["params"]["image_tower"]
    with pytest.raises(KeyError):
        two_tower.TwoTower(vocab_size=10, embed_dim=8, text=dict(size="tiny", max_len=4),
                           image=dict(tower="vit")).init(KEY, images, texts)
