"""The ONNX op table: ONE entry per ONNX op type, each a composition of public Express functions.

    @op("Gemm")
    def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0): ...

Inputs come positionally (None for an omitted optional input), attributes as keywords (an
attribute the function does not take is an error naming the node). `ctx=True` passes the
interpreter context first (opset, node, subgraphs). `host=True` marks ops computed on the host in
NumPy because the kernel library has no primitive for them yet (scatter, sort/top-k, nonzero,
bit ops); they are listed as such in the coverage table. Values are Tensors, Python lists
(sequences) or None (an empty optional).
"""
from __future__ import annotations

import builtins
import math
from dataclasses import dataclass

import numpy as np

import express as ex
from express import dtypes as dt
from express.errors import DTypeError, ModelError, ShapeError
from express.nn import functional as F
from express.tensor import Tensor, constant

from .ir import express_dtype


@dataclass
class OpImpl:
    fn: object
    ctx: bool = False
    host: bool = False
    kernel: str = ""   # the fused kernel of express.nn.functional it runs on, where it applies


OPS: dict[str, OpImpl] = {}


def op(*names, ctx=False, host=False, domain="", kernel=""):
    def deco(fn):
        for n in names:
            OPS[f"{domain}:{n}" if domain else n] = OpImpl(fn, ctx, host, kernel)
        return fn
    return deco


# ---- helpers ----
def val(t) -> np.ndarray:
    """The concrete value of a tensor (evaluates it; shape subgraphs are constants by then)."""
    return np.asarray(t.numpy() if isinstance(t, Tensor) else t)


def ints(t) -> list:
    return [int(v) for v in val(t).reshape(-1)]


def scalar(t, default=None):
    if t is None:
        return default
    return val(t).reshape(-1)[0].item()


def const(a, dtype=None) -> Tensor:
    a = np.asarray(a, dtype=None if dtype is None else dtype.np)
    return ex.asarray(a)


def like(v, t: Tensor) -> Tensor:
    """A scalar constant of `t`'s dtype."""
    return constant(np.array(v, dtype=t.dtype.np))


