"""matmul: NumPy semantics (1-D operands promoted and squeezed, batch dims broadcast).

The kernel takes any element strides, so transposed operands are not copied. float16/bfloat16
compute in float32 and integers in int64 (cast around the kernel); the kernels issue brings
widening inside the GEMM."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .._lib import KernelCall, ffi, ptr
from ..errors import DTypeError, ShapeError
from ..tensor import as_tensor, node
from .elementwise import astype, broadcast_shapes
from .registry import defop
from .shape import expand_dims, reshape

_MAX_BATCH_DIMS = 6


def _matmul_infer(a, b):
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape}: inner dimensions {a.shape[-1]} and "
                         f"{b.shape[-2]} differ")
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    if len(batch) > _MAX_BATCH_DIMS:
        raise ShapeError(f"matmul: at most {_MAX_BATCH_DIMS} batch dimensions, got shapes {a.shape} and {b.shape}")
    return batch + (a.shape[-2], b.shape[-1]), a.dtype


def _estrides(x):
    return [s // x.itemsize for s in x.strides]


def _batch_strides(x, batch):
    st = _estrides(x)[:-2]
    pad = len(batch) - len(st)
    return [0 if i < pad or x.shape[i - pad] == 1 else st[i - pad] for i in range(len(batch))]


def _matmul_prepare(out, ins):
    a, b = ins
    batch = out.shape[:-2]
    m, n, k = a.shape[-2], b.shape[-1], a.shape[-1]
    sa, sb = _estrides(a), _estrides(b)
    code = dt.from_numpy(out.dtype).code
    keep = (ffi.new("int64_t[]", list(batch) or [1]), ffi.new("int64_t[]", _batch_strides(a, batch) or [0]),
            ffi.new("int64_t[]", _batch_strides(b, batch) or [0]))
    args = (code, ffi.cast("void *", ptr(a)), sa[-2], sa[-1], ffi.cast("void *", ptr(b)), sb[-2], sb[-1],
            ffi.cast("void *", ptr(out)), m, n, k, len(batch), *keep)
    return KernelCall("matmul", args, "matmul")


_MATMUL = defop("matmul", "kernel", _matmul_infer, lambda a, b: np.matmul(a, b), prepare=_matmul_prepare)


def matmul(x1, x2):
    """Matrix product with NumPy's rules: batched, broadcast, 1-D operands as vectors.

    >>> import express as ex
    >>> (ex.ones((2, 3)) @ ex.ones((3, 4))).shape
    (2, 4)
    """
    a, b = as_tensor(x1), as_tensor(x2)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: operands must be at least 1-D, got shapes {a.shape} and {b.shape}")
    if a.dtype.is_bool or b.dtype.is_bool:
        raise DTypeError(f"matmul: bool operands ({a.dtype.name}, {b.dtype.name}) are not supported")
    out = dt.promote(a.dtype, b.dtype)
    work = dt.float32 if out.is_float else dt.int64
    va, vb = a.ndim == 1, b.ndim == 1
    a2 = expand_dims(a, 0) if va else a
    b2 = expand_dims(b, 1) if vb else b
    y = node(_MATMUL, [astype(a2, work), astype(b2, work)])
    if va or vb:
        y = reshape(y, y.shape[:-2] + (() if va else (y.shape[-2],)) + (() if vb else (y.shape[-1],)))
    return astype(y, out)
