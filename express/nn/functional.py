"""Functional neural-network ops on Tensors (the layers in express.nn are built from these).

>>> import express as ex, express.nn.functional as F
>>> F.relu(ex.asarray([-1.0, 2.0])).numpy()
array([0., 2.], dtype=float32)
"""
from __future__ import annotations

from ..ops import elementwise as _ew
from ..ops.elementwise import erf, reciprocal, relu, rsqrt, sigmoid, silu  # noqa: F401
from ..ops.linalg import matmul
from ..ops.reduce import mean
from ..ops.reduce import softmax as _softmax
from ..ops.shape import matrix_transpose, reshape, take
from ..errors import ShapeError
from ..tensor import as_tensor


def gelu(x, approximate: str = "none"):
    """GELU: `x * Phi(x)` with the exact erf form, or the tanh approximation (`approximate="tanh"`)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _ew.gelu(x) if approximate == "none" else _ew.gelu_tanh(x)


def gelu_tanh(x):
    return _ew.gelu_tanh(x)


def softmax(x, axis: int = -1):
    """Softmax along `axis` (numerically stable)."""
    return _softmax(as_tensor(x), axis)


def log_softmax(x, axis: int = -1):
    """Log-softmax along `axis`."""
    return _softmax(as_tensor(x), axis, log=True)


def linear(x, weight, bias=None):
    """`x @ weight.T + bias` with `weight` of shape (out, in) (read transposed, not copied)."""
    x, weight = as_tensor(x), as_tensor(weight)
    if weight.ndim != 2 or x.shape[-1:] != weight.shape[1:]:
        raise ShapeError(f"linear: input {x.shape} does not match weight {weight.shape} (out, in)")
    y = matmul(x, matrix_transpose(weight))
    return y if bias is None else y + bias


def embedding(ids, weight):
    """Rows of `weight` at integer `ids` (any shape): result shape ids.shape + (dim,)."""
    return take(as_tensor(weight), ids, axis=0)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalize over the trailing `normalized_shape` axes, then scale and shift."""
    x = as_tensor(x)
    n = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[-len(n):] != n:
        raise ShapeError(f"layer_norm: input {x.shape} does not end with normalized shape {n}")
    axes = tuple(range(x.ndim - len(n), x.ndim))
    mu = mean(x, axis=axes, keepdims=True)
    d = x - mu
    y = d * rsqrt(mean(d * d, axis=axes, keepdims=True) + eps)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def rms_norm(x, weight=None, eps: float = 1e-6):
    """`x / sqrt(mean(x^2) + eps) * weight` over the last axis."""
    x = as_tensor(x)
    y = x * rsqrt(mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
    """Normalize (N, C, ...) over groups of C // num_groups channels, then a per-channel affine."""
    x = as_tensor(x)
    if x.ndim < 2 or x.shape[1] % num_groups:
        raise ShapeError(f"group_norm: {x.shape[1] if x.ndim > 1 else '?'} channels of input {x.shape} "
                         f"do not split into {num_groups} groups")
    g = reshape(x, (x.shape[0], num_groups, -1))
    mu = mean(g, axis=-1, keepdims=True)
    d = g - mu
    y = reshape(d * rsqrt(mean(d * d, axis=-1, keepdims=True) + eps), x.shape)
    cshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * reshape(weight, cshape)
    return y if bias is None else y + reshape(bias, cshape)
