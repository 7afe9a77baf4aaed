"""A plain convolutional image tower: the ``tiny`` demo's CPU-sized alternative to EfficientNet.

Not the paper's architecture (ALIGN uses EfficientNet, ``trainer.models.efficientnet``):
a stack of 3x3 convolutions with BatchNorm and ReLU, a stride of 2 wherever
the filter count changes (and in the first layer), global average pooling and
a linear projection. On 2 CPU cores it learns the sample corpus's shapes in a
few hundred steps, where EfficientNet at width x0.5 / depth x0.25 (a few
channels per layer, depthwise convolutions that XLA:CPU runs as elementwise
loops) had barely started: measured in ``benchmarks/RESULTS.md``
("Tiny demo: held-out retrieval").

BatchNorm is the same module as EfficientNet's (global-batch statistics under
jit, running averages in ``batch_stats``), so the trainer treats both towers alike.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

from trainer.models.efficientnet import _conv_init, _dense_init, _norm


class ConvNet(nn.Module):
    """3x3 conv -> norm -> ReLU, ``len(filters)`` times -> global average pool -> linear.

    Attributes:
      filters: output channels of each convolution; the first layer and every
        layer whose count differs from the previous one have stride 2.
      embed_dim: output size; ``None`` returns the pooled features.
      norm: "batch" or "group" (as EfficientNet's).
      bn_momentum: BatchNorm's running-average momentum.
      dtype: computation dtype (params stay float32).
    """

    filters: Sequence[int] = (32, 32, 64, 64, 128, 128)
    embed_dim: Optional[int] = None
    norm: str = "batch"
    bn_momentum: float = 0.9
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images, train: bool = False):
        x = images.astype(self.dtype)
        previous = None
        for index, out in enumerate(self.filters):
            stride = 2 if out != previous else 1
            x = nn.Conv(out, (3, 3), (stride, stride), padding="SAME", use_bias=False,
                        kernel_init=_conv_init, dtype=self.dtype, name=f"conv{index}")(x)
            x = nn.relu(_norm(self.norm, train, self.dtype, f"norm{index}", self.bn_momentum)(x))
            previous = out
        x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
        if self.embed_dim is None or self.embed_dim == x.shape[-1]:
            return x
        return nn.Dense(self.embed_dim, kernel_init=_dense_init, dtype=self.dtype, name="projection")(x)
