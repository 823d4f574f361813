"""Multi-head attention shared by the text encoder and the UNet."""
from __future__ import annotations

import numpy as np

import express as ex
import express.nn.functional as F


def _sdpa():
    return getattr(F, "scaled_dot_product_attention", None)


def attention(q, k, v, heads: int, causal: bool = False):
    """softmax(q k^T / sqrt(d)) v for [batch, tokens, heads * d] inputs, returning the same layout;
    `causal` hides later tokens."""
    b, n, c = q.shape
    d = c // heads
    split = lambda x: ex.permute_dims(ex.reshape(x, (b, x.shape[1], heads, d)), (0, 2, 1, 3))  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    sdpa = _sdpa()
    if sdpa is not None:
        o = sdpa(q, k, v, is_causal=causal)
    else:
        s = ex.matmul(q * float(d ** -0.5), ex.matrix_transpose(k))
        if causal:
            s = s + causal_mask(n)
        o = ex.matmul(F.softmax(s, axis=-1), v)
    return ex.reshape(ex.permute_dims(o, (0, 2, 1, 3)), (b, n, c))


def causal_mask(n: int) -> np.ndarray:
    """Additive mask hiding later tokens (a large negative, as transformers uses)."""
    return np.triu(np.full((n, n), np.finfo(np.float32).min, np.float32), 1)
