"""Seeded random tensors. NumPy's PCG64 generator makes the numbers (a solved problem); the same
seed gives the same tensor on every machine and thread count.

>>> import express as ex
>>> a = ex.random.normal((2, 2), seed=0)
>>> bool((a == ex.random.normal((2, 2), seed=0)).numpy().all())
True
"""
from __future__ import annotations

import numpy as np

from . import dtypes as dt
from .ops.creation import _shape
from .tensor import Tensor, constant

_global = np.random.default_rng(0)


def seed(s: int) -> None:
    """Reseed the generator used when no `seed=` is given."""
    global _global
    _global = np.random.default_rng(s)


def _rng(seed):
    return _global if seed is None else np.random.default_rng(seed)


def normal(shape, mean=0.0, std=1.0, dtype=dt.float32, seed=None) -> Tensor:
    """Normally distributed values."""
    a = _rng(seed).standard_normal(_shape("normal", shape), dtype=np.float32) * np.float32(std) + np.float32(mean)
    return constant(a.astype(dt.as_dtype(dtype).np, copy=False))


def uniform(shape, low=0.0, high=1.0, dtype=dt.float32, seed=None) -> Tensor:
    """Uniformly distributed values in [low, high)."""
    a = _rng(seed).random(_shape("uniform", shape), dtype=np.float32) * np.float32(high - low) + np.float32(low)
    return constant(a.astype(dt.as_dtype(dtype).np, copy=False))


def randint(low, high, shape, dtype=dt.int64, seed=None) -> Tensor:
    """Integers in [low, high)."""
    return constant(_rng(seed).integers(low, high, _shape("randint", shape)).astype(dt.as_dtype(dtype).np))
