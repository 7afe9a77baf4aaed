"""Embedding vectors as the dedup stage and the trainer's evaluators compare them: unit length.

Both sides score pairs by a dot product that must be a cosine, so they share
one normalisation. (The model's own normalisation, inside the jitted
forward pass, is ``trainer.models.two_tower.l2_normalize``: JAX ops that are
traced, differentiated and sharded, not this numpy one.)
"""

from __future__ import annotations

import numpy as np


def l2_normalize(vectors, min_norm: float = 1e-12) -> np.ndarray:
    """Vectors (along the last axis) scaled to unit length, as C-contiguous float32.

    A vector whose norm is at most ``min_norm`` has no direction and becomes
    all zeros: a zero row has cosine 0 with everything, which is how the
    dedup embedders mark an image without a descriptor. A NaN vector stays NaN
    (a broken model must not look like a blank one).
    """
    x = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    tiny = norms <= min_norm
    out = np.ascontiguousarray(x / np.where(tiny, np.float32(1), norms), dtype=np.float32)
    if tiny.any():
        out[np.broadcast_to(tiny, out.shape)] = 0.0
    return out
