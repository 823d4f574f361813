"""Tensor: a lazy node (op, inputs, attrs) or a materialized buffer (a NumPy array we own or share).

Building a Tensor runs shape/dtype inference and nothing else; `.numpy()`, `np.asarray`, `float`,
`bool`, `print` and `ex.eval` evaluate. An evaluated Tensor keeps its buffer and forgets its graph,
so intermediates nobody references are freed.
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes as dt
from .errors import ExpressError


class Tensor:
    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "_value", "_akey", "__weakref__")
    __array_priority__ = 1000  # NumPy defers to our operators: np_array + tensor -> Tensor

    def __init__(self, op, inputs, attrs, shape, dtype, value=None):
        self.op, self.inputs, self.attrs = op, inputs, attrs
        self.shape, self.dtype, self._value = shape, dtype, value
        self._akey = None  # hashable form of attrs, made on first use (graph.attrs_key)

    # ---- basic properties ----
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    T = property(lambda self: _shape.permute_dims(self, tuple(range(self.ndim))[::-1]))
    mT = property(lambda self: _shape.matrix_transpose(self))

    @property
    def is_evaluated(self) -> bool:
        return self._value is not None

    # ---- evaluation ----
    def numpy(self) -> np.ndarray:
        """Evaluate (if needed) and return the value as a NumPy array (no copy).

        >>> import express as ex
        >>> (ex.arange(3) * 2).numpy()
        array([0, 2, 4])
        """
        if self._value is None:
            from .plan import evaluate
            evaluate([self])
        return self._value

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def item(self):
        if self.size != 1:
            raise ExpressError(f"item() needs a tensor of one element, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if not (self.dtype.is_int or self.dtype.is_bool):
            raise ExpressError(f"only integer tensors can be used as an index, not {self.dtype.name}")
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self):
        head = f"shape={self.shape}, dtype={self.dtype.name}"
        if self._value is None:
            what = self.op.name if self.op is not None else "input"
            return f"Tensor({head}, lazy: {what})"
        body = np.array2string(np.asarray(self._value), separator=", ", threshold=20, edgeitems=3,
                               prefix="Tensor(")
        return f"Tensor({body}, {head})"

    def __str__(self):
        return np.array2string(np.asarray(self.numpy()), threshold=1000)

    def _repr_html_(self):
        from .display import tensor_html
        return tensor_html(self)

    __hash__ = object.__hash__

    # ---- methods (forms of the functions in express.ops) ----
    def astype(self, dtype):
        return _ew.astype(self, dtype)

    def reshape(self, *shape):
        return _shape.reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)

    def transpose(self, *axes):
        return _shape.transpose(self, axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else (axes or None))

    def permute_dims(self, axes):
        return _shape.permute_dims(self, axes)

    def flatten(self):
        return _shape.reshape(self, (-1,))

    def squeeze(self, axis=None):
        return _shape.squeeze(self, axis)

    def expand_dims(self, axis):
        return _shape.expand_dims(self, axis)

    def broadcast_to(self, shape):
        return _shape.broadcast_to(self, shape)

    def flip(self, axis=None):
        return _shape.flip(self, axis)

    def clip(self, min=None, max=None):
        return _ew.clip(self, min, max)

    def sum(self, axis=None, keepdims=False):
        return _red.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return _red.mean(self, axis, keepdims)

    def prod(self, axis=None, keepdims=False):
        return _red.prod(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return _red.max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return _red.min(self, axis, keepdims)

    def argmax(self, axis=None, keepdims=False):
        return _red.argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims=False):
        return _red.argmin(self, axis, keepdims)

    def cumsum(self, axis=None):
        return _red.cumsum(self, axis)

    def __getitem__(self, key):
        return _shape.getitem(self, key)

    # ---- operators ----
    def __add__(self, o): return _ew.add(self, o)
    def __radd__(self, o): return _ew.add(o, self)
    def __sub__(self, o): return _ew.subtract(self, o)
    def __rsub__(self, o): return _ew.subtract(o, self)
    def __mul__(self, o): return _ew.multiply(self, o)
    def __rmul__(self, o): return _ew.multiply(o, self)
    def __truediv__(self, o): return _ew.divide(self, o)
    def __rtruediv__(self, o): return _ew.divide(o, self)
    def __pow__(self, o): return _ew.pow(self, o)
    def __rpow__(self, o): return _ew.pow(o, self)
    def __matmul__(self, o): return _la.matmul(self, o)
    def __rmatmul__(self, o): return _la.matmul(o, self)
    def __neg__(self): return _ew.negative(self)
    def __pos__(self): return self
    def __abs__(self): return _ew.abs(self)
    def __invert__(self): return _ew.logical_not(self)
    def __and__(self, o): return _ew.logical_and(self, o)
    def __rand__(self, o): return _ew.logical_and(o, self)
    def __or__(self, o): return _ew.logical_or(self, o)
    def __ror__(self, o): return _ew.logical_or(o, self)
    def __eq__(self, o): return _ew.equal(self, o)
    def __ne__(self, o): return _ew.not_equal(self, o)
    def __lt__(self, o): return _ew.less(self, o)
    def __le__(self, o): return _ew.less_equal(self, o)
    def __gt__(self, o): return _ew.greater(self, o)
    def __ge__(self, o): return _ew.greater_equal(self, o)


def node(op, inputs, **attrs) -> Tensor:
    """Build a lazy node: run the op's inference (which raises on bad input) and nothing else."""
    shape, dtype = op.infer(*inputs, **attrs)
    return Tensor(op, tuple(inputs), attrs, tuple(int(s) for s in shape), dtype)


def constant(a: np.ndarray) -> Tensor:
    """A materialized tensor over a NumPy array of a supported dtype (shared, not copied)."""
    return Tensor(None, (), {}, tuple(a.shape), dt.from_numpy(a.dtype), a)


def as_numpy(x, dtype: dt.DType | None = None) -> np.ndarray:
    """`x` (array-like) as a NumPy array of an Express dtype (float64 narrows to float32)."""
    a = np.asarray(x if dtype is None else x, dtype=None if dtype is None else dtype.np)
    d = dt.from_numpy(a.dtype) if dtype is None else dtype
    if a.dtype != d.np:
        a = a.astype(d.np)
    if any(s % a.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)
    return a


def as_tensor(x, like: Tensor | None = None) -> Tensor:
    """A Tensor operand: a Tensor as it is, a Python scalar weakly typed next to `like`, anything
    else through NumPy."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)) and not isinstance(x, np.ndarray):
        d = dt.scalar_dtype(x, like.dtype) if like is not None else dt.default_for(x)
        return constant(np.array(x, dtype=d.np))
    return constant(as_numpy(x))


from .ops import elementwise as _ew, reduce as _red, shape as _shape, linalg as _la  # noqa: E402
