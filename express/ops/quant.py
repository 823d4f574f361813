"""Group-quantized weights (int8 / int4, symmetric, one float16 scale per `group_size` values along
the input axis) and `qlinear`: `x @ dequantize(W).T + bias` with W kept packed, expanded inside
the C kernel (ex_qgemm), which reads them interleaved by 16 rows (see cext/kernels/qgemm.c for
the byte layout that `quantize_weight` writes). Activations are rounded to int8 per 32 values
inside the kernel (as llama.cpp's Q8_0), so results match the dequantized reference to about
1e-2 of their scale."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .._lib import KernelCall, check, ffi, lib, ptr
from ..errors import DTypeError, OutOfRangeError, ShapeError
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


class RowTable:
    """Row lookups in a packed int4/int8 table (an embedding whose table is a quantized LM head),
    checked once here, so that a lookup is one C call reading only those rows' bytes (a decode
    step's lookup, cold: a few us against 0.13 ms dequantizing in NumPy)."""

    def __init__(self, qweight, scales, bits: int, group_size: int):
        q, s = np.ascontiguousarray(qweight), np.ascontiguousarray(scales)
        if bits not in (4, 8) or q.dtype != (np.int8 if bits == 8 else np.uint8) or s.dtype != np.float16:
            raise DTypeError(f"dequantize_rows: {bits}-bit weights {q.dtype} with scales {s.dtype} are not a packed "
                             "int4 (uint8) / int8 table with float16 scales")
        k = q.shape[1] * 32 if q.ndim == 3 else 0
        if (q.ndim != 3 or q.shape[2] != (32 if bits == 8 else 16) * ROWS or group_size < 32 or group_size % 32
                or k % group_size or s.shape != (q.shape[0], k // group_size, ROWS)):
            raise ShapeError(f"dequantize_rows: weights {q.shape} and scales {s.shape} are not a {bits}-bit table "
                             f"packed with group size {group_size}")
        self.n, self.k = ROWS * q.shape[0], k
        self._keep = (q, s)
        self._args = (int(bits), self.n, k, int(group_size), ffi.cast("void *", ptr(q)), ffi.cast("void *", ptr(s)))

    def __call__(self, rows, out=None) -> np.ndarray:
        """Rows `rows` (int64 indices) dequantized, [len(rows), k] float32, into `out` if given
        (C-contiguous float32 of that shape)."""
        rows = np.ascontiguousarray(rows, np.int64).reshape(-1)
        if out is None:
            out = np.empty((len(rows), self.k), np.float32)
        elif out.shape != (len(rows), self.k) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ShapeError(f"dequantize_rows: out {out.dtype} {out.shape} is not a contiguous float32 "
                             f"{(len(rows), self.k)} array")
        rc = lib.ex_qgemm_rows(*self._args, ffi.cast("int64_t *", ptr(rows)), len(rows), ffi.cast("float *", ptr(out)))
        if rc == lib.EX_EINVAL and len(rows) and not (0 <= rows.min() and rows.max() < self.n):
            raise OutOfRangeError(f"dequantize_rows: row {rows[(rows < 0) | (rows >= self.n)][0]} is "
                                  f"outside the table's {self.n} rows")
        check(rc, "dequantize_rows")
        return out


def dequantize_rows(qweight, scales, bits: int, group_size: int, rows) -> np.ndarray:
    """Rows `rows` of the dequantized weight (an embedding lookup from a quantized table), reading
    only those rows' bytes."""
    return RowTable(qweight, scales, bits, group_size)(rows)


def _qlinear_infer(x, *ins, bits, group_size, ns, biased, has_res=False):
    if x.dtype is not dt.float32:
        raise DTypeError(f"qlinear: x must be float32, got {x.dtype.name}")
    biases = iter(ins[2 * len(ns):])
    for j, n in enumerate(ns):
        qweight, scales = ins[2 * j], ins[2 * j + 1]
        k = scales.shape[1] * group_size if scales.ndim == 3 else -1
        G = scales.shape[0] if scales.ndim == 3 else -1
        if scales.dtype is not dt.float16:
            raise DTypeError(f"qlinear: scales must be float16, got {scales.dtype.name}")
        if qweight.dtype is not (dt.int8 if bits == 8 else dt.uint8):
            raise DTypeError(f"qlinear: {bits}-bit weights must be {'int8' if bits == 8 else 'uint8'}, "
                             f"got {qweight.dtype.name}")
        if (qweight.shape != (G, k // 32, (32 if bits == 8 else 16) * ROWS) or scales.shape[2:] != (ROWS,)
                or x.ndim != 2 or x.shape[1] != k or not 0 < n <= ROWS * G):
            raise ShapeError(f"qlinear: input {x.shape}, weight {qweight.shape} and scales {scales.shape} "
                             f"(group {group_size}, {bits}-bit) do not match")
        if biased[j] and next(biases).shape != (n,):
            raise ShapeError(f"qlinear: a bias does not match {n} outputs")
    if has_res and (len(ns) != 1 or ins[-1].shape != (x.shape[0], ns[0]) or ins[-1].dtype is not dt.float32):
        raise ShapeError(f"qlinear: a residual {ins[-1].shape} ({ins[-1].dtype.name}) must be float32 of the "
                         f"output's shape {(x.shape[0], sum(ns))}, with one weight")
    return (x.shape[0], sum(ns)), dt.float32


def _qlinear_ref(x, *ins, bits, group_size, ns, biased, has_res=False):
    biases = iter(ins[2 * len(ns):])
    ys = [x @ dequantize_weight(ins[2 * j], ins[2 * j + 1], bits, group_size, n).T for j, n in enumerate(ns)]
    y = np.concatenate([y + next(biases) if b else y for y, b in zip(ys, biased)], axis=1)
    return y + ins[-1] if has_res else y


def _qlinear_prepare(out, ins, bits, group_size, ns, biased, has_res=False):
    x, count = ins[0], len(ns)
    biases = iter(ins[1 + 2 * count:])
    keep = (ffi.new("int64_t[]", list(ns)),
            ffi.new("void *[]", [ffi.cast("void *", ptr(ins[1 + 2 * j])) for j in range(count)]),
            ffi.new("void *[]", [ffi.cast("void *", ptr(ins[2 + 2 * j])) for j in range(count)]),
            ffi.new("float *[]", [ffi.cast("float *", ptr(next(biases))) if b else ffi.NULL for b in biased])
            if any(biased) else ffi.NULL,
            ffi.new("float *[]", [ffi.cast("float *", ptr(ins[-1]))]) if has_res else ffi.NULL)
    m, k = x.shape
    # a one-row product (a decode step) is memory-bound: the plan has the one before it prefetch
    # this one's weights (`reads`) and fills `then` with the next one's (plan.py)
    then = ffi.new("ex_prefetch *") if m == 1 else ffi.NULL
    args = (bits, m, k, group_size, ffi.cast("float *", ptr(x)), count) + keep + (ffi.cast("float *", ptr(out)), then)

    run = KernelCall("qgemm_multi", args, "qlinear")
    if m == 1:
        reads = ffi.new("ex_prefetch *")
        lib.ex_qgemm_prefetch_plan(bits, k, group_size, count, keep[0], keep[1], keep[2], reads)
        run.prefetch = (reads, then)
    return run


# a residual (has_res, one weight only) is set by the planner's epilogue fusion (express/fusion.py)
_QLINEAR = defop("qlinear", "kernel", _qlinear_infer, _qlinear_ref, prepare=_qlinear_prepare,
                 contiguous=range(2 + 3 * 8))  # x, up to 8 (qweight, scales), 8 biases and a residual


def _qlinear_node(x, weights, bits, group_size):
    """One qlinear node over x (..., in) for [(qweight, scales, bias, out_features)]; the outputs
    of the weights side by side, their widths, and the leading shape of x."""
    x = as_tensor(x)
    if x.dtype is not dt.float32:
        x = astype(x, dt.float32)
    lead = x.shape[:-1]
    x2 = reshape(x, (-1, x.shape[-1])) if x.ndim != 2 else x
    ins, biases, ns = [x2], [], []
    for q, s, b, n in weights:
        ins += [as_tensor(q), as_tensor(s)]
        ns.append(int(n) if n is not None else ROWS * ins[-1].shape[0])
        biases.append(b)
    y = node(_QLINEAR, ins + [as_tensor(b) for b in biases if b is not None], bits=int(bits),
             group_size=int(group_size), ns=tuple(ns), biased=tuple(b is not None for b in biases))
    return y, ns, lead


def _outputs(y, ns, lead):
    """The (rows, sum(ns)) output of a linear node over several weights as one tensor per weight
    (column views; the whole node when there is one), each with x's leading shape."""
    outs, c = [], 0
    for n in ns:
        part = y if len(ns) == 1 else y[:, c:c + n]
        outs.append(reshape(part, lead + (n,)) if len(lead) != 1 else part)
        c += n
    return outs


def qlinear(x, qweight, scales, bias=None, *, bits: int, group_size: int, out_features: int | None = None):
    """`x @ dequantize(qweight, scales).T + bias` for x (..., in), weights packed by
    `quantize_weight`; the weights are expanded inside the kernel, never in memory.

    >>> import numpy as np, express as ex
    >>> q, s = quantize_weight(np.eye(32, dtype=np.float32)[:30], bits=8, group_size=32)
    >>> qlinear(ex.ones((1, 32)), q, s, bits=8, group_size=32, out_features=30).shape
    (1, 30)
    """
    return _outputs(*_qlinear_node(x, [(qweight, scales, bias, out_features)], bits, group_size))[0]


def qlinear_many(x, weights, *, bits: int, group_size: int) -> list:
    """`qlinear` of one x through several packed weights of the same bits and group size
    ([(qweight, scales, bias or None, out_features)], at most 8) in one kernel call: x is quantized
    once and every weight's rows split over the threads in one pass (a decode step's q/k/v or
    gate/up projections). Returns one output per weight.

    >>> import numpy as np, express as ex
    >>> q, s = quantize_weight(np.eye(32, dtype=np.float32), bits=8, group_size=32)
    >>> [y.shape for y in qlinear_many(ex.ones((2, 32)), [(q, s, None, 32), (q, s, None, 8)], bits=8, group_size=32)]
    [(2, 32), (2, 8)]
    """
    if not 1 <= len(weights) <= 8:
        raise ShapeError(f"qlinear_many: takes 1 to 8 weights, got {len(weights)}")
    return _outputs(*_qlinear_node(x, weights, bits, group_size))


# ---- weights in GGUF blocks, used in place ----
GGML_TYPES = {"Q4_0": 2, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}


def _ggml_infer(x, *ins, kind, k, count, biased):
    if x.dtype is not dt.float32:
        raise DTypeError(f"ggml_linear: x must be float32, got {x.dtype.name}")
    rb = int(lib.ex_ggml_row_bytes(GGML_TYPES[kind], k))
    biases = iter(ins[count:])
    for w, b in zip(ins[:count], biased):
        if w.dtype is not dt.uint8:
            raise DTypeError(f"ggml_linear: the blocks must be uint8, got {w.dtype.name}")
        if rb < 0 or x.ndim != 2 or x.shape[1] != k or w.ndim != 2 or w.shape[1] != rb:
            raise ShapeError(f"ggml_linear: input {x.shape} and {kind} blocks {w.shape} do not match "
                             f"(k = {k} needs rows of {rb} bytes)")
        if b and next(biases).shape != (w.shape[0],):
            raise ShapeError(f"ggml_linear: a bias does not match {w.shape[0]} outputs")
    return (x.shape[0], sum(w.shape[0] for w in ins[:count])), dt.float32


def _ggml_ref(x, *ins, kind, k, count, biased):
    from gguf import GGMLQuantizationType, quants
    biases, ys = iter(ins[count:]), []
    for w, b in zip(ins[:count], biased):
        y = x @ quants.dequantize(np.asarray(w), GGMLQuantizationType[kind]).reshape(w.shape[0], k).T
        ys.append(y + next(biases) if b else y)
    return np.concatenate(ys, axis=1)


def _ggml_prepare(out, ins, kind, k, count, biased):
    x, biases = ins[0], iter(ins[1 + count:])
    keep = (ffi.new("int64_t[]", [w.shape[0] for w in ins[1:1 + count]]),
            ffi.new("void *[]", [ffi.cast("void *", ptr(w)) for w in ins[1:1 + count]]),
            ffi.new("float *[]", [ffi.cast("float *", ptr(next(biases))) if b else ffi.NULL for b in biased])
            if any(biased) else ffi.NULL)
    args = (GGML_TYPES[kind], x.shape[0], k, ffi.cast("float *", ptr(x)), count) + keep + (ffi.cast("float *", ptr(out)),)
    return KernelCall("ggml_gemm_multi", args, "ggml_linear")


_GGML_LINEAR = defop("ggml_linear", "kernel", _ggml_infer, _ggml_ref, prepare=_ggml_prepare,
                     contiguous=range(1 + 2 * 8))  # x, up to 8 weights and 8 biases


def _ggml_node(x, weights, kind):
    if kind not in GGML_TYPES:
        raise DTypeError(f"ggml_linear: block type {kind!r} is not supported (supported: {', '.join(GGML_TYPES)})")
    x = as_tensor(x)
    if x.dtype is not dt.float32:
        x = astype(x, dt.float32)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = reshape(x, (-1, k)) if x.ndim != 2 else x
    ins = [x2] + [as_tensor(w) for w, _ in weights] + [as_tensor(b) for _, b in weights if b is not None]
    y = node(_GGML_LINEAR, ins, kind=kind, k=int(k), count=len(weights), biased=tuple(b is not None for _, b in weights))
    return y, [w.shape[0] for w in ins[1:1 + len(weights)]], lead


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
    return _outputs(*_ggml_node(x, [(blocks, bias)], kind))[0]


def ggml_linear_many(x, weights, kind: str) -> list:
    """`ggml_linear` of one x through several weights in blocks of the same type
    ([(blocks, bias or None)], at most 8) in one kernel call: x is quantized once and all the
    rows split over the threads in one pass. Returns one output per weight."""
    if not 1 <= len(weights) <= 8:
        raise ShapeError(f"ggml_linear_many: takes 1 to 8 weights, got {len(weights)}")
    return _outputs(*_ggml_node(x, weights, kind))