def naxis(axis, ndim):
    axis = int(axis)
    if not -ndim <= axis < builtins.max(ndim, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {ndim}")
    return axis % builtins.max(ndim, 1)


def host(fn, *ts):
    """Compute on the host: evaluate the inputs, run NumPy, return constants."""
    out = fn(*[None if t is None else val(t) for t in ts])
    if isinstance(out, tuple):
        return tuple(const(o) for o in out)
    return const(out)


# ---- elementwise ----
def _atan(x):
    s = ex.where(x < 0, -1.0, 1.0)
    a = ex.abs(x)
    big, mid = a > 2.414213562373095, a > 0.4142135623730950
    y0 = ex.where(big, math.pi / 2, ex.where(mid, math.pi / 4, 0.0))
    z = ex.where(big, -1.0 / ex.where(big, a, 1.0), ex.where(mid, (a - 1.0) / (a + 1.0), a))
    z2 = z * z
    p = (((8.05374449538e-2 * z2 - 1.38776856032e-1) * z2 + 1.99777106478e-1) * z2 - 3.33329491539e-1) * z2 * z + z
    return s * (y0 + p)


def _softplus(x):
    return ex.log(ex.exp(x) + 1.0)


_UNARY = {
    "Abs": ex.abs, "Neg": ex.negative, "Exp": ex.exp, "Log": ex.log, "Sqrt": ex.sqrt, "Sin": ex.sin,
    "Cos": ex.cos, "Tanh": ex.tanh, "Floor": ex.floor, "Ceil": ex.ceil, "Round": ex.round,
    "Reciprocal": F.reciprocal, "Erf": F.erf, "Sigmoid": F.sigmoid,
    "Tan": lambda x: ex.sin(x) / ex.cos(x),
    "Sinh": lambda x: (ex.exp(x) - ex.exp(-x)) * 0.5,
    "Cosh": lambda x: (ex.exp(x) + ex.exp(-x)) * 0.5,
    "Asinh": lambda x: ex.log(x + ex.sqrt(x * x + 1.0)),
    "Acosh": lambda x: ex.log(x + ex.sqrt(x * x - 1.0)),
    "Atanh": lambda x: 0.5 * ex.log((1.0 + x) / (1.0 - x)),
    "Atan": _atan,
    "Asin": lambda x: _atan(x / ex.sqrt(1.0 - x * x)),
    "Acos": lambda x: 2.0 * _atan(ex.sqrt((1.0 - x) / (1.0 + x))),
    "Softplus": _softplus,
    "Softsign": lambda x: x / (ex.abs(x) + 1.0),
    "Mish": lambda x: x * ex.tanh(_softplus(x)),
    "Sign": lambda x: ex.where(x > 0, like(1, x), ex.where(x < 0, like(-1, x), like(0, x))),
    "IsNaN": lambda x: ex.not_equal(x, x),
    "Not": ex.logical_not,
    "Identity": lambda x: x,
}
for _name, _fn in _UNARY.items():
    op(_name)(lambda x, _fn=_fn: _fn(x))


@op("Relu")
def relu(x):
    return F.relu(x) if x.dtype.is_float else ex.maximum(x, like(0, x))


@op("LeakyRelu")
def leaky_relu(x, *, alpha=0.01):
    return ex.where(x < 0, x * alpha, x)


@op("PRelu")
def prelu(x, slope):
    return ex.where(x < 0, x * slope, x)


@op("Elu")
def elu(x, *, alpha=1.0):
    return ex.where(x < 0, (ex.exp(x) - 1.0) * alpha, x)


@op("Selu")
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return ex.where(x <= 0, ex.exp(x) * alpha - alpha, x) * gamma


@op("Celu")
def celu(x, *, alpha=1.0):
    return ex.maximum(x, 0.0) + ex.minimum((ex.exp(x / alpha) - 1.0) * alpha, 0.0)


@op("ThresholdedRelu")
def thresholded_relu(x, *, alpha=1.0):
    return ex.where(x > alpha, x, 0.0)


@op("HardSigmoid")
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return ex.clip(x * alpha + beta, 0.0, 1.0)


@op("HardSwish")
def hard_swish(x):
    return x * ex.clip(x * (1 / 6) + 0.5, 0.0, 1.0)


@op("Gelu", kernel="gelu")
def gelu(x, *, approximate="none"):
    return F.gelu(x, approximate=approximate)


@op("Shrink")
def shrink(x, *, bias=0.0, lambd=0.5):
    xf = x.astype(ex.float32)
    y = ex.where(xf < -lambd, xf + bias, ex.where(xf > lambd, xf - bias, 0.0))
    return y.astype(x.dtype)


@op("IsInf")
def isinf(x, *, detect_negative=1, detect_positive=1):
    pos, neg = ex.equal(x, math.inf), ex.equal(x, -math.inf)
    if detect_negative and detect_positive:
        return ex.logical_or(pos, neg)
    return pos if detect_positive else neg if detect_negative else ex.zeros(x.shape, ex.bool)


def _int_div(a, b):
    return ex.divide(a, b).astype(a.dtype) if not a.dtype.is_float else ex.divide(a, b)


_BINARY = {"Add": ex.add, "Sub": ex.subtract, "Mul": ex.multiply, "Div": _int_div,
           "Equal": ex.equal, "Less": ex.less, "LessOrEqual": ex.less_equal, "Greater": ex.greater,
           "GreaterOrEqual": ex.greater_equal, "And": ex.logical_and, "Or": ex.logical_or,
           "Xor": lambda a, b: ex.not_equal(a.astype(ex.bool), b.astype(ex.bool))}
for _name, _fn in _BINARY.items():
    op(_name)(lambda a, b, _fn=_fn: _fn(a, b))


@op("Pow")
def pow_(a, b):
    if a.dtype.is_float or b.dtype.is_float:
        return ex.pow(a.astype(ex.float32), b.astype(ex.float32)).astype(a.dtype)
    return ex.pow(a, b.astype(a.dtype))


@op("Mod", host=True)
def mod(a, b, *, fmod=0):
    if a.dtype.is_float:
        q = ex.divide(a, b)
        q = ex.where(q < 0, ex.ceil(q), ex.floor(q)) if fmod else ex.floor(q)
        return a - q * b
    return host(lambda x, y: (np.fmod(x, y) if fmod else np.mod(x, y)).astype(x.dtype), a, b)


@op("BitShift", host=True)
def bitshift(a, b, *, direction):
    return host(lambda x, y: (x << y) if direction == "LEFT" else (x >> y), a, b)


for _name, _np in (("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or), ("BitwiseXor", np.bitwise_xor)):
    op(_name, host=True)(lambda a, b, _np=_np: host(_np, a, b))
op("BitwiseNot", host=True)(lambda x: host(np.invert, x))


def _variadic(fn):
    def run(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return run


op("Max")(_variadic(ex.maximum))
op("Min")(_variadic(ex.minimum))
op("Sum")(_variadic(ex.add))


@op("Mean")
def mean_(*xs):
    return _variadic(ex.add)(*xs) / float(len(xs))


@op("Where")
def where(c, a, b):
    return ex.where(c, a, b)


@op("Clip")
def clip(x, lo=None, hi=None, *, min=None, max=None):
    lo = scalar(lo, min)
    hi = scalar(hi, max)
    if x.dtype.is_float:
        return ex.clip(x, -math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))
    if lo is not None:
        x = ex.maximum(x, like(lo, x))
    if hi is not None:
        x = ex.minimum(x, like(hi, x))
    return x


@op("Cast")
def cast(x, *, to, saturate=1, round_mode="up"):
    return x.astype(express_dtype(to, "Cast"))


@op("CastLike")
def cast_like(x, target, *, saturate=1, round_mode="up"):
    return x.astype(target.dtype)


# ---- reductions ----
def _axes(x, axes_in, axes, noop):
    if axes_in is not None:
        axes = ints(axes_in)
    if not axes:
        return None if noop else tuple(range(x.ndim))
    return tuple(naxis(a, x.ndim) for a in axes)


def _reduce(name, fn, keep_dtype=True, empty=None):
    def run(x, axes_in=None, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        ax = _axes(x, axes_in, axes, noop_with_empty_axes)
        if ax is None:
            return x
        if empty is not None and any(x.shape[a] == 0 for a in ax):
            shape = tuple(1 if i in ax else s for i, s in enumerate(x.shape)) if keepdims else \
                tuple(s for i, s in enumerate(x.shape) if i not in ax)
            v = empty
            if x.dtype.is_bool:
                v = empty > 0
            elif x.dtype.is_int:
                v = int(np.iinfo(x.dtype.np).max if empty > 0 else np.iinfo(x.dtype.np).min)
            return ex.full(shape, v, x.dtype)
        y = fn(x, ax, bool(keepdims))
        return y.astype(x.dtype) if keep_dtype and y.dtype is not x.dtype else y
    op(name)(run)


def _logsumexp(x, ax, k):
    m = ex.max(x, axis=ax, keepdims=True)
    m = ex.where(ex.abs(m) == math.inf, 0.0, m)
    y = ex.log(ex.sum(ex.exp(x - m), axis=ax, keepdims=True)) + m
    return y if k else ex.squeeze(y, ax)


_reduce("ReduceSum", lambda x, a, k: ex.sum(x, a, k))
_reduce("ReduceMean", lambda x, a, k: ex.mean(x, a, k))
_reduce("ReduceProd", lambda x, a, k: ex.prod(x, a, k))
_reduce("ReduceMax", lambda x, a, k: ex.max(x, a, k), empty=-math.inf)
_reduce("ReduceMin", lambda x, a, k: ex.min(x, a, k), empty=math.inf)
_reduce("ReduceL1", lambda x, a, k: ex.sum(ex.abs(x), a, k))
_reduce("ReduceL2", lambda x, a, k: ex.sqrt(ex.sum(ex.square(x.astype(ex.float32)), a, k)))
_reduce("ReduceSumSquare", lambda x, a, k: ex.sum(ex.square(x), a, k))
_reduce("ReduceLogSum", lambda x, a, k: ex.log(ex.sum(x, a, k)), empty=-math.inf)
_reduce("ReduceLogSumExp", _logsumexp, empty=-math.inf)


def _arg(fn):
    def run(x, *, axis=0, keepdims=1, select_last_index=0):
        axis = naxis(axis, x.ndim)
        if select_last_index:
            y = fn(ex.flip(x, axis), axis=axis, keepdims=bool(keepdims))
            return (x.shape[axis] - 1) - y
        return fn(x, axis=axis, keepdims=bool(keepdims))
    return run


op("ArgMax")(_arg(ex.argmax))
op("ArgMin")(_arg(ex.argmin))


@op("CumSum")
def cumsum(x, axis, *, exclusive=0, reverse=0):
    axis = naxis(scalar(axis), x.ndim)
    if reverse:
        x = ex.flip(x, axis)
    if exclusive:
        pre = (slice(None),) * axis
        x = ex.concat([ex.zeros(x.shape[:axis] + (1,) + x.shape[axis + 1:], x.dtype),
                       x[pre + (slice(0, x.shape[axis] - 1),)]], axis=axis)
    y = ex.cumsum(x, axis).astype(x.dtype)
    return ex.flip(y, axis) if reverse else y


def softmax_any(x, axis, old, kind="soft"):
    """Softmax along `axis`; `old` (opset < 13): over the 2-D flattening [:axis] x [axis:]."""
    axis = naxis(axis, x.ndim)
    shape = x.shape
    if old and axis != x.ndim - 1:
        x = ex.reshape(x, (int(np.prod(shape[:axis])), -1))
        axis = 1
    if kind == "hard":
        i = ex.argmax(x, axis=axis, keepdims=True)
        y = ex.equal(ex.reshape(ex.arange(x.shape[axis]), (-1,) + (1,) * (x.ndim - axis - 1)), i).astype(x.dtype)
    else:
        y = F.softmax(x, axis) if kind == "soft" else F.log_softmax(x, axis)
    return ex.reshape(y, shape) if y.shape != shape else y


def _softmax(kind):
    def run(ctx, x, *, axis=None):
        old = ctx.opset < 13
        return softmax_any(x, (1 if old else -1) if axis is None else axis, old, kind)
    return run


op("Softmax", ctx=True, kernel="softmax")(_softmax("soft"))
op("LogSoftmax", ctx=True, kernel="log_softmax")(_softmax("log"))
op("Hardmax", ctx=True)(_softmax("hard"))


# ---- shape ----
@op("Shape")
def shape_(x, *, start=0, end=None):
    s = list(x.shape)
    return const(np.array(s[slice(start, end)], np.int64))


@op("Size")
def size_(x):
    return const(np.array(x.size, np.int64))


@op("Reshape")
def reshape(x, shape, *, allowzero=0):
    s = ints(shape)
    if not allowzero:
        s = [x.shape[i] if v == 0 else v for i, v in enumerate(s)]
    return ex.reshape(x, tuple(s))


@op("Flatten")
def flatten(x, *, axis=1):
    axis = axis + x.ndim if axis < 0 else axis
    return ex.reshape(x, (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))


@op("Squeeze")
def squeeze(x, axes_in=None, *, axes=None):
    if axes_in is not None:
        axes = ints(axes_in)
    return ex.squeeze(x, None if not axes else tuple(axes))


@op("Unsqueeze")
def unsqueeze(x, axes_in=None, *, axes=None):
    if axes_in is not None:
        axes = ints(axes_in)
    n = x.ndim + len(axes)
    axes = sorted(naxis(a, n) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return ex.reshape(x, tuple(shape))


@op("Transpose")
def transpose(x, *, perm=None):
    return ex.permute_dims(x, tuple(perm) if perm is not None else tuple(range(x.ndim))[::-1])


@op("Concat")
def concat(*xs, axis):
    xs = [x for x in xs if x is not None]
    axis = naxis(axis, xs[0].ndim)
    nonempty = [x for x in xs if x.size] or xs[:1]
    return ex.concat(nonempty, axis=axis) if len(nonempty) > 1 else ex.array(nonempty[0])


@op("Split", ctx=True)
def split(ctx, x, split_in=None, *, axis=0, split=None, num_outputs=None):
    axis = naxis(axis, x.ndim)
    if split_in is not None:
        split = ints(split_in)
    n = x.shape[axis]
    if not split:
        k = num_outputs or len(ctx.node.outputs)
        step = -(-n // k)
        split = [builtins.min(step, n - i * step) for i in range(k)]
    if sum(split) != n:
        raise ShapeError(f"Split: sizes {split} do not add up to axis {axis} of shape {x.shape}")
    bounds = np.cumsum(split)[:-1].tolist()
    return tuple(ex.split(x, bounds, axis=axis))


def _slices(x, starts, ends, axes, steps):
    key = [slice(None)] * x.ndim
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = naxis(a, x.ndim)
        n = x.shape[a]
        if st == 0:
            raise ShapeError("Slice: step must not be zero")
        s = s + n if s < 0 else s
        e = e + n if e < 0 else e
        if st > 0:
            s, e = builtins.min(builtins.max(s, 0), n), builtins.min(builtins.max(e, 0), n)
        else:
            s, e = builtins.min(builtins.max(s, 0), n - 1), builtins.min(builtins.max(e, -1), n - 1)
        key[a] = slice(s, e if e >= 0 else None, st)
    return x[tuple(key)]


@op("Slice")
def slice_(x, starts=None, ends=None, axes_in=None, steps=None, *, axes=None, **old):
    if starts is None:  # opset < 10: attributes
        return _slices(x, old["starts"], old["ends"], axes, None)
    return _slices(x, ints(starts), ints(ends), ints(axes_in) if axes_in is not None else None,
                   ints(steps) if steps is not None else None)


@op("Gather")
def gather(x, idx, *, axis=0):
    return ex.take(x, idx, axis=naxis(axis, x.ndim))


def _strides(shape):
    st = np.ones(len(shape), np.int64)
    for i in range(len(shape) - 2, -1, -1):
        st[i] = st[i + 1] * shape[i + 1]
    return st


def _norm_idx(idx, n):
    idx = idx.astype(ex.int64)
    return ex.where(idx < 0, idx + n, idx)


@op("GatherElements")
def gather_elements(x, idx, *, axis=0):
    axis = naxis(axis, x.ndim)
    st = _strides(x.shape)
    lin = _norm_idx(idx, x.shape[axis]) * int(st[axis])
    for d in range(x.ndim):
        if d != axis:
            shape = [1] * x.ndim
            shape[d] = idx.shape[d]
            lin = lin + const((np.arange(idx.shape[d], dtype=np.int64) * st[d]).reshape(shape))
    return ex.take(ex.reshape(x, (-1,)), lin)


@op("GatherND")
def gather_nd(x, idx, *, batch_dims=0):
    b, k = batch_dims, idx.shape[-1]
    bshape = x.shape[:b]
    nb = int(np.prod(bshape))
    inner = x.shape[b:b + k]
    rest = x.shape[b + k:]
    st = _strides(inner)
    lin = None
    for j in range(k):
        term = _norm_idx(idx[..., j], inner[j]) * int(st[j])
        lin = term if lin is None else lin + term
    if lin is None:
        lin = ex.zeros(idx.shape[:-1], ex.int64)
    n_inner = int(np.prod(inner))
    if b:
        boff = (np.arange(nb, dtype=np.int64) * n_inner).reshape(bshape + (1,) * (idx.ndim - 1 - b))
        lin = lin + const(boff)
    flat = ex.reshape(x, (nb * n_inner,) + rest)
    return ex.take(flat, lin, axis=0)


def _bshape(a, b):
    return tuple(np.broadcast_shapes(tuple(a), tuple(b)))


@op("Expand")
def expand(x, shape):
    return ex.broadcast_to(x, _bshape(x.shape, ints(shape)))


@op("Tile")
def tile(x, repeats):
    r = ints(repeats)
    mid = ex.reshape(x, tuple(v for s in x.shape for v in (1, s)))
    big = ex.broadcast_to(mid, tuple(v for rr, s in zip(r, x.shape) for v in (rr, s)))
    return ex.reshape(big, tuple(rr * s for rr, s in zip(r, x.shape)))


def _attr_tensor(value):
    return const(value) if isinstance(value, np.ndarray) else value


@op("Constant")
def constant_(**kw):
    (k, v), = kw.items()
    if k == "value" or k == "sparse_value":
        return const(v)
    if k == "value_float":
        return const(np.float32(v))
    if k == "value_floats":
        return const(np.array(v, np.float32))
    if k == "value_int":
        return const(np.int64(v))
    if k == "value_ints":
        return const(np.array(v, np.int64))
    raise ModelError(f"Constant: {k} values are not supported")


@op("ConstantOfShape")
def constant_of_shape(shape, *, value=None):
    v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return ex.full(tuple(ints(shape)), v[0].item(), dt.from_numpy(v.dtype))


@op("Range")
def range_(start, limit, delta):
    s = val(start)
    return const(np.arange(scalar(start), scalar(limit), scalar(delta)).astype(s.dtype))


@op("EyeLike")
def eye_like(x, *, dtype=None, k=0):
    d = express_dtype(dtype, "EyeLike") if dtype is not None else x.dtype
    return const(np.eye(x.shape[0], x.shape[1], k, dtype=d.np))


@op("Trilu")
def trilu(x, k=None, *, upper=1):
    k = int(scalar(k, 0))
    return ex.triu(x, k) if upper else ex.tril(x, k)


def _pad_kernel(x, before, after, mode, value):
    """F.pad where it applies: no cropping, only the last 3 axes padded, reflect pads below the size."""
    kmode = {"constant": "constant", "edge": "replicate", "reflect": "reflect"}.get(mode)
    padded = [a for a in range(x.ndim) if before[a] or after[a]]
    if kmode is None or not padded or padded[0] < x.ndim - 3 or builtins.min(list(before) + list(after)) < 0 \
            or x.dtype is ex.bool or any(x.shape[a] == 0 for a in padded) \
            or mode == "constant" and not x.dtype.is_float and int(float(value)) != value \
            or mode == "reflect" and any(builtins.max(before[a], after[a]) >= x.shape[a] for a in padded):
        return None
    flat = []
    for a in range(x.ndim - 1, padded[0] - 1, -1):
        flat += [int(before[a]), int(after[a])]
    return F.pad(x, flat, kmode, float(value) if mode == "constant" else 0.0)


def _pad(x, before, after, mode="constant", value=0):
    """Pad every axis by `before[i]`/`after[i]` (negative crops) with a constant, edge, reflect or wrap."""
    y = _pad_kernel(x, before, after, mode, value)
    if y is not None:
        return y
    for a in range(x.ndim):
        b, e = int(before[a]), int(after[a])
        if b == 0 and e == 0:
            continue
        n = x.shape[a]
        idx = np.arange(-b, n + e)
        if mode in ("constant",):
            outside = (idx < 0) | (idx >= n)
            pos = np.clip(idx, 0, builtins.max(n - 1, 0))
        elif mode == "edge":
            pos = np.clip(idx, 0, n - 1)
        elif mode == "reflect":
            period = 2 * (n - 1) if n > 1 else 1
            m = np.mod(idx, period)
            pos = np.where(m >= n, period - m, m) if n > 1 else np.zeros_like(idx)
        elif mode == "wrap":
            pos = np.mod(idx, n)
        else:
            raise ModelError(f"Pad: mode {mode!r} is not supported")
        if n == 0:
            shape = x.shape[:a] + (len(idx),) + x.shape[a + 1:]
            x = ex.full(shape, value, x.dtype)
            continue
        x = ex.take(x, pos.astype(np.int64), axis=a)
        if mode == "constant" and outside.any():
            shape = [1] * x.ndim
            shape[a] = len(idx)
            x = ex.where(const(outside.reshape(shape)), like(value, x), x)
    return x


@op("Pad", kernel="pad")
def pad(x, pads=None, value=None, axes=None, *, mode="constant", **old):
    if pads is None:
        p, v = old["pads"], old.get("value", 0.0)
    else:
        p, v = ints(pads), scalar(value, 0)
    n = len(p) // 2
    ax = list(range(x.ndim)) if axes is None else [naxis(a, x.ndim) for a in ints(axes)]
    before, after = [0] * x.ndim, [0] * x.ndim
    for i, a in enumerate(ax[:n]):
        before[a], after[a] = p[i], p[i + n]
    return _pad(x, before, after, mode, v)


@op("DepthToSpace")
def depth_to_space(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = ex.permute_dims(ex.reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = ex.permute_dims(ex.reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return ex.reshape(y, (n, c // (b * b), h * b, w * b))


@op("SpaceToDepth")
def space_to_depth(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = ex.permute_dims(ex.reshape(x, (n, c, h // b, b, w // b, b)), perm)
    return ex.reshape(y, (n, c * b * b, h // b, w // b))


@op("OneHot")
def one_hot(indices, depth, values, *, axis=-1):
    d = int(scalar(depth))
    axis = naxis(axis, indices.ndim + 1)
    idx = indices.astype(ex.int64) if not indices.dtype.is_float else indices.astype(ex.float32).astype(ex.int64)
    idx = ex.where(idx < 0, idx + d, idx)
    r = const(np.arange(d, dtype=np.int64).reshape((d,) + (1,) * (indices.ndim - axis)))
    hot = ex.equal(ex.expand_dims(idx, axis), r)
    off, on = values[0], values[1]
    return ex.where(hot, on, off)


@op("NonZero", host=True)
def nonzero(x):
    return const(np.array(np.nonzero(val(x)), dtype=np.int64).reshape(x.ndim, -1))


@op("Compress")
def compress(x, cond, *, axis=None):
    keep = np.flatnonzero(val(cond).astype(bool))
    if axis is None:
        x, axis = ex.reshape(x, (-1,)), 0
    axis = naxis(axis, x.ndim)
    keep = keep[keep < x.shape[axis]]
    return ex.take(x, const(keep.astype(np.int64)), axis=axis)


@op("TopK", host=True)
def topk(x, k, *, axis=-1, largest=1, sorted=1):
    def run(a, kk):
        kk = int(kk.reshape(-1)[0])
        ax = naxis(axis, a.ndim)
        order = np.argsort(-a if largest else a, axis=ax, kind="stable")
        idx = np.take(order, np.arange(kk), axis=ax)
        return np.take_along_axis(a, idx, axis=ax), idx.astype(np.int64)
    return host(run, x, k)


@op("Unique", host=True)
def unique(x, *, axis=None, sorted=1):
    def run(a):
        y, first, inv, cnt = np.unique(a, return_index=True, return_inverse=True, return_counts=True, axis=axis)
        if not sorted:
            order = np.argsort(first, kind="stable")
            remap = np.empty_like(order)
            remap[order] = np.arange(len(order))
            y = np.take(y, order, axis=0 if axis is None else axis)
            first, cnt, inv = first[order], cnt[order], remap[inv.reshape(-1)]
        return y, first.astype(np.int64), inv.reshape(-1).astype(np.int64), cnt.astype(np.int64)
    return host(run, x)


def _reduce_np(reduction):
    return {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]


def _scatter_elements(data, idx, upd, axis=0, reduction="none"):
    out = data.copy()
    axis = naxis(axis, data.ndim)
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    full_idx = list(np.indices(idx.shape, sparse=True))
    full_idx[axis] = idx
    fn = _reduce_np(reduction)
    if fn is None:
        out[tuple(full_idx)] = upd
    else:
        fn.at(out, tuple(np.broadcast_arrays(*full_idx)), upd)
    return out


op("ScatterElements", host=True)(lambda d, i, u, *, axis=0, reduction="none":
                                 host(lambda a, b, c: _scatter_elements(a, b, c, axis, reduction), d, i, u))
op("Scatter", host=True)(lambda d, i, u, *, axis=0: host(lambda a, b, c: _scatter_elements(a, b, c, axis), d, i, u))


@op("ScatterND", host=True)
def scatter_nd(data, idx, upd, *, reduction="none"):
    def run(a, i, u):
        out = a.copy()
        fn = _reduce_np(reduction)
        for pos in np.ndindex(i.shape[:-1]):
            key = tuple(i[pos])
            out[key] = u[pos] if fn is None else fn(out[key], u[pos])
        return out
    return host(run, data, idx, upd)


@op("ReverseSequence")
def reverse_sequence(x, seq_lens, *, batch_axis=1, time_axis=0):
    lens = ints(seq_lens)
    t_n, b_n = x.shape[time_axis], x.shape[batch_axis]
    src = np.tile(np.arange(t_n)[:, None], (1, b_n))
    for b, n in enumerate(lens):
        src[:n, b] = np.arange(n)[::-1]
    shape = [1] * x.ndim
    shape[time_axis], shape[batch_axis] = t_n, b_n
    idx = src if time_axis < batch_axis else src.T
    idx = np.broadcast_to(idx.reshape(shape), x.shape).astype(np.int64)
    return gather_elements(x, const(np.ascontiguousarray(idx)), axis=time_axis)


@op("Einsum")
def einsum(*xs, equation):
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    letters = sorted(set(c for c in lhs if c.isalpha()))
    # expand an ellipsis into fresh upper-case-free letters
    if "..." in lhs:
        spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
        nell = builtins.max(x.ndim - (len(t) - 3) for x, t in zip(xs, terms) if "..." in t)
        ell = "".join(spare[:nell])
        terms = [t.replace("...", ell[nell - (x.ndim - (len(t) - 3)):]) if "..." in t else t for x, t in zip(xs, terms)]
        rhs = rhs.replace("...", ell) if "->" in eq else None
        letters = sorted(set("".join(terms)))
    if "->" not in eq or rhs is None:
        counts = {c: sum(t.count(c) for t in terms) for c in letters}
        rhs = (ell if "..." in lhs else "") + "".join(c for c in letters if counts[c] == 1 and c not in (ell if "..." in lhs else ""))
    ops_ = []
    for x, t in zip(xs, terms):
        if len(set(t)) != len(t):  # a repeated index: take the diagonal
            for c in set(t):
                while t.count(c) > 1:
                    i, j = t.index(c), t.index(c, t.index(c) + 1)
                    n = x.shape[i]
                    perm = [k for k in range(x.ndim) if k not in (i, j)] + [i, j]
                    y = ex.reshape(ex.permute_dims(x, perm), x.shape[:0] + tuple(x.shape[k] for k in perm[:-2]) + (n * n,))
                    x = ex.take(y, const(np.arange(n) * (n + 1)), axis=-1)
                    t = "".join(t[k] for k in perm[:-2]) + c
        ops_.append((x, t))
    x, t = ops_[0]
    for y, u in ops_[1:]:
        x, t = _einsum2(x, t, y, u, rhs, [v for _, v in ops_])
    keep = [c for c in t if c in rhs]
    drop = tuple(i for i, c in enumerate(t) if c not in rhs)
    if drop:
        x = ex.sum(x, axis=drop)
        t = "".join(keep)
    return ex.permute_dims(x, tuple(t.index(c) for c in rhs)) if t != rhs else x


def _einsum2(a, ta, b, tb, rhs, all_terms):
    later = rhs + "".join(all_terms)
    # sum out indices that appear only in one operand and nowhere after
    def reduce_only(x, t, other):
        drop = tuple(i for i, c in enumerate(t) if c not in other and c not in rhs)
        if drop:
            x = ex.sum(x, axis=drop)
            t = "".join(c for i, c in enumerate(t) if i not in drop)
        return x, t
    a, ta = reduce_only(a, ta, tb)
    b, tb = reduce_only(b, tb, ta)
    batch = [c for c in ta if c in tb and c in rhs]
    contract = [c for c in ta if c in tb and c not in rhs]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    dims = {c: n for t, x in ((ta, a), (tb, b)) for c, n in zip(t, x.shape)}
    for c in batch:
        dims[c] = builtins.max(a.shape[ta.index(c)], b.shape[tb.index(c)])
    pa = ex.permute_dims(a, tuple(ta.index(c) for c in batch + left + contract))
    pb = ex.permute_dims(b, tuple(tb.index(c) for c in batch + contract + right))
    pr = lambda cs: int(np.prod([dims[c] for c in cs]))  # noqa: E731
    bs = tuple(pa.shape[:len(batch)])
    bsb = tuple(pb.shape[:len(batch)])
    ma = ex.reshape(pa, bs + (pr(left), pr(contract)))
    mb = ex.reshape(pb, bsb + (pr(contract), pr(right)))
    y = ex.matmul(ma, mb)
    y = ex.reshape(y, tuple(y.shape[:len(batch)]) + tuple(dims[c] for c in left + right))
    return y, "".join(batch + left + right)


# ---- linear algebra, quantization ----
@op("MatMul")
def matmul(a, b):
    return ex.matmul(a, b)


@op("Gemm")
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    if transA:
        a = ex.matrix_transpose(a)
    if transB:
        b = ex.matrix_transpose(b)
    y = ex.matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return y


def _zp(z, x_dtype=ex.uint8):
    return z.astype(ex.int32) if z is not None else None


@op("MatMulInteger")
def matmul_integer(a, b, a_zp=None, b_zp=None):
    a32, b32 = a.astype(ex.int32), b.astype(ex.int32)
    if a_zp is not None:
        z = a_zp.astype(ex.int32)
        a32 = a32 - (ex.reshape(z, (-1, 1)) if z.ndim == 1 and z.size > 1 else z)
    if b_zp is not None:
        b32 = b32 - b_zp.astype(ex.int32)
    return ex.matmul(a32, b32).astype(ex.int32)


def _along(p, axis, ndim):
    """A per-axis parameter (1-D) shaped to broadcast along `axis` of a rank-`ndim` tensor."""
    if p.ndim == 1 and p.size > 1 and ndim:
        shape = [1] * ndim
        shape[naxis(axis, ndim)] = p.shape[0]
        return ex.reshape(p, tuple(shape))
    return p


def _blocked(p, axis, block, x):
    """Expand a blocked scale/zero point along `axis` to the shape of x."""
    if block and p.ndim == x.ndim:
        a = naxis(axis, x.ndim)
        return ex.take(p, const(np.arange(x.shape[a]) // block), axis=a)
    return _along(p, axis, x.ndim)


_QRANGE = {ex.uint8: (0, 255), ex.int8: (-128, 127), ex.int32: (-2 ** 31, 2 ** 31 - 1)}


@op("QuantizeLinear")
def quantize_linear(x, scale, zp=None, *, axis=1, block_size=0, saturate=1, output_dtype=0, precision=0):
    out = zp.dtype if zp is not None else (express_dtype(output_dtype, "QuantizeLinear") if output_dtype else ex.uint8)
    if out not in _QRANGE:
        raise DTypeError(f"QuantizeLinear: output type {out.name} is not supported")
    lo, hi = _QRANGE[out]
    s = _blocked(scale.astype(ex.float32), axis, block_size, x)
    y = ex.round(x.astype(ex.float32) / s)
    if zp is not None:
        y = y + _blocked(zp.astype(ex.float32), axis, block_size, x)
    return ex.clip(y, float(lo), float(hi)).astype(out)


@op("DequantizeLinear")
def dequantize_linear(x, scale, zp=None, *, axis=1, block_size=0, output_dtype=0):
    y = x.astype(ex.float32)
    if zp is not None:
        y = y - _blocked(zp.astype(ex.float32), axis, block_size, x)
    y = y * _blocked(scale.astype(ex.float32), axis, block_size, x)
    return y.astype(scale.dtype if scale.dtype.is_float else ex.float32)


@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(x):
    lo = ex.minimum(ex.min(x), 0.0)
    hi = ex.maximum(ex.max(x), 0.0)
    scale = (hi - lo) / 255.0
    zp = ex.clip(ex.round(0.0 - lo / scale), 0.0, 255.0)
    y = ex.clip(ex.round(x / scale) + zp, 0.0, 255.0).astype(ex.uint8)
    return y, scale, zp.astype(ex.uint8)


def _requant(acc, scale, y_scale, y_zp, axis_shape=None):
    y = ex.round(acc.astype(ex.float32) * scale / y_scale)
    out = y_zp.dtype if y_zp is not None else ex.uint8
    if y_zp is not None:
        y = y + y_zp.astype(ex.float32)
    lo, hi = _QRANGE[out]
    return ex.clip(y, float(lo), float(hi)).astype(out)


@op("QLinearMatMul")
def qlinear_matmul(a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp):
    acc = matmul_integer(a, b, a_zp, b_zp)
    bs = b_s.astype(ex.float32)
    if bs.ndim == 1 and bs.size > 1:
        bs = ex.reshape(bs, (1, -1))
    return _requant(acc, a_s.astype(ex.float32) * bs, y_s.astype(ex.float32), y_zp)


# ---- convolution and pooling (NCHW, any number of spatial dims) ----
# 2-D float convolutions and pools run on the kernels of express.nn.functional (conv2d picks 1x1 /
# im2col GEMM, depthwise or Winograd); other ranks, integer convolutions and what the kernels do not
# cover (asymmetric pool padding, ...) compose im2col (take) + matmul / reductions.
USE_F_CONV2D = True


def _conv_pads(x_sp, k, strides, dilations, pads, auto_pad):
    nd = len(x_sp)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        b, e = [], []
        for i in range(nd):
            out = -(-x_sp[i] // strides[i])
            total = builtins.max(0, (out - 1) * strides[i] + (k[i] - 1) * dilations[i] + 1 - x_sp[i])
            lo = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            b.append(lo)
            e.append(total - lo)
        return b, e
    if auto_pad == "VALID" or pads is None:
        return [0] * nd, [0] * nd
    return list(pads[:nd]), list(pads[nd:])


def _window_index(sp, k, strides, dilations, out):
    """[K, L] flat positions (in an array of spatial shape `sp`) of each window tap / output place."""
    nd = len(sp)
    kk = np.indices(k).reshape(nd, -1)
    oo = np.indices(out).reshape(nd, -1)
    pos = oo[:, None, :] * np.array(strides)[:, None, None] + kk[:, :, None] * np.array(dilations)[:, None, None]
    return np.ravel_multi_index(tuple(pos), sp).astype(np.int64)


def _patches(x, k, strides, dilations, before, after, value=0.0):
    """x [N, C, *S] -> windows [N, C, K, L] and the output spatial shape."""
    xp = _pad(x, [0, 0] + list(before), [0, 0] + list(after), "constant", value)
    sp = xp.shape[2:]
    out = [(sp[i] - dilations[i] * (k[i] - 1) - 1) // strides[i] + 1 for i in range(len(sp))]
    if any(o <= 0 for o in out):
        raise ShapeError(f"window {k} does not fit the padded input {sp}")
    idx = _window_index(sp, k, strides, dilations, out)
    flat = ex.reshape(xp, xp.shape[:2] + (int(np.prod(sp)),))
    cols = ex.take(flat, const(idx.reshape(-1)), axis=2)
    return ex.reshape(cols, xp.shape[:2] + idx.shape), out


def _conv_setup(x, w_shape, kernel_shape, strides, dilations, pads, auto_pad):
    nd = x.ndim - 2
    k = list(kernel_shape or w_shape[2:])
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    before, after = _conv_pads(x.shape[2:], k, strides, dilations, pads, auto_pad)
    return k, strides, dilations, before, after


def _conv(x, w, b, k, strides, dilations, before, after, group, zero=0.0):
    n, c = x.shape[:2]
    o = w.shape[0]
    if USE_F_CONV2D and x.ndim == 4 and x.dtype.is_float and w.dtype.is_float:
        if w._value is not None:
            # a fresh constant per build: the planner caches transformed (Winograd) weights per
            # weight tensor, and a second lookup of the same tensor there fails
            w = constant(w._value)
        return F.conv2d(x, w, b, stride=tuple(strides), padding=(before[0], before[1], after[0], after[1]),
                        dilation=tuple(dilations), groups=group)
    cols, out = _patches(x, k, strides, dilations, before, after, zero)
    kk = cols.shape[2]
    cols = ex.reshape(cols, (n, group, (c // group) * kk, -1))
    wm = ex.reshape(w, (1, group, o // group, (c // group) * kk))
    y = ex.reshape(ex.matmul(wm, cols), (n, o) + tuple(out))
    if b is not None:
        y = y + ex.reshape(b, (o,) + (1,) * len(out))
    return y


@op("Conv", kernel="conv2d")
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    setup = _conv_setup(x, w.shape, kernel_shape, strides, dilations, pads, auto_pad)
    return _conv(x, w, b, *setup, group)


@op("ConvInteger")
def conv_integer(x, w, x_zp=None, w_zp=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None):
    xi = x.astype(ex.int32) - (x_zp.astype(ex.int32) if x_zp is not None else 0)
    wi = w.astype(ex.int32) - (_along(w_zp.astype(ex.int32), 0, w.ndim) if w_zp is not None else 0)
    setup = _conv_setup(x, w.shape, kernel_shape, strides, dilations, pads, auto_pad)
    return _conv(xi, wi, None, *setup, group, zero=0).astype(ex.int32)


@op("QLinearConv")
def qlinear_conv(x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, b=None, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    acc = conv_integer(x, w, x_zp, w_zp, auto_pad=auto_pad, dilations=dilations, group=group,
                       kernel_shape=kernel_shape, pads=pads, strides=strides)
    if b is not None:
        acc = acc + ex.reshape(b.astype(ex.int32), (-1,) + (1,) * (x.ndim - 2))
    ws = _along(w_s.astype(ex.float32), 1, x.ndim) if w_s.size > 1 else w_s.astype(ex.float32)
    return _requant(acc, x_s.astype(ex.float32) * ws, y_s.astype(ex.float32), y_zp)


@op("ConvTranspose", kernel="conv2d")
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    nd = x.ndim - 2
    k = list(kernel_shape or w.shape[2:])
    s = list(strides or [1] * nd)
    d = list(dilations or [1] * nd)
    op_ = list(output_padding or [0] * nd)
    sp = x.shape[2:]
    if output_shape is not None:
        output_shape = list(output_shape)[-nd:]
        total = [s[i] * (sp[i] - 1) + op_[i] + ((k[i] - 1) * d[i] + 1) - output_shape[i] for i in range(nd)]
        if auto_pad == "SAME_UPPER":
            before = [t // 2 for t in total]
        else:
            before = [t - t // 2 for t in total]
        after = [t - bb for t, bb in zip(total, before)]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [builtins.max(0, s[i] * (sp[i] - 1) + op_[i] + ((k[i] - 1) * d[i] + 1) - sp[i] * s[i]) for i in range(nd)]
        before = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        after = [t - bb for t, bb in zip(total, before)]
    else:
        p = list(pads or [0] * (2 * nd))
        before, after = p[:nd], p[nd:]
    n, c = x.shape[:2]
    # zero-stuff the input by the strides
    for i in range(nd):
        if s[i] > 1:
            a = 2 + i
            z = ex.zeros(x.shape[:a + 1] + (s[i] - 1,) + x.shape[a + 1:], x.dtype)
            y = ex.concat([ex.expand_dims(x, a + 1), z], axis=a + 1)
            y = ex.reshape(y, x.shape[:a] + (x.shape[a] * s[i],) + x.shape[a + 1:])
            x = y[(slice(None),) * a + (slice(0, (sp[i] - 1) * s[i] + 1),)]
    full = [d[i] * (k[i] - 1) for i in range(nd)]
    pb = [full[i] - before[i] for i in range(nd)]
    pe = [full[i] - after[i] + op_[i] for i in range(nd)]
    og = w.shape[1]
    wt = ex.reshape(w, (group, c // group, og) + tuple(k))
    wt = ex.permute_dims(wt, (0, 2, 1) + tuple(range(3, 3 + nd)))
    wt = ex.flip(ex.reshape(wt, (group * og, c // group) + tuple(k)), tuple(range(2, 2 + nd)))
    pos_b = [builtins.max(v, 0) for v in pb]
    pos_e = [builtins.max(v, 0) for v in pe]
    x = _pad(x, [0, 0] + [-builtins.max(-v, 0) for v in pb], [0, 0] + [-builtins.max(-v, 0) for v in pe])
    return _conv(x, ex.array(wt), b, k, [1] * nd, d, pos_b, pos_e, group)


def _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    nd = x.ndim - 2
    k = list(kernel_shape)
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    sp = x.shape[2:]
    before, after = _conv_pads(sp, k, strides, dilations, pads, auto_pad)
    extra = [0] * nd
    if ceil_mode:
        for i in range(nd):
            span = sp[i] + before[i] + after[i] - dilations[i] * (k[i] - 1) - 1
            out = -(-span // strides[i]) + 1
            if (out - 1) * strides[i] >= sp[i] + before[i]:
                out -= 1
            extra[i] = builtins.max(0, (out - 1) * strides[i] + dilations[i] * (k[i] - 1) + 1 - (sp[i] + before[i] + after[i]))
    return k, strides, dilations, before, after, extra


def _pool_kernel_ok(x, k, b, a):
    """The 2-D pool kernels take float NCHW with symmetric padding of at most half the window."""
    return USE_F_CONV2D and x.ndim == 4 and x.dtype.is_float and b == a and all(2 * p <= kk for p, kk in zip(b, k))


@op("MaxPool", ctx=True, kernel="max_pool2d")
def max_pool(ctx, x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None, storage_order=0,
             strides=None):
    k, s, d, b, a, extra = _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if _pool_kernel_ok(x, k, b, a) and len([o for o in ctx.node.outputs if o]) == 1:
        return F.max_pool2d(x, k, s, b, d, bool(ceil_mode))
    low = -math.inf if x.dtype.is_float else int(np.iinfo(x.dtype.np).min)
    ae = [p + e for p, e in zip(a, extra)]
    cols, out = _patches(x, k, s, d, b, ae, low)
    y = ex.max(cols, axis=2)
    n, c = x.shape[:2]
    # the index of each maximum in the unpadded input (NCHW-flat, or column-major with storage_order)
    sp = x.shape[2:]
    psp = tuple(sp[i] + b[i] + ae[i] for i in range(len(sp)))
    table = _window_index(psp, k, s, d, out)
    coords = np.array(np.unravel_index(table, psp)) - np.array(b).reshape(-1, 1, 1)
    coords = np.clip(coords, 0, np.array(sp).reshape(-1, 1, 1) - 1)
    if storage_order:
        flat = np.zeros(table.shape, np.int64)
        mult = 1
        for i in range(len(sp)):
            flat += coords[i] * mult
            mult *= sp[i]
    else:
        flat = np.ravel_multi_index(tuple(coords), sp)
    L = table.shape[1]
    am = ex.argmax(cols, axis=2)
    lin = am * L + const(np.arange(L, dtype=np.int64))
    idx = ex.take(const(flat.reshape(-1).astype(np.int64)), lin)
    idx = idx + const((np.arange(n * c, dtype=np.int64) * int(np.prod(sp))).reshape(n, c, 1))
    shape = (n, c) + tuple(out)
    return ex.reshape(y, shape), ex.reshape(idx, shape)


@op("AveragePool", kernel="avg_pool2d")
def avg_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape, pads=None,
             strides=None):
    k, s, d, b, a, extra = _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if _pool_kernel_ok(x, k, b, a) and d == [1, 1]:
        return F.avg_pool2d(x, k, s, b, bool(ceil_mode), bool(count_include_pad))
    ae = [p + e for p, e in zip(a, extra)]
    cols, out = _patches(x, k, s, d, b, ae, 0.0)
    tot = ex.sum(cols, axis=2)
    sp = x.shape[2:]
    mask = np.ones(sp, np.float32)
    if count_include_pad:
        mask = np.pad(mask, [(bb, aa) for bb, aa in zip(b, a)], constant_values=1)
        mask = np.pad(mask, [(0, e) for e in extra])
    else:
        mask = np.pad(mask, [(bb, aa) for bb, aa in zip(b, ae)])
    table = _window_index(mask.shape, k, s, d, out)
    cnt = mask.reshape(-1)[table].sum(axis=0)
    n, c = x.shape[:2]
    y = tot / const(np.maximum(cnt, 1).astype(np.float32))
    return ex.reshape(y, (n, c) + tuple(out)).astype(x.dtype)


@op("LpPool")
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, p=2, pads=None, strides=None):
    k, s, d, b, a, extra = _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    cols, out = _patches(x, k, s, d, b, [q + e for q, e in zip(a, extra)], 0.0)
    y = ex.pow(ex.sum(ex.pow(ex.abs(cols), float(p)), axis=2), 1.0 / p)
    return ex.reshape(y, x.shape[:2] + tuple(out))


@op("GlobalAveragePool", kernel="adaptive_avg_pool2d")
def global_avg_pool(x):
    if _pool_kernel_ok(x, (2, 2), (0, 0), (0, 0)) and min(x.shape[2:]) > 0:
        return F.adaptive_avg_pool2d(x, 1)
    return ex.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@op("GlobalMaxPool", kernel="adaptive_max_pool2d")
def global_max_pool(x):
    if _pool_kernel_ok(x, (2, 2), (0, 0), (0, 0)) and min(x.shape[2:]) > 0:
        return F.adaptive_max_pool2d(x, 1)
    return ex.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@op("GlobalLpPool")
def global_lp_pool(x, *, p=2):
    return ex.pow(ex.sum(ex.pow(ex.abs(x), float(p)), axis=tuple(range(2, x.ndim)), keepdims=True), 1.0 / p)


# ---- normalization ----
def _chan(p, ndim):
    return ex.reshape(p, (-1,) + (1,) * (ndim - 2))


@op("BatchNormalization", kernel="batch_norm")
def batch_norm(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1,
               is_test=0, consumed_inputs=None):
    if training_mode:
        axes = (0,) + tuple(range(2, x.ndim))
        m = ex.mean(x, axis=axes)
        v = ex.mean(ex.square(x - _chan(m, x.ndim)), axis=axes)
        y = (x - _chan(m, x.ndim)) * _chan(F.rsqrt(v + epsilon) * scale, x.ndim) + _chan(bias, x.ndim)
        return y, mean * momentum + m * (1 - momentum), var * momentum + v * (1 - momentum)
    c = (x.shape[1],) if x.ndim >= 2 else None
    if x.dtype.is_float and all(t.shape == c for t in (scale, bias, mean, var)):
        return F.batch_norm(x, mean, var, scale, bias, eps=epsilon)
    inv = F.rsqrt(var.astype(ex.float32) + epsilon) * scale.astype(ex.float32)
    shift = bias.astype(ex.float32) - mean.astype(ex.float32) * inv
    return (x * _chan(inv, x.ndim) + _chan(shift, x.ndim)).astype(x.dtype)


def _normalize(x, axes, eps):
    m = ex.mean(x, axis=axes, keepdims=True)
    c = x - m
    inv = F.rsqrt(ex.mean(ex.square(c), axis=axes, keepdims=True) + eps)
    return c * inv, m, inv


@op("InstanceNormalization")
def instance_norm(x, scale, bias, *, epsilon=1e-5):
    y, _, _ = _normalize(x, tuple(range(2, x.ndim)), epsilon)
    return y * _chan(scale, x.ndim) + _chan(bias, x.ndim)


@op("LayerNormalization", kernel="layer_norm")
def layer_norm(x, scale=None, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """The fused layer_norm kernel where scale and bias have the normalized shape; the mean and
    inverse std outputs are built lazily (computed only when the graph reads them)."""
    axis = naxis(axis, x.ndim)
    xf = x.astype(ex.float32)
    axes = tuple(range(axis, x.ndim))
    y, m, inv = _normalize(xf, axes, epsilon)
    n = x.shape[axis:]
    if x.dtype.is_float and all(t is None or t.shape == n for t in (scale, bias)):
        return F.layer_norm(x, n, scale, bias, eps=epsilon), m, inv
    if scale is not None:
        y = y * scale.astype(ex.float32)
    if bias is not None:
        y = y + bias.astype(ex.float32)
    return y.astype(x.dtype), m, inv


@op("RMSNormalization", kernel="rms_norm")
def rms_norm(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    axis = naxis(axis, x.ndim)
    if axis == x.ndim - 1 and x.dtype.is_float and scale.shape == x.shape[-1:]:
        return F.rms_norm(x, scale, eps=epsilon)
    xf = x.astype(ex.float32)
    inv = F.rsqrt(ex.mean(ex.square(xf), axis=tuple(range(axis, x.ndim)), keepdims=True) + epsilon)
    return (xf * inv * scale.astype(ex.float32)).astype(x.dtype)


@op("SkipLayerNormalization", domain="com.microsoft")
def skip_layer_norm(x, skip, gamma, beta=None, bias=None, *, epsilon=1e-12):
    s = x + skip + (bias if bias is not None else 0.0)
    return layer_norm(s, gamma, beta, epsilon=epsilon)[0], None, None, s


@op("GroupNormalization", ctx=True)
def group_norm(ctx, x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    n, c = x.shape[:2]
    xg = ex.reshape(x.astype(ex.float32), (n, num_groups, -1))
    y, _, _ = _normalize(xg, (2,), epsilon)
    if scale.shape[0] == c and (ctx.opset >= 21 or c == num_groups):
        y = ex.reshape(y, x.shape)
        return (y * _chan(scale, x.ndim) + _chan(bias, x.ndim)).astype(x.dtype)
    y = y * ex.reshape(scale, (-1, 1)) + ex.reshape(bias, (-1, 1))
    return ex.reshape(y, x.shape).astype(x.dtype)


@op("LpNormalization")
def lp_norm(x, *, axis=-1, p=2):
    a = naxis(axis, x.ndim)
    nrm = ex.sum(ex.abs(x), axis=a, keepdims=True) if p == 1 else ex.sqrt(ex.sum(ex.square(x), axis=a, keepdims=True))
    return ex.where(nrm == 0, like(0, x), x / ex.where(nrm == 0, like(1, x), nrm))


@op("MeanVarianceNormalization")
def mvn(x, *, axes=(0, 2, 3)):
    return _normalize(x, tuple(naxis(a, x.ndim) for a in axes), 1e-9)[0]


@op("LRN")
def lrn(x, *, alpha=1e-4, beta=0.75, bias=1.0, size):
    sq = ex.square(x)
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    p = _pad(sq, [0, lo] + [0] * (x.ndim - 2), [0, hi] + [0] * (x.ndim - 2))
    c = x.shape[1]
    acc = None
    for i in range(size):
        part = p[:, i:i + c]
        acc = part if acc is None else acc + part
    return x / ex.pow(acc * (alpha / size) + bias, beta)


@op("Dropout")
def dropout(x, ratio=None, training_mode=None, *, seed=None, is_test=0, ratio_=None):
    if training_mode is not None and bool(scalar(training_mode)) and scalar(ratio, 0.5) > 0:
        raise ModelError("Dropout: training mode is not supported (inference only)")
    return x, ex.ones(x.shape, ex.bool)


# ---- resize ----
def _src_coords(n, out_n, scale, ctm, roi):
    """ONNX Resize: the source coordinate of each output position along one axis."""
    i = np.arange(out_n, dtype=np.float64)
    if ctm == "half_pixel":
        src = (i + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        adj = out_n / (scale * n)
        src = n / 2 * (1 - adj) + (i + 0.5) / scale - 0.5
    elif ctm == "pytorch_half_pixel":
        src = (i + 0.5) / scale - 0.5 if out_n > 1 else np.zeros_like(i)
    elif ctm == "align_corners":
        src = i * (n - 1) / (out_n - 1) if out_n > 1 else np.zeros_like(i)
    elif ctm == "asymmetric":
        src = i / scale
    elif ctm == "tf_crop_and_resize":
        s, e = roi
        src = s * (n - 1) + i * (e - s) * (n - 1) / (out_n - 1) if out_n > 1 else np.full_like(i, 0.5 * (s + e) * (n - 1))
    else:
        raise ModelError(f"Resize: coordinate_transformation_mode {ctm!r} is not supported")
    return src


def _nearest(src, nearest_mode, n):
    if nearest_mode == "round_prefer_floor":
        j = np.where(src - np.floor(src) == 0.5, np.floor(src), np.round(src))
    elif nearest_mode == "round_prefer_ceil":
        j = np.where(src - np.floor(src) == 0.5, np.ceil(src), np.round(src))
    elif nearest_mode == "floor":
        j = np.floor(src)
    else:
        j = np.ceil(src)
    return np.clip(j, 0, n - 1).astype(np.int64)


def _resize_axis(x, a, out_n, scale, mode, ctm, nearest_mode, cubic_a, exclude_outside, roi, extrap):
    n = x.shape[a]
    src = _src_coords(n, out_n, scale, ctm, roi)
    outside = (src < 0) | (src > n - 1) if ctm == "tf_crop_and_resize" else None

    def shaped(v):
        s = [1] * x.ndim
        s[a] = out_n
        return const(v.astype(np.float32).reshape(s))

    if mode == "nearest":
        y = ex.take(x, _nearest(src, nearest_mode, n), axis=a)
    elif mode == "linear":
        s = np.clip(src, 0, n - 1)
        j0 = np.floor(s).astype(np.int64)
        j1 = np.minimum(j0 + 1, n - 1)
        w = s - j0
        y = ex.take(x, j0, axis=a) * shaped(1 - w) + ex.take(x, j1, axis=a) * shaped(w)
    elif mode == "cubic":
        j0 = np.floor(src).astype(np.int64)
        t = src - j0
        A = cubic_a

        def kern(d):
            d = np.abs(d)
            return np.where(d <= 1, ((A + 2) * d - (A + 3)) * d * d + 1,
                            np.where(d < 2, ((A * d - 5 * A) * d + 8 * A) * d - 4 * A, 0.0))
        taps = [j0 + o for o in (-1, 0, 1, 2)]
        ws = [kern(t - o) for o in (-1, 0, 1, 2)]
        if exclude_outside:
            ws = [np.where((tp < 0) | (tp >= n), 0.0, w) for tp, w in zip(taps, ws)]
            tot = sum(ws)
            ws = [w / tot for w in ws]
        y = None
        for tp, w in zip(taps, ws):
            term = ex.take(x, np.clip(tp, 0, n - 1).astype(np.int64), axis=a) * shaped(w)
            y = term if y is None else y + term
    else:
        raise ModelError(f"Resize: mode {mode!r} is not supported")
    if outside is not None and outside.any():
        s = [1] * x.ndim
        s[a] = out_n
        y = ex.where(const(outside.reshape(s)), extrap, y)
    return y


@op("Resize", kernel="interpolate")
def resize(x, roi=None, scales=None, sizes=None, *, mode="nearest", coordinate_transformation_mode="half_pixel",
           cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, nearest_mode="round_prefer_floor",
           antialias=0, axes=None, keep_aspect_ratio_policy="stretch"):
    if antialias:
        raise ModelError("Resize: antialias is not supported")
    ax = list(range(x.ndim)) if axes is None else [naxis(a, x.ndim) for a in axes]
    r = val(roi).astype(np.float64).reshape(-1) if roi is not None and roi.size else None
    if sizes is not None and sizes.size:
        sz = ints(sizes)
        if keep_aspect_ratio_policy != "stretch":
            ratios = [sz[i] / x.shape[a] for i, a in enumerate(ax)]
            s = builtins.min(ratios) if keep_aspect_ratio_policy == "not_larger" else builtins.max(ratios)
            sz = [int(math.floor(s * x.shape[a] + 0.5)) for a in ax]
            sc = [s] * len(ax)
        else:
            sc = [sz[i] / x.shape[a] for i, a in enumerate(ax)]
    else:
        sc = [float(v) for v in val(scales).reshape(-1)]
        sz = [int(math.floor(x.shape[a] * s)) for a, s in zip(ax, sc)]
    mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
    y = _resize_kernel(x, ax, sz, sc, sizes is not None and sizes.size, mode, coordinate_transformation_mode,
                       nearest_mode)
    if y is not None:
        return y
    y = x if x.dtype.is_float or mode == "nearest" else x.astype(ex.float32)
    for i, a in enumerate(ax):
        if sz[i] == x.shape[a] and sc[i] == 1.0 and coordinate_transformation_mode != "tf_crop_and_resize":
            continue
        roi_a = (r[i], r[i + len(ax)]) if r is not None else (0.0, 1.0)
        y = _resize_axis(y, a, sz[i], sc[i], mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
                         exclude_outside, roi_a, extrapolation_value)
    return y.astype(x.dtype)


def _resize_kernel(x, ax, sz, sc, by_size, mode, ctm, nearest_mode):
    """F.interpolate where its sampling is the ONNX one: float NCHW resized over H and W, nearest
    with the same source indices, or bilinear with half-pixel centres or aligned corners."""
    full = {a: (n, s) for a, n, s in zip(ax, sz, sc)}
    if not (x.ndim == 4 and x.dtype.is_float and ctm != "tf_crop_and_resize" and all(full.get(a, (x.shape[a], 1.0)) == (x.shape[a], 1.0)
                                                      for a in (0, 1))):
        return None
    size = tuple(full.get(a, (x.shape[a], 1.0))[0] for a in (2, 3))
    scale = tuple(full.get(a, (x.shape[a], 1.0))[1] for a in (2, 3))
    if min(size) < 1 or min(x.shape[2:]) < 1:
        return None
    kscale = [x.shape[2 + i] / size[i] if by_size else 1.0 / scale[i] for i in range(2)]
    if mode == "nearest":
        for i in range(2):
            n = x.shape[2 + i]
            want = _nearest(_src_coords(n, size[i], scale[i], ctm, (0.0, 1.0)), nearest_mode, n)
            d = np.arange(size[i])
            for f in (np.float32, np.float64):   # the kernel's floor(dst * scale), in either precision
                if not np.array_equal(np.minimum(np.floor(d.astype(f) * f(kscale[i])), n - 1), want):
                    return None
        align = None
    elif mode == "linear" and (ctm == "half_pixel" or ctm == "pytorch_half_pixel" and min(size) > 1):
        align = False
    elif mode == "linear" and ctm == "align_corners":
        align = True
    else:
        return None
    kw = {"size": size} if by_size else {"scale_factor": scale}
    return F.interpolate(x, mode="nearest" if mode == "nearest" else "bilinear", align_corners=align, **kw)


@op("Upsample")
def upsample(x, scales=None, *, mode="nearest", **old):
    sc = const(np.array(old["scales"] if scales is None else val(scales), np.float32))
    return resize(x, None, sc, mode=mode, coordinate_transformation_mode="asymmetric", nearest_mode="floor")


# ---- recurrent networks ----
_ACT = {"sigmoid": F.sigmoid, "tanh": ex.tanh, "relu": F.relu,
        "affine": None, "leakyrelu": None, "thresholdedrelu": None, "scaledtanh": None,
        "hardsigmoid": None, "elu": None, "softsign": lambda x: x / (ex.abs(x) + 1.0),
        "softplus": _softplus}


def _acts(names, alphas, betas, defaults, ndir):
    names = names or defaults * ndir
    out = []
    ai = bi = 0
    for nm in names:
        key = nm.lower()
        f = _ACT.get(key, "missing")
        if f == "missing":
            raise ModelError(f"RNN activation {nm!r} is not supported")
        if f is None:
            al = alphas[ai] if alphas and ai < len(alphas) else None
            be = betas[bi] if betas and bi < len(betas) else None
            ai, bi = ai + 1, bi + 1
            f = {"affine": lambda x, a=al, b=be: x * a + b,
                 "leakyrelu": lambda x, a=al if al is not None else 0.01: ex.where(x < 0, x * a, x),
                 "thresholdedrelu": lambda x, a=al if al is not None else 1.0: ex.where(x > a, x, 0.0),
                 "scaledtanh": lambda x, a=al, b=be: ex.tanh(x * b) * a,
                 "hardsigmoid": lambda x, a=al if al is not None else 0.2, b=be if be is not None else 0.5:
                     ex.clip(x * a + b, 0.0, 1.0),
                 "elu": lambda x, a=al if al is not None else 1.0: ex.where(x < 0, (ex.exp(x) - 1.0) * a, x)}[key]
        out.append(f)
    return out


def _rnn(kind, X, W, R, B, seq_lens, h0, c0, P, *, activations, alphas, betas, clip_, direction,
         hidden_size, layout, input_forget=0, linear_before_reset=0):
    if layout:
        X = ex.permute_dims(X, (1, 0, 2))
        h0 = ex.permute_dims(h0, (1, 0, 2)) if h0 is not None else None
        c0 = ex.permute_dims(c0, (1, 0, 2)) if c0 is not None else None
    T, N = X.shape[:2]
    H = hidden_size
    ndir = 2 if direction == "bidirectional" else 1
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    fs = _acts(activations, alphas, betas, defaults, ndir)
    per = len(defaults)
    lens = ints(seq_lens) if seq_lens is not None else [T] * N
    ragged = any(v != T for v in lens)
    ys, hs, cs = [], [], []
    for d in range(ndir):
        f = fs[d * per:(d + 1) * per]
        reverse = direction == "reverse" or d == 1
        Wd, Rd = W[d], R[d]
        Wb = ex.matrix_transpose(Wd)
        Rt = ex.matrix_transpose(Rd)
        bias_w = B[d, :gates * H] if B is not None else None
        bias_r = B[d, gates * H:] if B is not None else None
        xw = ex.matmul(X, Wb)   # [T, N, gates*H], all steps at once
        if bias_w is not None:
            xw = xw + bias_w
        h = h0[d] if h0 is not None else ex.zeros((N, H), X.dtype)
        c = c0[d] if c0 is not None else ex.zeros((N, H), X.dtype)
        outs = [None] * T
        steps = range(T - 1, -1, -1) if reverse else range(T)
        for t in steps:
            valid = None
            if ragged:
                valid = const(np.array([t < v for v in lens]).reshape(N, 1))
            g = xw[t]
            hr = ex.matmul(h, Rt)
            if kind == "GRU":
                rb = bias_r if bias_r is not None else None
                z = f[0](_clip(g[:, :H] + hr[:, :H] + (rb[:H] if rb is not None else 0.0), clip_))
                r = f[0](_clip(g[:, H:2 * H] + hr[:, H:2 * H] + (rb[H:2 * H] if rb is not None else 0.0), clip_))
                if linear_before_reset:
                    hh = hr[:, 2 * H:] + (rb[2 * H:] if rb is not None else 0.0)
                    n_ = f[1](_clip(g[:, 2 * H:] + r * hh, clip_))
                else:
                    hh = ex.matmul(r * h, ex.matrix_transpose(Rd[2 * H:]))
                    n_ = f[1](_clip(g[:, 2 * H:] + hh + (rb[2 * H:] if rb is not None else 0.0), clip_))
                hn = (1.0 - z) * n_ + z * h
            else:
                a = g + hr
                if bias_r is not None:
                    a = a + bias_r
                if kind == "RNN":
                    hn = f[0](_clip(a, clip_))
                else:
                    i_, o_, f_, c_ = (a[:, k * H:(k + 1) * H] for k in range(4))
                    if P is not None:
                        pi, po, pf = P[d, :H], P[d, H:2 * H], P[d, 2 * H:]
                        i_ = i_ + pi * c
                        f_ = f_ + pf * c
                    it = f[0](_clip(i_, clip_))
                    ft = (1.0 - it) if input_forget else f[0](_clip(f_, clip_))
                    ct = f[1](_clip(c_, clip_))
                    cn = ft * c + it * ct
                    if P is not None:
                        o_ = o_ + po * cn
                    ot = f[0](_clip(o_, clip_))
                    hn = ot * f[2](cn)
                    c = ex.where(valid, cn, c) if valid is not None else cn
            if valid is not None:
                outs[t] = ex.where(valid, hn, 0.0)
                h = ex.where(valid, hn, h)
            else:
                outs[t] = hn
                h = hn
        ys.append(ex.stack(outs, axis=0) if T else ex.zeros((0, N, H), X.dtype))
        hs.append(h)
        cs.append(c)
    Y = ex.stack(ys, axis=1)          # [T, ndir, N, H]
    Yh, Yc = ex.stack(hs, axis=0), ex.stack(cs, axis=0)
    if layout:
        Y = ex.permute_dims(Y, (2, 0, 1, 3))
        Yh, Yc = ex.permute_dims(Yh, (1, 0, 2)), ex.permute_dims(Yc, (1, 0, 2))
    return (Y, Yh, Yc) if kind == "LSTM" else (Y, Yh)


def _clip(x, c):
    return ex.clip(x, -c, c) if c is not None else x


def _rnn_op(kind):
    def run(X, W, R, B=None, seq_lens=None, h0=None, c0=None, P=None, *, activation_alpha=None,
            activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, layout=0,
            input_forget=0, linear_before_reset=0):
        if kind != "LSTM":
            c0, P = None, None
        H = hidden_size or R.shape[-1]
        return _rnn(kind, X, W, R, B, seq_lens, h0, c0, P, activations=activations, alphas=activation_alpha,
                    betas=activation_beta, clip_=clip, direction=direction, hidden_size=H, layout=layout,
                    input_forget=input_forget, linear_before_reset=linear_before_reset)
    op(kind)(run)


for _k in ("RNN", "GRU", "LSTM"):
    _rnn_op(_k)


# ---- control flow ----
@op("If", ctx=True)
def if_(ctx, cond, *, then_branch, else_branch):
    return tuple(ctx.subgraph(then_branch if bool(scalar(cond)) else else_branch, []))


@op("Loop", ctx=True)
def loop(ctx, M=None, cond=None, *carried, body):
    trip = scalar(M) if M is not None else None
    keep = bool(scalar(cond)) if cond is not None else True
    n_carried = len(carried)
    scans = None
    i = 0
    carried = list(carried)
    while keep and (trip is None or i < trip):
        outs = ctx.subgraph(body, [const(np.array(i, np.int64)), const(np.array(keep))] + carried)
        keep = bool(scalar(outs[0]))
        carried = list(outs[1:1 + n_carried])
        step = outs[1 + n_carried:]
        if scans is None:
            scans = [[] for _ in step]
        for s, v in zip(scans, step):
            s.append(v)
        ex.eval(*[c for c in carried if isinstance(c, Tensor)])
        i += 1
        if trip is None and i > 1_000_000:
            raise ModelError("Loop: more than 1e6 iterations without a trip count")
    n_scan = len(body.outputs) - 1 - n_carried
    if scans is None:
        scan_out = [ex.zeros((0,), ex.float32) for _ in range(n_scan)]
    else:
        scan_out = [ex.stack(s, axis=0) if s and isinstance(s[0], Tensor) else s for s in scans]
    return tuple(carried) + tuple(scan_out)


@op("Scan", ctx=True)
def scan(ctx, *args, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None):
    n_state = len(args) - num_scan_inputs
    state, xs = list(args[:n_state]), args[n_state:]
    in_axes = scan_input_axes or [0] * num_scan_inputs
    in_dirs = scan_input_directions or [0] * num_scan_inputs
    T = xs[0].shape[naxis(in_axes[0], xs[0].ndim)]
    outs_per = []
    for t in range(T):
        step_in = []
        for x, a, d in zip(xs, in_axes, in_dirs):
            a = naxis(a, x.ndim)
            step_in.append(ex.take(x, const(np.array(T - 1 - t if d else t, np.int64)), axis=a))
        outs = ctx.subgraph(body, state + step_in)
        state = list(outs[:n_state])
        outs_per.append(outs[n_state:])
    n_out = len(body.outputs) - n_state
    o_axes = scan_output_axes or [0] * n_out
    o_dirs = scan_output_directions or [0] * n_out
    res = []
    for j in range(n_out):
        seq = [o[j] for o in outs_per]
        if o_dirs[j]:
            seq = seq[::-1]
        res.append(ex.stack(seq, axis=naxis(o_axes[j], seq[0].ndim + 1)))
    return tuple(state) + tuple(res)


# ---- sequences and optionals (Python lists and None) ----
op("SequenceEmpty")(lambda *, dtype=1: [])
op("SequenceConstruct")(lambda *xs: list(xs))
op("SequenceLength")(lambda s: const(np.array(len(s), np.int64)))
op("SequenceAt")(lambda s, i: s[int(scalar(i))])


@op("SequenceInsert")
def sequence_insert(s, x, pos=None):
    s = list(s)
    p = len(s) if pos is None else int(scalar(pos))
    s.insert(p if p >= 0 else p + len(s), x)
    return s


@op("SequenceErase")
def sequence_erase(s, pos=None):
    s = list(s)
    del s[-1 if pos is None else int(scalar(pos))]
    return s


@op("SplitToSequence")
def split_to_sequence(x, split=None, *, axis=0, keepdims=1):
    axis = naxis(axis, x.ndim)
    if split is None:
        parts = [ex.take(x, const(np.array(i, np.int64)), axis=axis) for i in range(x.shape[axis])]
        return parts if not keepdims else [ex.expand_dims(p, axis) for p in parts]
    sv = ints(split)
    if split.ndim == 0:
        n = x.shape[axis]
        sv = [sv[0]] * (n // sv[0]) + ([n % sv[0]] if n % sv[0] else [])
    return list(ex.split(x, np.cumsum(sv)[:-1].tolist(), axis=axis))


@op("ConcatFromSequence")
def concat_from_sequence(s, *, axis, new_axis=0):
    if new_axis:
        return ex.stack(s, axis=naxis(axis, s[0].ndim + 1))
    return ex.concat(s, axis=naxis(axis, s[0].ndim))


@op("SequenceMap", ctx=True)
def sequence_map(ctx, s, *extra, body):
    n = len(s)
    outs = []
    for i in range(n):
        args = [s[i]] + [e[i] if isinstance(e, list) else e for e in extra]
        outs.append(ctx.subgraph(body, args))
    return tuple([o[j] for o in outs] for j in range(len(body.outputs)))


op("Optional")(lambda x=None, *, type=None: x)
op("OptionalHasElement")(lambda x=None: const(np.array(x is not None)))


@op("OptionalGetElement")
def optional_get(x):
    if x is None:
        raise ModelError("OptionalGetElement: the optional is empty")
    return x


# ---- Microsoft-domain ops that onnxruntime's optimizers write ----
op("Gelu", domain="com.microsoft")(lambda x: F.gelu(x))
op("FastGelu", domain="com.microsoft")(lambda x, bias=None: F.gelu(x + bias if bias is not None else x, approximate="tanh"))
op("BiasGelu", domain="com.microsoft")(lambda x, bias: F.gelu(x + bias))
op("QuickGelu", domain="com.microsoft")(lambda x, *, alpha=1.702: x * F.sigmoid(x * alpha))


@op("FusedMatMul", domain="com.microsoft")
def fused_matmul(a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    return gemm(a, b, alpha=alpha, transA=transA, transB=transB)


# ---- Express's own fused forms (written by the graph passes on import and by .exm quantization) ----
_FUSED_ACT = {"": lambda y: y, "Relu": F.relu, "Gelu": F.gelu, "Sigmoid": F.sigmoid, "Tanh": ex.tanh,
              "GeluTanh": lambda y: F.gelu(y, approximate="tanh")}


@op("Linear", domain="express", kernel="linear")
def linear(x, w, b=None, *, activation="", wt=0):
    """`act(x @ W + b)`; `wt=1`: the weight is stored (out, in) and runs on the linear kernel."""
    if wt and x.dtype.is_float and x.ndim >= 1:
        return _FUSED_ACT[activation](F.linear(x, w, b))
    y = ex.matmul(x, ex.matrix_transpose(w) if wt else w)
    if b is not None:
        y = y + b
    return _FUSED_ACT[activation](y)


@op("QLinear", domain="express", kernel="qlinear")
def qlinear(x, qweight, scales, b=None, *, bits, group_size, out_features, activation=""):
    """`act(x @ dequantize(W).T + b)` with W kept packed as express.ops.quant packs it, expanded
    inside the kernel (express.ops.quant.qlinear)."""
    from express.ops.quant import qlinear as _q
    y = _q(x, qweight, scales, b, bits=bits, group_size=group_size, out_features=out_features)
    return _FUSED_ACT[activation](y.astype(x.dtype) if x.dtype.is_float else y)


def unpack_rows(q, bits, k):
    """Rows of int8 values, or of uint8 bytes holding two int4 values + 8 (low nibble first), as
    float32 (..., k), lazily."""
    if bits == 8:
        return q.astype(ex.float32)
    u = q.astype(ex.float32)
    hi = ex.floor(u * (1 / 16))
    lo = u - hi * 16
    return ex.reshape(ex.stack([lo, hi], axis=-1), q.shape[:-1] + (k,)) - 8.0


@op("QGather", domain="express")
def qgather(qweight, scales, idx, *, bits, group_size, dtype="float32"):
    """Rows `idx` of a group-quantized table (an embedding, rows (int8 values or int4 pairs),
    float32 scales (rows, k / group_size)): only the rows looked up are expanded."""
    n = qweight.shape[0]
    i = ex.where(idx < 0, idx + n, idx)
    k = scales.shape[1] * group_size
    vals = unpack_rows(ex.take(qweight, i, axis=0), bits, k)
    s = ex.take(scales, i, axis=0)
    y = ex.reshape(ex.reshape(vals, vals.shape[:-1] + (-1, group_size)) * ex.expand_dims(s, -1), vals.shape)
    return y.astype(dt.as_dtype(dtype))


def _sdpa_ok(q, k, v, m):
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim or not q.dtype.is_float:
        return False
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1] \
            or k.shape[-2] != v.shape[-2] or min(q.shape + k.shape + v.shape) < 1:
        return False
    full = q.shape[:-1] + (k.shape[-2],)
    return m is None or (m.ndim <= len(full) and np.broadcast_shapes(m.shape, full) == full)


@op("Attention", domain="express", kernel="scaled_dot_product_attention")
def attention(q, kt, v, mask=None, *, scale=1.0, mask_kind="add", nan_guard=0, softmax_axis=-1, legacy_softmax=0):
    """softmax(q @ kt * scale + mask) @ v (kt: K transposed, as the written-out graph multiplies it)
    on the fused scaled_dot_product_attention kernel; `mask_kind` "fill_true"/"fill_false": `mask`
    is a bool condition selecting -inf; `nan_guard`: rows with every key masked give 0, not NaN."""
    m = mask
    if m is not None and mask_kind != "add":
        m = ex.where(m if mask_kind == "fill_true" else ex.logical_not(m), -math.inf, 0.0).astype(ex.float32)
    k = ex.matrix_transpose(kt) if kt.ndim >= 2 else kt
    if _sdpa_ok(q, k, v, m) and naxis(softmax_axis, q.ndim) == q.ndim - 1:
        y = F.scaled_dot_product_attention(q, k, v, m, scale=float(scale))
        if nan_guard and m is not None:
            y = ex.where(ex.equal(ex.max(m, axis=-1, keepdims=True), -math.inf), 0.0, y).astype(y.dtype)
        return y
    s = ex.matmul(q, kt) * like(scale, q) if q.dtype.is_float else ex.matmul(q, kt) * scale
    if m is not None:
        s = s + m
    p = softmax_any(s, softmax_axis, bool(legacy_softmax))
    if nan_guard:
        p = ex.where(ex.not_equal(p, p), like(0, p), p)
    return ex.matmul(p, v)


@op("Attention", kernel="scaled_dot_product_attention")
def attention_onnx(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
                   is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
                   softcap=0.0, softmax_precision=None):
    """ONNX Attention (opset 23): 3-D inputs split into heads, grouped-query heads repeated, causal
    and additive/bool masks, past key/value concatenated, optional softcap."""
    rank3 = Q.ndim == 3
    if rank3:
        b = Q.shape[0]
        Q = ex.permute_dims(ex.reshape(Q, (b, Q.shape[1], q_num_heads, -1)), (0, 2, 1, 3))
        K = ex.permute_dims(ex.reshape(K, (b, K.shape[1], kv_num_heads, -1)), (0, 2, 1, 3))
        V = ex.permute_dims(ex.reshape(V, (b, V.shape[1], kv_num_heads, -1)), (0, 2, 1, 3))
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[3])
    if past_key is not None:
        K = ex.concat([past_key, K], axis=2)
        V = ex.concat([past_value, V], axis=2)
    present_k, present_v = K, V
    sq, skv = Q.shape[2], K.shape[2]
    f = Q.dtype
    bias = None
    if attn_mask is not None:
        m = attn_mask
        if m.shape[-1] < skv:
            fill = False if m.dtype.is_bool else -math.inf
            m = ex.concat([m, ex.full(m.shape[:-1] + (skv - m.shape[-1],), fill, m.dtype)], axis=-1)
        bias = ex.where(m, 0.0, -math.inf).astype(ex.float32) if m.dtype.is_bool else m.astype(ex.float32)
    if is_causal:
        off = past_key.shape[2] if past_key is not None else 0
        allowed = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + off
        causal = const(np.where(allowed, 0.0, -np.inf).astype(np.float32))
        bias = causal if bias is None else bias + causal
    if nonpad_kv_seqlen is not None:
        lens = val(nonpad_kv_seqlen).reshape(-1, 1)
        pad = np.where(np.arange(skv)[None, :] < lens, 0.0, -np.inf).astype(np.float32)
        pad = const(pad.reshape(-1, 1, 1, skv))
        bias = pad if bias is None else bias + pad
    hq, hk = Q.shape[1], K.shape[1]
    fast = None
    full = (Q.shape[0], hq, sq, skv)
    if not softcap and Q.dtype.is_float and hq % hk == 0 and min(Q.shape + K.shape + V.shape) > 0 and (
            bias is None or bias.ndim <= 4 and np.broadcast_shapes(bias.shape, full) == full):
        fast = F.scaled_dot_product_attention(Q, K, V, bias, scale=float(scale))
        if bias is not None:
            fast = ex.where(ex.equal(ex.max(bias, axis=-1, keepdims=True), -math.inf), 0.0, fast).astype(fast.dtype)
    if hq != hk:
        rep = hq // hk
        K = ex.reshape(ex.broadcast_to(ex.expand_dims(K, 2), (K.shape[0], hk, rep) + K.shape[2:]), (K.shape[0], hq) + K.shape[2:])
        V = ex.reshape(ex.broadcast_to(ex.expand_dims(V, 2), (V.shape[0], hk, rep) + V.shape[2:]), (V.shape[0], hq) + V.shape[2:])
    s = ex.matmul(Q.astype(ex.float32), ex.matrix_transpose(K.astype(ex.float32))) * float(scale)
    if softcap:
        s = ex.tanh(s / softcap) * softcap
    qk = s
    if bias is not None:
        s = s + bias
    if qk_matmul_output_mode == 2:
        qk = s
    p = F.softmax(s, -1)
    if bias is not None:
        dead = ex.equal(ex.max(bias, axis=-1, keepdims=True), -math.inf)
        p = ex.where(dead, 0.0, p)
    if qk_matmul_output_mode == 3:
        qk = p
    y = ex.matmul(p, V.astype(ex.float32)).astype(f) if fast is None else fast.astype(f)
    if rank3:
        y = ex.reshape(ex.permute_dims(y, (0, 2, 1, 3)), (y.shape[0], y.shape[2], -1))
    return y, present_k, present_v, qk.astype(f)


op("Swish")(lambda x, *, alpha=1.0: x * F.sigmoid(x * alpha))


@op("SwiGLU")
def swiglu(a, b, *, alpha=1.0):
    if a.shape != b.shape:
        raise ShapeError(f"SwiGLU: inputs {a.shape} and {b.shape} must have the same shape")
    return (a * F.sigmoid(a * alpha).astype(a.dtype) * b).astype(a.dtype)


@op("RotaryEmbedding")
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    """Rotate (pairs of) the first `rotary_embedding_dim` features of each head by the cached
    angles: x (B, H, S, D) or (B, S, H * D); caches (S, d / 2), or (max_pos, d / 2) read at position_ids."""
    four = x.ndim == 4
    y = ex.permute_dims(x, (0, 2, 1, 3)) if four else ex.reshape(x, x.shape[:2] + (num_heads, -1))
    d = rotary_embedding_dim or y.shape[3]
    if position_ids is not None:
        cos_cache, sin_cache = ex.take(cos_cache, position_ids, axis=0), ex.take(sin_cache, position_ids, axis=0)
    if cos_cache.shape[-1] != d // 2 or sin_cache.shape[-1] != d // 2:
        raise ShapeError(f"RotaryEmbedding: caches {cos_cache.shape}, {sin_cache.shape} do not hold {d // 2} angles")
    c, s = ex.expand_dims(cos_cache, -2), ex.expand_dims(sin_cache, -2)   # (B or 1, S, 1, d / 2)
    rot, rest = y[..., :d], y[..., d:]
    if interleaved:
        pairs = ex.reshape(rot, rot.shape[:3] + (d // 2, 2))
        x1, x2 = pairs[..., 0], pairs[..., 1]
    else:
        x1, x2 = rot[..., :d // 2], rot[..., d // 2:]
    real, imag = c * x1 - s * x2, s * x1 + c * x2
    rot = ex.reshape(ex.stack([real, imag], axis=-1), rot.shape) if interleaved else ex.concat([real, imag], axis=-1)
    y = ex.concat([rot, rest], axis=-1).astype(x.dtype) if d < y.shape[3] else rot.astype(x.dtype)
    return ex.permute_dims(y, (0, 2, 1, 3)) if four else ex.reshape(y, x.shape)
op("CumProd", host=True)(lambda x, axis, *, exclusive=0, reverse=0: host(
    lambda a, ax: _cumprod(a, int(ax.reshape(-1)[0]), exclusive, reverse), x, axis))


def _cumprod(a, axis, exclusive, reverse):
    if reverse:
        a = np.flip(a, axis)
    y = np.cumprod(a, axis=axis)
    if exclusive:
        y = np.concatenate([np.ones_like(np.take(a, [0], axis=axis)), np.take(y, np.arange(a.shape[axis] - 1), axis=axis)], axis=axis)
    return (np.flip(y, axis) if reverse else y).astype(a.dtype)


@op("CenterCropPad")
def center_crop_pad(x, shape, *, axes=None):
    ax = list(range(x.ndim)) if axes is None else [naxis(a, x.ndim) for a in axes]
    before, after = [0] * x.ndim, [0] * x.ndim
    for a, n in zip(ax, ints(shape)):
        d = n - x.shape[a]
        if d >= 0:
            before[a], after[a] = d // 2, d - d // 2
        else:
            before[a], after[a] = -((-d) // 2), -((-d) - (-d) // 2)
    return _pad(x, before, after)


@op("NonMaxSuppression", host=True)
def non_max_suppression(boxes, scores, max_out=None, iou_th=None, score_th=None, *, center_point_box=0):
    def run(b, s, mo, it, st):
        mo = int(mo.reshape(-1)[0]) if mo is not None and mo.size else 0
        it = float(it.reshape(-1)[0]) if it is not None and it.size else 0.0
        st = float(st.reshape(-1)[0]) if st is not None and st.size else -np.inf
        out = []
        for bi in range(b.shape[0]):
            bx = b[bi].astype(np.float64)
            if center_point_box:
                bx = np.stack([bx[:, 1] - bx[:, 3] / 2, bx[:, 0] - bx[:, 2] / 2,
                               bx[:, 1] + bx[:, 3] / 2, bx[:, 0] + bx[:, 2] / 2], 1)
            y1, x1 = np.minimum(bx[:, 0], bx[:, 2]), np.minimum(bx[:, 1], bx[:, 3])
            y2, x2 = np.maximum(bx[:, 0], bx[:, 2]), np.maximum(bx[:, 1], bx[:, 3])
            area = (y2 - y1) * (x2 - x1)
            for ci in range(s.shape[1]):
                sc = s[bi, ci]
                order = [i for i in np.argsort(-sc, kind="stable") if sc[i] > st]
                keep = []
                for i in order:
                    if len(keep) >= mo:
                        break
                    ok = True
                    for j in keep:
                        ih = max(0.0, min(y2[i], y2[j]) - max(y1[i], y1[j]))
                        iw = max(0.0, min(x2[i], x2[j]) - max(x1[i], x1[j]))
                        inter = ih * iw
                        union = area[i] + area[j] - inter
                        if union > 0 and inter / union > it:
                            ok = False
                            break
                    if ok:
                        keep.append(i)
                out += [[bi, ci, i] for i in keep]
        return np.array(out, np.int64).reshape(-1, 3)
    return host(run, boxes, scores, max_out, iou_th, score_th)
