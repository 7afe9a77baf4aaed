"""BERT text tower (Devlin et al. 2019), trained from scratch as in ALIGN.

The text embedding is the final hidden state of the [CLS] token (position 0;
the tokenizer puts [CLS] first) followed by a linear layer to ``embed_dim``, as
the ALIGN paper describes. Post-LayerNorm blocks, GELU MLP of width 4H, learned
absolute position embeddings, token id 0 is padding and is masked out of
attention. BERT's pooler (dense + tanh) is not used: ALIGN's projection is
linear.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

#: name -> (layers, hidden size, attention heads). The published BERT sizes
#: (Turc et al. 2019 for the compact ones); ``tiny`` is ours, for CPU tests.
SIZES = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

_init = nn.initializers.truncated_normal(0.02)


class TransformerLayer(nn.Module):
    hidden: int
    heads: int
    dropout: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, attention_mask, train: bool):
        y = nn.MultiHeadDotProductAttention(
            num_heads=self.heads, qkv_features=self.hidden, kernel_init=_init,
            dropout_rate=self.dropout, deterministic=not train, dtype=self.dtype,
            force_fp32_for_softmax=True,  # bf16 compute: softmax (and weights x values) in f32
            name="attention")(x, x, mask=attention_mask)
        y = nn.Dropout(self.dropout, deterministic=not train)(y)
        x = nn.LayerNorm(epsilon=1e-12, dtype=self.dtype, name="attention_norm")(x + y)
        y = nn.Dense(4 * self.hidden, kernel_init=_init, dtype=self.dtype, name="mlp_in")(x)
        y = nn.gelu(y, approximate=False)
        y = nn.Dense(self.hidden, kernel_init=_init, dtype=self.dtype, name="mlp_out")(y)
        y = nn.Dropout(self.dropout, deterministic=not train)(y)
        return nn.LayerNorm(epsilon=1e-12, dtype=self.dtype, name="mlp_norm")(x + y)


class Bert(nn.Module):
    """BERT encoder -> [CLS] hidden state -> linear projection.

    Attributes:
      vocab_size: wordpiece vocabulary size (from the corpus vocabulary).
      size: a key of ``SIZES``.
      embed_dim: output size; ``None`` returns the [CLS] state unprojected.
      max_len: number of position embeddings (ALIGN: 64 tokens).
      dropout: hidden and attention dropout (BERT: 0.1).
      pool: "cls" (ALIGN's: the [CLS] token's final state) or "mean" (the
        mean final state over the non-padding tokens: every word reaches the
        embedding from the first step, where [CLS] must first learn to attend).
      dtype: computation dtype (params, LayerNorm statistics and the attention
        softmax stay float32).
    """

    vocab_size: int
    size: str = "base"
    embed_dim: Optional[int] = None
    max_len: int = 64
    dropout: float = 0.1
    pool: str = "cls"
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens, train: bool = False):
        layers, hidden, heads = SIZES[self.size]
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"text length {tokens.shape[1]} > max_len {self.max_len}")
        valid = tokens != 0
        x = nn.Embed(self.vocab_size, hidden, embedding_init=_init, name="token_embedding")(tokens)
        positions = self.param("position_embedding", _init, (self.max_len, hidden))
        x = x + positions[None, : tokens.shape[1]]
        x = nn.LayerNorm(epsilon=1e-12, dtype=self.dtype, name="embedding_norm")(x)
        x = nn.Dropout(self.dropout, deterministic=not train)(x).astype(self.dtype)

        attention_mask = nn.make_attention_mask(valid, valid, dtype=self.dtype)
        for i in range(layers):
            x = TransformerLayer(hidden, heads, self.dropout, self.dtype,
                                 name=f"layer{i}")(x, attention_mask, train)

        if self.pool == "cls":
            pooled = x[:, 0].astype(jnp.float32)
        elif self.pool == "mean":
            weights = valid.astype(jnp.float32)[..., None]
            pooled = jnp.sum(x.astype(jnp.float32) * weights, axis=1) / jnp.maximum(
                jnp.sum(weights, axis=1), 1.0)
        else:
            raise ValueError(f"unknown text pooling {self.pool!r}: 'cls' or 'mean'")
        if self.embed_dim is not None:
            pooled = nn.Dense(self.embed_dim, kernel_init=_init, dtype=self.dtype,
                              name="projection")(pooled)
        return pooled
