"""Functional neural-network ops on Tensors (the layers in express.nn are built from these)."""
from __future__ import annotations

from ..ops import elementwise as _ew
from ..ops.elementwise import erf, reciprocal, relu, rsqrt, sigmoid, silu  # noqa: F401
from ..ops.reduce import softmax as _softmax
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
