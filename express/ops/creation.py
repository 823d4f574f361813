"""Creation: tensors from data, constants and ranges.

`zeros`/`ones`/`full` are a broadcast scalar copied into place, so inside a larger expression
they fuse away and never occupy memory of their own."""
from __future__ import annotations

import operator

import numpy as np

from .. import dtypes as dt
from ..errors import ShapeError
from ..tensor import Tensor, as_numpy, constant, node
from .elementwise import COPY
from .shape import broadcast_to


def _shape(name, shape):
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    try:
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ShapeError(f"{name}: shape must be a tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ShapeError(f"{name}: negative dimension in shape {shape}")
    return shape


def array(obj, dtype=None, copy=True) -> Tensor:
    """A tensor holding a copy of `obj` (array-like). float64 data is stored as float32.

    >>> import express as ex
    >>> ex.array([[1.0, 2.0]]).dtype
    express.float32
    """
    if isinstance(obj, Tensor):
        from .elementwise import astype
        obj = obj if dtype is None else astype(obj, dtype)
        return node(COPY, [obj]) if copy else obj
    a = as_numpy(obj, None if dtype is None else dt.as_dtype(dtype))
    if copy and (a is obj or (isinstance(obj, np.ndarray) and np.shares_memory(a, obj))):
        a = a.copy()
    return constant(a)


def asarray(obj, dtype=None) -> Tensor:
    """Like `array`, but shares the memory of a NumPy array of a supported dtype."""
    return array(obj, dtype, copy=False)


def full(shape, fill_value, dtype=None) -> Tensor:
    """A tensor of `shape` filled with `fill_value`."""
    shape = _shape("full", shape)
    d = dt.as_dtype(dtype) if dtype is not None else dt.default_for(fill_value)
    return node(COPY, [broadcast_to(constant(np.array(fill_value, d.np)), shape)])


def zeros(shape, dtype=dt.float32) -> Tensor:
    return full(shape, 0, dtype)


def ones(shape, dtype=dt.float32) -> Tensor:
    return full(shape, 1, dtype)


def full_like(x, fill_value, dtype=None) -> Tensor:
    return full(x.shape, fill_value, dtype or x.dtype)


def zeros_like(x, dtype=None) -> Tensor:
    return full(x.shape, 0, dtype or x.dtype)


def ones_like(x, dtype=None) -> Tensor:
    return full(x.shape, 1, dtype or x.dtype)


def arange(start, stop=None, step=1, dtype=None) -> Tensor:
    """Evenly spaced values in [start, stop), as `numpy.arange` (integers give int64)."""
    if step == 0:
        raise ShapeError("arange: step must not be zero")
    a = np.arange(start, stop, step) if stop is not None else np.arange(start)
    return constant(as_numpy(a, None if dtype is None else dt.as_dtype(dtype)))


def linspace(start, stop, num=50, endpoint=True, dtype=None) -> Tensor:
    """`num` evenly spaced values from `start` to `stop`."""
    if num < 0:
        raise ShapeError(f"linspace: num must be >= 0, got {num}")
    return constant(as_numpy(np.linspace(start, stop, num, endpoint=endpoint), dt.as_dtype(dtype or dt.float32)))


def eye(n, m=None, k=0, dtype=dt.float32) -> Tensor:
    """A 2-D tensor with ones on diagonal `k`."""
    return constant(np.eye(n, m, k, dtype=dt.as_dtype(dtype).np))
