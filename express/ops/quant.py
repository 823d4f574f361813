"""Group-quantized weights (int8 / int4, symmetric, one float32 scale per `group_size` values along
the input axis) and `qlinear`: `x @ dequantize(W).T + bias` with W kept packed, expanded inside
the C kernel (ex_qgemm). int4 packs each run of 32 values into 16 bytes: byte j holds value j in
its low nibble and value j + 16 in its high nibble, each stored + 8 (ggml's Q4_0 order)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .._lib import check, ffi, lib, ptr
from ..errors import DTypeError, ShapeError
from ..tensor import as_tensor, node
from .elementwise import astype
from .registry import defop
from .shape import reshape


def quantize_weight(w, bits: int = 4, group_size: int = 64):
    """(out, in) float weights -> (qweight, scales): int8 (out, in) or uint8 (out, in // 2), and
    float32 scales (out, in // group_size). Symmetric: w ~= q * scale, q in [-127, 127] or [-8, 7].

    >>> import numpy as np
    >>> q, s = quantize_weight(np.ones((2, 64), np.float32), bits=8, group_size=32)
    >>> q.dtype, q.shape, s.shape
    (dtype('int8'), (2, 64), (2, 2))
    """
    w = np.asarray(w, np.float32)
    if bits not in (4, 8):
        raise DTypeError(f"quantize_weight: bits must be 4 or 8, got {bits}")
    n, k = w.shape
    if group_size % 32 or k % group_size:
        raise ShapeError(f"quantize_weight: group size {group_size} must be a multiple of 32 dividing the "
                         f"input size {k} (weight {w.shape})")
    g = w.reshape(n, k // group_size, group_size)
    qmax = 127 if bits == 8 else 7
    amax = np.abs(g).max(axis=-1, keepdims=True)
    scale = (amax / qmax).astype(np.float32)
    inv = np.where(scale > 0, 1.0 / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    q = np.clip(np.rint(g * inv), -qmax - (bits == 4), qmax).astype(np.int8).reshape(n, k)
    scales = scale.reshape(n, k // group_size)
    if bits == 8:
        return q, scales
    u = (q + 8).astype(np.uint8).reshape(n, k // 32, 2, 16)
    return (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(n, k // 2), scales


def unpack(qweight, bits: int, k: int) -> np.ndarray:
    """The int8 values of a packed weight (rows, k)."""
    q = np.asarray(qweight)
    if bits == 8:
        return q.view(np.int8)
    b = q.reshape(q.shape[0], k // 32, 16)
    lo, hi = (b & 15).astype(np.int8) - 8, (b >> 4).astype(np.int8) - 8
    return np.concatenate([lo, hi], axis=-1).reshape(q.shape[0], k)


def dequantize_weight(qweight, scales, bits: int, group_size: int) -> np.ndarray:
    """The float32 weight (out, in) a (qweight, scales) pair stands for."""
    s = np.asarray(scales, np.float32)
    k = s.shape[1] * group_size
    q = unpack(qweight, bits, k).astype(np.float32)
    return (q.reshape(s.shape[0], -1, group_size) * s[..., None]).reshape(s.shape[0], k)


def dequantize_rows(qweight, scales, bits: int, group_size: int, rows) -> np.ndarray:
    """Rows `rows` of the dequantized weight (an embedding lookup from a quantized table)."""
    rows = np.asarray(rows, np.int64)
    return dequantize_weight(np.asarray(qweight)[rows], np.asarray(scales)[rows], bits, group_size)


def _qlinear_infer(x, qweight, scales, *bias, bits, group_size):
    k = scales.shape[1] * group_size if scales.ndim == 2 else -1
    n = scales.shape[0] if scales.ndim == 2 else -1
    want = (n, k) if bits == 8 else (n, k // 2)
    if x.dtype is not dt.float32 or scales.dtype is not dt.float32:
        raise DTypeError(f"qlinear: x and scales must be float32, got {x.dtype.name} and {scales.dtype.name}")
    if qweight.dtype is not (dt.int8 if bits == 8 else dt.uint8):
        raise DTypeError(f"qlinear: {bits}-bit weights must be {'int8' if bits == 8 else 'uint8'}, got {qweight.dtype.name}")
    if qweight.shape != want or x.shape[-1:] != (k,) or x.ndim != 2:
        raise ShapeError(f"qlinear: input {x.shape}, weight {qweight.shape} and scales {scales.shape} "
                         f"(group {group_size}, {bits}-bit) do not match")
    if bias and bias[0].shape != (n,):
        raise ShapeError(f"qlinear: bias {bias[0].shape} does not match {n} outputs")
    return (x.shape[0], n), dt.float32


def _qlinear_ref(x, qweight, scales, *bias, bits, group_size):
    y = x @ dequantize_weight(qweight, scales, bits, group_size).T
    return y + bias[0] if bias else y


def _qlinear_prepare(out, ins, bits, group_size):
    x, q, s = ins[:3]
    b = ffi.cast("float *", ptr(ins[3])) if len(ins) > 3 else ffi.NULL
    m, k = x.shape
    args = (bits, m, out.shape[1], k, group_size, ffi.cast("float *", ptr(x)), ffi.cast("void *", ptr(q)),
            ffi.cast("float *", ptr(s)), b, ffi.cast("float *", ptr(out)))
    return lambda: check(lib.ex_qgemm(*args), "qlinear")


_QLINEAR = defop("qlinear", "kernel", _qlinear_infer, _qlinear_ref, prepare=_qlinear_prepare,
                 contiguous=(0, 1, 2, 3))


def qlinear(x, qweight, scales, bias=None, *, bits: int, group_size: int):
    """`x @ dequantize(qweight, scales).T + bias` for x (..., in), weights packed by
    `quantize_weight`; the weights are expanded inside the kernel, never in memory.

    >>> import numpy as np, express as ex
    >>> q, s = quantize_weight(np.eye(32, dtype=np.float32), bits=8, group_size=32)
    >>> qlinear(ex.ones((1, 32)), q, s, bits=8, group_size=32).shape
    (1, 32)
    """
    x = as_tensor(x)
    if x.dtype is not dt.float32:
        x = astype(x, dt.float32)
    lead = x.shape[:-1]
    x2 = reshape(x, (-1, x.shape[-1])) if x.ndim != 2 else x
    ins = [x2, as_tensor(qweight), as_tensor(scales)] + ([as_tensor(bias)] if bias is not None else [])
    y = node(_QLINEAR, ins, bits=int(bits), group_size=int(group_size))
    return reshape(y, lead + (y.shape[-1],)) if x.ndim != 2 else y
