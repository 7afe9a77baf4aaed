"""The ALIGN dual encoder: an image tower and a text tower into one space.

Why Flax Linen (not NNX): Linen keeps parameters as plain nested dicts outside
the module. That is what the rest of the trainer wants: optax masks are a
``jax.tree.map`` over that dict, orbax saves and restores it as an ordinary
pytree, and the mesh sharding is one ``NamedSharding`` per leaf. It is also
big_vision's convention, so its readers find the same shape of code here.

``__call__`` returns L2-normalised ``(zimg, ztxt)`` and a dict with the
softmax temperature. The temperature is learned in log space
(``log_temperature``, init ``log(temperature_init)`` = 0 for ALIGN's 1.0), which
keeps it positive and makes its gradient scale-free. With
``learn_temperature=False`` it is a constant and not a parameter.
Either input may be ``None`` to run one tower only (evaluation, dedup).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from trainer.models import bert, convnet, efficientnet

#: ``image["tower"]`` -> image tower class (default: ALIGN's EfficientNet).
IMAGE_TOWERS = {"efficientnet": efficientnet.EfficientNet, "convnet": convnet.ConvNet}


def l2_normalize(x, eps: float = 1e-12):
    """Unit rows inside the jitted forward pass (traced and differentiated, so JAX ops;
    ``common.vectors.l2_normalize`` is the numpy one that compares embeddings afterwards)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps * eps))


class TwoTower(nn.Module):
    """EfficientNet image tower + BERT text tower + a shared temperature.

    Attributes:
      vocab_size: text vocabulary size.
      embed_dim: the shared embedding size.
      image: kwargs of the image tower: ``tower`` (a key of ``IMAGE_TOWERS``,
        default ``efficientnet``) and the tower's own fields (EfficientNet:
        variant, norm, dropout, drop_path, ...; ConvNet: filters, norm, ...).
      text: kwargs of ``Bert`` (size, max_len, dropout).
      temperature_init: initial softmax temperature (ALIGN: 1.0).
      learn_temperature: learn it (ALIGN) or keep it fixed.
      dtype: computation dtype of both towers (params stay float32).
    """

    vocab_size: int
    embed_dim: int
    image: Any = None
    text: Any = None
    temperature_init: float = 1.0
    learn_temperature: bool = True
    dtype: Any = jnp.float32

    def setup(self):
        image = dict(self.image or {})
        tower = IMAGE_TOWERS[image.pop("tower", "efficientnet")]
        self.image_tower = tower(embed_dim=self.embed_dim, dtype=self.dtype, **image)
        self.text_tower = bert.Bert(
            vocab_size=self.vocab_size, embed_dim=self.embed_dim, dtype=self.dtype,
            **dict(self.text or {}))
        if self.learn_temperature:
            self.log_temperature = self.param(
                "log_temperature", nn.initializers.constant(math.log(self.temperature_init)), ())

    def temperature(self):
        if self.learn_temperature:
            return jnp.exp(self.log_temperature)
        return jnp.asarray(self.temperature_init, jnp.float32)

    def __call__(self, images: Optional[Any] = None, texts: Optional[Any] = None,
                 train: bool = False):
        zimg = None if images is None else l2_normalize(self.image_tower(images, train))
        ztxt = None if texts is None else l2_normalize(self.text_tower(texts, train))
        return zimg, ztxt, {"temperature": self.temperature()}
