"""Group-quantized weights (int8 / int4, symmetric, one float16 scale per `group_size` values along
the input axis) and `qlinear`: `x @ dequantize(W).T + bias` with W kept packed, expanded inside
the C kernel (ex_qgemm), which reads them interleaved by 16 rows (see cext/kernels/qgemm.c for
the byte layout that `quantize_weight` writes). Activations are rounded to int8 per 32 values
inside the kernel (as llama.cpp's Q8_0), so results match the dequantized reference to about
1e-2 of their scale."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .._lib import check, ffi, lib, ptr
from ..errors import DTypeError, ShapeError
from ..tensor import as_tensor, node
from .elementwise import astype
from .registry import defop
from .shape import reshape

ROWS = 16  # rows a packed group interleaves (QG_ROWS in qgemm.c)


def quantize_weight(w, bits: int = 4, group_size: int = 64):
    """(out, in) float weights -> (qweight, scales), packed for ex_qgemm (rows interleaved by 16,
    padded with zero rows to a multiple of 16): qweight int8 (out16 / 16, in / 32, 512) or uint8
    (out16 / 16, in / 32, 256), scales float16 (out16 / 16, in / group_size, 16). Symmetric:
    w ~= q * scale with q in [-127, 127] or [-8, 7].

    >>> import numpy as np
    >>> q, s = quantize_weight(np.ones((2, 64), np.float32), bits=8, group_size=32)
    >>> q.dtype, q.shape, s.shape
    (dtype('int8'), (1, 2, 512), (1, 2, 16))
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
    scale = (np.abs(g).max(axis=-1, keepdims=True) / qmax).astype(np.float16).astype(np.float32)
    inv = np.where(scale > 0, 1.0 / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    q = np.clip(np.rint(g * inv), -qmax - (bits == 4), qmax).astype(np.int8).reshape(n, k)
    return pack_weight(q, scale.reshape(n, k // group_size), bits, group_size)


def pack_weight(q, scales, bits: int, group_size: int):
    """Integer codes q (out, in) (int8; [-8, 7] for 4 bits) and scales (out, in / group_size) in
    the packed layout of `quantize_weight` (for weights quantized elsewhere, e.g. GGUF blocks)."""
    q, scale = np.asarray(q, np.int8), np.asarray(scales, np.float32)
    n, k = q.shape
    G = -(-n // ROWS)
    if G * ROWS != n:
        q = np.concatenate([q, np.zeros((G * ROWS - n, k), np.int8)])
        scale = np.concatenate([scale, np.zeros((G * ROWS - n, scale.shape[1]), np.float32)])
    q = q.reshape(G, ROWS, k // 32, 32)
    scales = np.ascontiguousarray(scale.reshape(G, ROWS, k // group_size).transpose(0, 2, 1)).astype(np.float16)
    if bits == 8:  # [R][b][t][r][j] = q[16R + r][32b + 4t + j]
        return np.ascontiguousarray(q.reshape(G, ROWS, k // 32, 8, 4).transpose(0, 2, 3, 1, 4)).reshape(
            G, k // 32, 32 * ROWS), scales
    u = (q.astype(np.int16) + 8).astype(np.uint8).reshape(G, ROWS, k // 32, 2, 4, 4)  # [R][r][b][half][t][j]
    packed = u[:, :, :, 0] | (u[:, :, :, 1] << 4)                                 # [R][r][b][t][j]
    return np.ascontiguousarray(packed.transpose(0, 2, 3, 1, 4)).reshape(G, k // 32, 16 * ROWS), scales


def unpack(qweight, bits: int) -> np.ndarray:
    """The int8 values (out16, in) of a packed weight."""
    q = np.asarray(qweight)
    G, nb = q.shape[:2]
    if bits == 8:  # [R][b][t][r][j] -> [R][r][b][t][j]
        return q.view(np.int8).reshape(G, nb, 8, ROWS, 4).transpose(0, 3, 1, 2, 4).reshape(G * ROWS, nb * 32)
    b = q.reshape(G, nb, 4, ROWS, 4).transpose(0, 3, 1, 2, 4)  # [R][r][b][t][j]
    lo, hi = (b & 15).astype(np.int8) - 8, (b >> 4).astype(np.int8) - 8
    return np.stack([lo, hi], axis=3).reshape(G * ROWS, nb * 32)


def dequantize_weight(qweight, scales, bits: int, group_size: int, out_features: int | None = None) -> np.ndarray:
    """The float32 weight (out, in) a (qweight, scales) pair stands for."""
    s = np.asarray(scales, np.float32)
    s = s.transpose(0, 2, 1).reshape(-1, s.shape[1])  # (out16, in / group)
    q = unpack(qweight, bits).astype(np.float32)
    w = (q.reshape(s.shape[0], -1, group_size) * s[..., None]).reshape(q.shape)
    return w if out_features is None else w[:out_features]


def dequantize_rows(qweight, scales, bits: int, group_size: int, rows) -> np.ndarray:
    """Rows `rows` of the dequantized weight (an embedding lookup from a quantized table)."""
    rows = np.asarray(rows, np.int64)
    q, s = np.asarray(qweight), np.asarray(scales)
    groups = np.unique(rows // ROWS)
    w = dequantize_weight(q[groups], s[groups], bits, group_size)  # only the row groups needed
    where = {g: i for i, g in enumerate(groups)}
    return w[[where[r // ROWS] * ROWS + r % ROWS for r in rows]]


def _qlinear_infer(x, qweight, scales, *bias, bits, group_size, n):
    k = scales.shape[1] * group_size if scales.ndim == 3 else -1
    G = scales.shape[0] if scales.ndim == 3 else -1
    want = (G, k // 32, (32 if bits == 8 else 16) * ROWS)
    if x.dtype is not dt.float32 or scales.dtype is not dt.float16:
        raise DTypeError(f"qlinear: x must be float32 and scales float16, got {x.dtype.name} and {scales.dtype.name}")
    if qweight.dtype is not (dt.int8 if bits == 8 else dt.uint8):
        raise DTypeError(f"qlinear: {bits}-bit weights must be {'int8' if bits == 8 else 'uint8'}, "
                         f"got {qweight.dtype.name}")
    if qweight.shape != want or scales.shape[2:] != (ROWS,) or x.shape[-1:] != (k,) or x.ndim != 2 or not 0 < n <= ROWS * G:
        raise ShapeError(f"qlinear: input {x.shape}, weight {qweight.shape} and scales {scales.shape} "
                         f"(group {group_size}, {bits}-bit) do not match")
    if bias and bias[0].shape != (n,):
        raise ShapeError(f"qlinear: bias {bias[0].shape} does not match {n} outputs")
    return (x.shape[0], n), dt.float32


def _qlinear_ref(x, qweight, scales, *bias, bits, group_size, n):
    y = x @ dequantize_weight(qweight, scales, bits, group_size, n).T
    return y + bias[0] if bias else y


def _qlinear_prepare(out, ins, bits, group_size, n):
    x, q, s = ins[:3]
    b = ffi.cast("float *", ptr(ins[3])) if len(ins) > 3 else ffi.NULL
    m, k = x.shape
    args = (bits, m, out.shape[1], k, group_size, ffi.cast("float *", ptr(x)), ffi.cast("void *", ptr(q)),
            ffi.cast("void *", ptr(s)), b, ffi.cast("float *", ptr(out)))
    return lambda: check(lib.ex_qgemm(*args), "qlinear")


_QLINEAR = defop("qlinear", "kernel", _qlinear_infer, _qlinear_ref, prepare=_qlinear_prepare,
                 contiguous=(0, 1, 2, 3))


def qlinear(x, qweight, scales, bias=None, *, bits: int, group_size: int, out_features: int | None = None):
    """`x @ dequantize(qweight, scales).T + bias` for x (..., in), weights packed by
    `quantize_weight`; the weights are expanded inside the kernel, never in memory.

    >>> import numpy as np, express as ex
    >>> q, s = quantize_weight(np.eye(32, dtype=np.float32)[:30], bits=8, group_size=32)
    >>> qlinear(ex.ones((1, 32)), q, s, bits=8, group_size=32, out_features=30).shape
    (1, 30)
    """
    x = as_tensor(x)
    if x.dtype is not dt.float32:
        x = astype(x, dt.float32)
    lead = x.shape[:-1]
    x2 = reshape(x, (-1, x.shape[-1])) if x.ndim != 2 else x
    ins = [x2, as_tensor(qweight), as_tensor(scales)] + ([as_tensor(bias)] if bias is not None else [])
    n = int(out_features) if out_features is not None else ROWS * ins[2].shape[0]
    y = node(_QLINEAR, ins, bits=int(bits), group_size=int(group_size), n=n)
    return reshape(y, lead + (y.shape[-1],)) if x.ndim != 2 else y


# ---- weights in GGUF blocks, used in place ----
GGML_TYPES = {"Q4_0": 2, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}


def _ggml_infer(x, w, *bias, kind, k):
    if x.dtype is not dt.float32 or w.dtype is not dt.uint8:
        raise DTypeError(f"ggml_linear: x must be float32 and the blocks uint8, got {x.dtype.name} and {w.dtype.name}")
    rb = int(lib.ex_ggml_row_bytes(GGML_TYPES[kind], k))
    if rb < 0 or x.ndim != 2 or w.ndim != 2 or x.shape[1] != k or w.shape[1] != rb:
        raise ShapeError(f"ggml_linear: input {x.shape} and {kind} blocks {w.shape} do not match "
                         f"(k = {k} needs rows of {rb} bytes)")
    if bias and bias[0].shape != (w.shape[0],):
        raise ShapeError(f"ggml_linear: bias {bias[0].shape} does not match {w.shape[0]} outputs")
    return (x.shape[0], w.shape[0]), dt.float32


def _ggml_ref(x, w, *bias, kind, k):
    from gguf import GGMLQuantizationType, quants
    y = x @ quants.dequantize(np.asarray(w), GGMLQuantizationType[kind]).reshape(w.shape[0], k).T
    return y + bias[0] if bias else y


def _ggml_prepare(out, ins, kind, k):
    x, w = ins[:2]
    b = ffi.cast("float *", ptr(ins[2])) if len(ins) > 2 else ffi.NULL
    args = (GGML_TYPES[kind], x.shape[0], w.shape[0], k, ffi.cast("float *", ptr(x)), ffi.cast("void *", ptr(w)), b,
            ffi.cast("float *", ptr(out)))
    return lambda: check(lib.ex_ggml_gemm(*args), "ggml_linear")


_GGML_LINEAR = defop("ggml_linear", "kernel", _ggml_infer, _ggml_ref, prepare=_ggml_prepare, contiguous=(0, 1, 2))


def ggml_linear(x, blocks, kind: str, bias=None):
    """`x @ W.T + bias` for x (..., k) and W in GGUF blocks of type `kind` (Q4_0, Q5_0, Q8_0, Q4_K,
    Q5_K, Q6_K), given as a uint8 array (out, bytes per row), e.g. a memory-mapped file: used in
    place. x is quantized as llama.cpp does (Q8_0 or Q8_K) and each block is an integer dot product,
    so results follow llama.cpp's to float rounding, and the dequantized product to about 1e-2 of
    its scale.

    >>> import numpy as np, express as ex
    >>> w = np.zeros((3, 34), np.uint8)  # 3 rows of one Q8_0 block: scale 1.0, codes 0
    >>> w[:, 1] = 0x3C
    >>> ggml_linear(ex.ones((2, 32)), w, "Q8_0").shape
    (2, 3)
    """
    if kind not in GGML_TYPES:
        raise DTypeError(f"ggml_linear: block type {kind!r} is not supported (supported: {', '.join(GGML_TYPES)})")
    x = as_tensor(x)
    if x.dtype is not dt.float32:
        x = astype(x, dt.float32)
    lead = x.shape[:-1]
    k = x.shape[-1]
    x2 = reshape(x, (-1, k)) if x.ndim != 2 else x
    ins = [x2, as_tensor(blocks)] + ([as_tensor(bias)] if bias is not None else [])
    y = node(_GGML_LINEAR, ins, kind=kind, k=int(k))
    return reshape(y, lead + (y.shape[-1],)) if x.ndim != 2 else y
