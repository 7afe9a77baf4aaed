"""EfficientNet image tower (Tan & Le 2019), as ALIGN uses it.

ALIGN takes EfficientNet *with global pooling and without the 1x1 conv of the
classification head*: the image embedding is the global average of the last
MBConv stage. That is why B7 gives 640 dimensions (round(320 * 2.0)) and L2
gives 1376 (round(320 * 4.3)), the embedding sizes the paper reports. Smaller
backbones (B1/B3/B5) get a linear layer to the common embedding size; here a
linear projection is added whenever ``embed_dim`` differs from the pooled width.

Normalisation. EfficientNet uses BatchNorm. We keep it (``norm="batch"``) and
make it correct on a mesh for free: the train step is one ``jax.jit`` over
*global* arrays whose batch axis is sharded on ``data``, so the batch mean in
BatchNorm is a mean over the global batch and XLA inserts the cross-device
all-reduce (synchronised BatchNorm, one channel-sized all-reduce per layer).
The result does not depend on the number of devices, which the sharded tests
check. Running statistics live in the ``batch_stats`` collection (mutable
during training, checkpointed with the params) and are used at evaluation.
``norm="group"`` swaps in GroupNorm: no state and no dependence on the other
pairs in the batch, for users who prefer a batch-independent image tower.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

#: Compound scaling (Tan & Le 2019, Table/official code; L2 from Noisy Student):
#: name -> (width multiplier, depth multiplier, resolution, dropout rate).
#: ``tiny`` is ours, not the paper's: a CPU-sized member for tests and demos.
SCALING = {
    "b0": (1.0, 1.0, 224, 0.2),
    "b1": (1.0, 1.1, 240, 0.2),
    "b2": (1.1, 1.2, 260, 0.3),
    "b3": (1.2, 1.4, 300, 0.3),
    "b4": (1.4, 1.8, 380, 0.4),
    "b5": (1.6, 2.2, 456, 0.4),
    "b6": (1.8, 2.6, 528, 0.5),
    "b7": (2.0, 3.1, 600, 0.5),
    "l2": (4.3, 5.3, 800, 0.5),
    "tiny": (0.25, 0.25, 64, 0.0),
}

#: The B0 stages: (expand ratio, kernel, stride, input filters, output filters,
#: repeats). Every other member scales filters by width and repeats by depth.
B0_STAGES = (
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
)
STEM_FILTERS = 32
SE_RATIO = 0.25
DIVISOR = 8


def round_filters(filters: int, width: float, divisor: int = DIVISOR) -> int:
    """Scales a channel count by ``width`` to a multiple of ``divisor``.

    Same rule as the official implementation: round to nearest, never go
    below ``divisor`` and never lose more than 10% to the rounding.
    """
    filters *= width
    new = max(divisor, int(filters + divisor / 2) // divisor * divisor)
    if new < 0.9 * filters:
        new += divisor
    return int(new)


def round_repeats(repeats: int, depth: float) -> int:
    return int(math.ceil(depth * repeats))


def feature_dim(variant: str) -> int:
    """Width of the pooled features (before any projection)."""
    return round_filters(B0_STAGES[-1][4], SCALING[variant][0])


# TF EfficientNet's initialisers: He-normal on fan-out for convolutions. For
# the depthwise kernel (k, k, 1, C) fan-out is k*k: each output channel has
# its own k*k filter (TF stores it as (k, k, C, 1)).
_conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
_depthwise_init = nn.initializers.variance_scaling(2.0, "fan_in", "normal")
_dense_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_out", "uniform")


def _norm(kind: str, train: bool, dtype, name: str, momentum: float = 0.99):
    """BatchNorm (global-batch statistics under jit) or GroupNorm, as a submodule."""
    if kind == "batch":
        # Official EfficientNet values: TF momentum 0.99, epsilon 1e-3.
        return nn.BatchNorm(use_running_average=not train, momentum=momentum, epsilon=1e-3,
                            dtype=dtype, name=name)
    if kind == "group":
        return lambda x: nn.GroupNorm(num_groups=math.gcd(x.shape[-1], 8), epsilon=1e-3,
                                      dtype=dtype, name=name)(x)
    raise ValueError(f"unknown norm {kind!r}: use 'batch' or 'group'")


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TF/XLA "SAME" padding: output ceil(size / stride), extra pad at the end."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class DepthwiseConv(nn.Module):
    """Depthwise kxk convolution with SAME padding, parameter shape (k, k, 1, C).

    On CPU it is written as k*k shifted multiply-adds, which XLA fuses into one
    elementwise loop: XLA:CPU's grouped convolution (feature_group_count=C)
    and especially its gradient measured ~5x slower here. Other backends use
    the grouped convolution. Same maths either way (tests/trainer check it).
    """

    kernel: int
    stride: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        k, s = self.kernel, self.stride
        w = self.param("kernel", _depthwise_init, (k, k, 1, x.shape[-1])).astype(self.dtype)
        x = x.astype(self.dtype)
        if jax.default_backend() != "cpu":
            return jax.lax.conv_general_dilated(
                x, w, (s, s), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                feature_group_count=x.shape[-1])
        (top, bottom), (left, right) = (_same_padding(x.shape[1], k, s),
                                        _same_padding(x.shape[2], k, s))
        out_h, out_w = -(-x.shape[1] // s), -(-x.shape[2] // s)
        xp = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
        out = None
        for i in range(k):
            for j in range(k):
                tap = xp[:, i:i + (out_h - 1) * s + 1:s, j:j + (out_w - 1) * s + 1:s, :] * w[i, j, 0]
                out = tap if out is None else out + tap
        return out


class MBConv(nn.Module):
    """Inverted residual block: expand 1x1, depthwise kxk, squeeze-excite, project 1x1."""

    out_filters: int
    expand_ratio: int
    kernel: int
    stride: int
    drop_path: float
    norm: str
    dtype: Any = jnp.float32
    bn_momentum: float = 0.99

    @nn.compact
    def __call__(self, x, train: bool):
        in_filters = x.shape[-1]
        norm = lambda name: _norm(self.norm, train, self.dtype, name, self.bn_momentum)  # noqa: E731
        inputs = x
        conv = lambda f, name: nn.Conv(  # noqa: E731  (1x1, no bias: a norm follows)
            f, (1, 1), use_bias=False, kernel_init=_conv_init, dtype=self.dtype, name=name)
        hidden = in_filters * self.expand_ratio
        if self.expand_ratio != 1:
            x = conv(hidden, "expand")(x)
            x = nn.swish(norm("expand_norm")(x))
        x = DepthwiseConv(self.kernel, self.stride, self.dtype, name="depthwise")(x)
        x = nn.swish(norm("depthwise_norm")(x))

        # Squeeze-and-excite; its width follows the block *input*, as in the paper.
        squeezed = max(1, int(in_filters * SE_RATIO))
        s = jnp.mean(x, axis=(1, 2))
        s = nn.swish(nn.Dense(squeezed, kernel_init=_conv_init, dtype=self.dtype,
                              name="se_reduce")(s))
        s = nn.sigmoid(nn.Dense(hidden, kernel_init=_conv_init, dtype=self.dtype,
                                name="se_expand")(s))
        x = x * s[:, None, None, :]

        x = conv(self.out_filters, "project")(x)
        x = norm("project_norm")(x)
        if self.stride == 1 and in_filters == self.out_filters:
            # Stochastic depth: dropout broadcast over H, W, C drops the whole
            # residual branch of an example (and rescales the kept ones).
            x = nn.Dropout(self.drop_path, broadcast_dims=(1, 2, 3),
                           deterministic=not train)(x)
            x = x + inputs
        return x


class EfficientNet(nn.Module):
    """EfficientNet trunk -> global average pool -> (dropout -> linear projection).

    Dropout (the table's rate, e.g. 0.5 for B7/L2) is applied only in front of
    a projection; without one (``embed_dim`` is ``None`` or the pooled width)
    the pooled features are the output and get no dropout.

    Attributes:
      variant: a key of ``SCALING`` (b0..b7, l2, tiny).
      embed_dim: output size; ``None`` or the pooled width means no projection.
      norm: "batch" or "group" (see the module docstring).
      dropout: rate on the pooled features before the projection; ``None``
        takes the table's value; unused without a projection.
      drop_path: stochastic-depth rate of the last block (0.2 in the paper's
        code), linearly increasing from 0 over the blocks.
      width, depth: override the variant's compound-scaling multipliers
        (``None``: the table's), e.g. a wider tiny network for a demo.
      bn_momentum: BatchNorm's running-average momentum (EfficientNet: 0.99,
        an average over ~100 steps; a run of a few hundred steps wants less,
        or its eval statistics lag the weights).
      dtype: computation dtype (params stay float32).
    """

    variant: str = "b0"
    embed_dim: Optional[int] = None
    norm: str = "batch"
    dropout: Optional[float] = None
    drop_path: float = 0.2
    width: Optional[float] = None
    depth: Optional[float] = None
    bn_momentum: float = 0.99
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images, train: bool = False):
        width, depth, _, table_dropout = SCALING[self.variant]
        width = self.width or width
        depth = self.depth or depth
        x = images.astype(self.dtype)
        x = nn.Conv(round_filters(STEM_FILTERS, width), (3, 3), (2, 2), padding="SAME",
                    use_bias=False, kernel_init=_conv_init, dtype=self.dtype, name="stem")(x)
        x = nn.swish(_norm(self.norm, train, self.dtype, "stem_norm", self.bn_momentum)(x))

        blocks = [(e, k, s if i == 0 else 1, round_filters(o, width))
                  for e, k, s, _, o, r in B0_STAGES for i in range(round_repeats(r, depth))]
        for index, (expand, kernel, stride, out) in enumerate(blocks):
            x = MBConv(out, expand, kernel, stride,
                       drop_path=self.drop_path * index / len(blocks),
                       norm=self.norm, dtype=self.dtype, bn_momentum=self.bn_momentum,
                       name=f"block{index}")(x, train)

        x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
        if self.embed_dim is None or self.embed_dim == x.shape[-1]:
            # The pooled features are the embedding (B7: 640, L2: 1376): no
            # dropout, which would fall on the very vector the loss compares.
            return x
        # Dropout before the linear projection, as before EfficientNet's classifier.
        rate = table_dropout if self.dropout is None else self.dropout
        x = nn.Dropout(rate, deterministic=not train)(x)
        return nn.Dense(self.embed_dim, kernel_init=_dense_init, dtype=self.dtype,
                        name="projection")(x)
