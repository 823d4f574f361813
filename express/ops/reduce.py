"""Reductions (sum mean prod max min argmax argmin), cumsum and softmax.

The C kernels reduce the middle axis of a contiguous [outer, r, inner] array, so each public
function first brings the reduced axes together: a contiguous run stays in place, anything else is
permuted to the end (the planner makes that view contiguous)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .._lib import KernelCall, ffi, lib, ptr
from ..errors import DTypeError, ShapeError
from ..tensor import as_tensor, node
from .registry import defop
from .shape import norm_axes, norm_axis, permute_dims, reshape


def _split3(shape, a0, a1):
    p = lambda s: int(np.prod(s, dtype=np.int64))  # noqa: E731
    return p(shape[:a0]), p(shape[a0:a1]), p(shape[a1:])


def _reduce_infer(name, out_rule):
    def infer(x, span, keepdims):
        a0, a1 = span
        if name in ("max", "min", "argmax", "argmin") and any(x.shape[a] == 0 for a in range(a0, a1)):
            raise ShapeError(f"{name}: zero-size reduction over shape {x.shape} has no identity")
        shape = x.shape[:a0] + ((1,) * (a1 - a0) if keepdims else ()) + x.shape[a1:]
        return shape, out_rule(x.dtype)
    return infer


def _reduce_prepare(code):
    def prepare(out, ins, span, keepdims):
        x = ins[0]
        args = (code, dt.from_numpy(x.dtype).code, ffi.cast("void *", ptr(x)), dt.from_numpy(out.dtype).code,
                ffi.cast("void *", ptr(out)), *_split3(x.shape, *span))
        return KernelCall("reduce", args, "reduce")
    return prepare


def _wide_int(d):
    return dt.int64 if not d.is_float else d


def _as_float(d):
    return d if d.is_float else dt.float32


def _np_reduce(fn):
    def ref(a, span, keepdims):
        return fn(a, axis=tuple(range(*span)), keepdims=keepdims)
    return ref


def _np_arg(fn):
    def ref(a, span, keepdims):
        a0, a1 = span  # arg-reductions are always over one axis here
        return fn(a, axis=a0, keepdims=keepdims)
    return ref


_REDUCE = {}
for _name, _code, _rule, _ref in (
        ("sum", lib.EX_RED_SUM, _wide_int, _np_reduce(np.sum)),
        ("prod", lib.EX_RED_PROD, _wide_int, _np_reduce(np.prod)),
        ("mean", lib.EX_RED_MEAN, _as_float, _np_reduce(np.mean)),
        ("max", lib.EX_RED_MAX, lambda d: d, _np_reduce(np.max)),
        ("min", lib.EX_RED_MIN, lambda d: d, _np_reduce(np.min)),
        ("argmax", lib.EX_RED_ARGMAX, lambda d: dt.int64, _np_arg(np.argmax)),
        ("argmin", lib.EX_RED_ARGMIN, lambda d: dt.int64, _np_arg(np.argmin))):
    _REDUCE[_name] = defop(_name, "kernel", _reduce_infer(_name, _rule), _ref,
                           prepare=_reduce_prepare(_code), contiguous=(0,))


def _reduce(name, x, axis, keepdims):
    x = as_tensor(x)
    axes = sorted(norm_axes(name, axis, x.ndim))
    if name in ("argmax", "argmin"):
        if axis is None:  # over the flattened tensor
            y = _reduce(name, reshape(x, (-1,)), 0, False)
            return reshape(y, (1,) * x.ndim) if keepdims else y
        if len(axes) != 1:
            raise ShapeError(f"{name}: takes a single axis, got {axis}")
    if not axes:  # axis=() reduces nothing: only the dtype rule applies
        from .elementwise import astype
        return astype(x, _REDUCE[name].infer(x, (0, 0), True)[1])
    if axes != list(range(axes[0], axes[-1] + 1)):  # not a contiguous run: move them to the end
        keep = [a for a in range(x.ndim) if a not in axes]
        y = _reduce(name, permute_dims(x, keep + axes), tuple(range(len(keep), x.ndim)), False)
        if keepdims:
            shape = list(x.shape)
            for a in axes:
                shape[a] = 1
            y = reshape(y, tuple(shape))
        return y
    return node(_REDUCE[name], [x], span=(axes[0], axes[-1] + 1), keepdims=bool(keepdims))


def sum(x, axis=None, keepdims=False):
    """Sum over `axis` (an int, a tuple, or None for all). Integers and bool sum to int64.

    >>> import express as ex
    >>> ex.sum(ex.asarray([[1, 2], [3, 4]]), axis=0).numpy()
    array([4, 6])
    """
    return _reduce("sum", x, axis, keepdims)


def prod(x, axis=None, keepdims=False):
    """Product over `axis`. Integers and bool multiply in int64."""
    return _reduce("prod", x, axis, keepdims)


def mean(x, axis=None, keepdims=False):
    """Arithmetic mean over `axis`; integers give float32."""
    return _reduce("mean", x, axis, keepdims)


def max(x, axis=None, keepdims=False):
    """Maximum over `axis` (NaN propagates, as in NumPy)."""
    return _reduce("max", x, axis, keepdims)


def min(x, axis=None, keepdims=False):
    """Minimum over `axis` (NaN propagates)."""
    return _reduce("min", x, axis, keepdims)


def argmax(x, axis=None, keepdims=False):
    """Index (int64) of the first maximum along `axis`, or in the flattened tensor."""
    return _reduce("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    """Index (int64) of the first minimum along `axis`, or in the flattened tensor."""
    return _reduce("argmin", x, axis, keepdims)


# ---- cumsum ----
def _cumsum_prepare(out, ins, axis):
    x = ins[0]
    args = (dt.from_numpy(x.dtype).code, ffi.cast("void *", ptr(x)), dt.from_numpy(out.dtype).code,
            ffi.cast("void *", ptr(out)), *_split3(x.shape, axis, axis + 1))
    return KernelCall("cumsum", args, "cumsum")


_CUMSUM = defop("cumsum", "kernel", lambda x, axis: (x.shape, _wide_int(x.dtype)),
                lambda a, axis: np.cumsum(a, axis=axis), prepare=_cumsum_prepare, contiguous=(0,))


def cumsum(x, axis=None):
    """Inclusive cumulative sum along `axis` (of the flattened tensor if None)."""
    x = as_tensor(x)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    return node(_CUMSUM, [x], axis=norm_axis("cumsum", axis, x.ndim))


# ---- softmax ----
def _softmax_ref(a, axis, log):
    a = np.asarray(a, np.float64)
    z = a - a.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True)) if log else \
        np.exp(z) / np.exp(z).sum(axis=axis, keepdims=True)


def _softmax_prepare(out, ins, axis, log):
    x = ins[0]
    args = (ffi.cast("float *", ptr(x)), ffi.cast("float *", ptr(out)), *_split3(x.shape, axis, axis + 1), int(log))
    return KernelCall("softmax", args, "softmax")


def _softmax_infer(x, axis, log):
    if x.dtype is not dt.float32:
        raise DTypeError(f"softmax: kernel takes float32, got {x.dtype.name}")
    return x.shape, x.dtype


_SOFTMAX = defop("softmax", "kernel", _softmax_infer, _softmax_ref, prepare=_softmax_prepare, contiguous=(0,))


def softmax(x, axis=-1, log=False):
    """Numerically stable softmax (or log-softmax) along `axis`; other float types compute in float32."""
    from .elementwise import astype
    x = as_tensor(x)
    axis = norm_axis("softmax", axis, x.ndim)
    out_dtype = x.dtype if x.dtype.is_float else dt.float32
    y = node(_SOFTMAX, [astype(x, dt.float32)], axis=axis, log=bool(log))
    return astype(y, out_dtype)
