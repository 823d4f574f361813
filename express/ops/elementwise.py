"""Elementwise ops: arithmetic, comparisons, logic, math, activations, casts, `where`.

Each op is one `defop(..., kind="elementwise")`: `infer` (broadcasting + dtype rule), `emit`
(its instructions in a register program; see express/program.py) and `ref` (NumPy). Floats
compute in float32 registers (float16/bfloat16 widen on load, round once on store); integers and
bool compute in int64 registers and wrap to their width.
"""
from __future__ import annotations

import builtins

import numpy as np

from .. import dtypes as dt
from .._lib import lib
from ..errors import DTypeError, ShapeError
from ..program import F, I
from ..tensor import Tensor, as_tensor, node
from .registry import defop


def broadcast_shapes(name: str, *shapes) -> tuple:
    if all(s == shapes[0] for s in shapes):
        return tuple(shapes[0])
    nd = builtins.max((len(s) for s in shapes), default=0)
    out = []
    for i in range(-nd, 0):
        dims = {s[i] for s in shapes if len(s) >= -i} - {1}
        if len(dims) > 1:
            raise ShapeError(f"{name}: shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _operands(*xs):
    """Tensors for mixed Tensor/scalar operands; scalars take the type of the first tensor."""
    like = next((x for x in xs if isinstance(x, Tensor)), None)
    return [as_tensor(x, like) for x in xs]


def _public(op, arity, doc):
    """The user-facing function of an elementwise op: operands to tensors, then one node."""
    def fn(*xs):
        if len(xs) != arity:
            raise TypeError(f"{op.name}() takes {arity} argument{'s' if arity > 1 else ''}, got {len(xs)}")
        return node(op, _operands(*xs))
    fn.__name__ = fn.__qualname__ = op.name
    fn.__doc__ = doc
    return fn


def _no_bool(name, *ts):
    """Arithmetic needs a number: bool mixes with numbers (as 0/1) but not with itself."""
    if all(t.dtype.is_bool for t in ts):
        raise DTypeError(f"{name}: not defined for bool inputs "
                         f"({', '.join(t.dtype.name for t in ts)}); cast with astype first")


def _wrap(p, r, out: dt.DType):
    """Keep an int register inside the range of `out` (for narrow ints inside fused chains)."""
    if p.kinds[r] == I and out in (dt.int8, dt.uint8, dt.int32):
        return p.op(lib.EX_OP_I_WRAP, I, r, imm0=out.code)
    return r


def _to_domain(p, regs, out: dt.DType):
    return [p.as_float(r) for r in regs] if out.is_float else list(regs)


# ---- binary ops ----
def _arith_infer(name, allow_bool=False, true_div=False):
    def infer(a, b):
        if not allow_bool:
            _no_bool(name, a, b)
        d = dt.promote(a.dtype, b.dtype)
        if true_div and not d.is_float:
            d = dt.float32
        return broadcast_shapes(name, a.shape, b.shape), d
    return infer


# x+c, x-c, c-x, x*c, c*x with a float scalar c become one immediate op (a*imm0 + imm1): exact,
# and no broadcast register to fill
_AXPB = {lib.EX_OP_F_ADD: lambda c, first: (1.0, c), lib.EX_OP_F_MUL: lambda c, first: (c, 0.0),
         lib.EX_OP_F_SUB: lambda c, first: (-1.0, c) if first else (1.0, -c)}


def _arith_emit(fop, iop):
    def emit(p, regs, in_dtypes, out):
        a, b = _to_domain(p, regs, out)
        if out.is_float:
            if fop in _AXPB and (a in p.consts) != (b in p.consts):
                first = a in p.consts
                imm0, imm1 = _AXPB[fop](p.consts[a if first else b], first)
                return p.op(lib.EX_OP_F_AXPB, F, b if first else a, imm0=imm0, imm1=imm1)
            return p.op(fop, F, a, b)
        return _wrap(p, p.op(iop, I, a, b), out)
    return emit


def _binary(name, fop, iop, np_fn, allow_bool=False, true_div=False):
    op = defop(name, "elementwise", _arith_infer(name, allow_bool, true_div),
               lambda a, b: np_fn(a, b), emit=_arith_emit(fop, iop))
    return _public(op, 2, f"Elementwise `{name}` with NumPy broadcasting (see `numpy.{np_fn.__name__}`).")


add = _binary("add", lib.EX_OP_F_ADD, lib.EX_OP_I_ADD, np.add)
subtract = _binary("subtract", lib.EX_OP_F_SUB, lib.EX_OP_I_SUB, np.subtract)
multiply = _binary("multiply", lib.EX_OP_F_MUL, lib.EX_OP_I_MUL, np.multiply)
divide = _binary("divide", lib.EX_OP_F_DIV, None, np.true_divide, true_div=True)
pow = _binary("pow", lib.EX_OP_F_POW, lib.EX_OP_I_POW, np.power)
maximum = _binary("maximum", lib.EX_OP_F_MAX, lib.EX_OP_I_MAX, np.maximum, allow_bool=True)
minimum = _binary("minimum", lib.EX_OP_F_MIN, lib.EX_OP_I_MIN, np.minimum, allow_bool=True)


def _compare(name, fop, iop, np_fn):
    def infer(a, b):
        return broadcast_shapes(name, a.shape, b.shape), dt.bool_

    def emit(p, regs, in_dtypes, out):
        if dt.promote(*in_dtypes).is_float:
            return p.op(fop, I, *(p.as_float(r) for r in regs))
        return p.op(iop, I, *regs)
    op = defop(name, "elementwise", infer, lambda a, b: np_fn(a, b), emit=emit)
    return _public(op, 2, f"Elementwise `{name}` (a bool tensor), with broadcasting.")


equal = _compare("equal", lib.EX_OP_F_EQ, lib.EX_OP_I_EQ, np.equal)
not_equal = _compare("not_equal", lib.EX_OP_F_NE, lib.EX_OP_I_NE, np.not_equal)
less = _compare("less", lib.EX_OP_F_LT, lib.EX_OP_I_LT, np.less)
less_equal = _compare("less_equal", lib.EX_OP_F_LE, lib.EX_OP_I_LE, np.less_equal)
greater = _compare("greater", lib.EX_OP_F_GT, lib.EX_OP_I_GT, np.greater)
greater_equal = _compare("greater_equal", lib.EX_OP_F_GE, lib.EX_OP_I_GE, np.greater_equal)


def _logical(name, iop, np_fn):
    def infer(a, b):
        return broadcast_shapes(name, a.shape, b.shape), dt.bool_

    def emit(p, regs, in_dtypes, out):
        a, b = (r if p.kinds[r] == I else p.as_truth(r) for r in regs)
        return p.op(iop, I, a, b)
    op = defop(name, "elementwise", infer, lambda a, b: np_fn(a, b), emit=emit)
    return _public(op, 2, f"Elementwise `{name}`: operands count as true where nonzero.")


logical_and = _logical("logical_and", lib.EX_OP_I_AND, np.logical_and)
logical_or = _logical("logical_or", lib.EX_OP_I_OR, np.logical_or)

logical_not = _public(defop("logical_not", "elementwise", lambda a: (a.shape, dt.bool_), np.logical_not,
                            emit=lambda p, regs, ins, out: p.op(lib.EX_OP_I_NOT, I, p.as_truth(regs[0]))),
                      1, "Elementwise logical not (a bool tensor).")


# ---- unary ops ----
def _unary(name, np_fn, fop, iop=None, float_only=False, int_identity=False, no_bool=False):
    """float_only: ints compute as float32; int_identity: ints pass through unchanged."""
    def infer(a):
        if no_bool:
            _no_bool(name, a)
        if float_only and not a.dtype.is_float:
            return a.shape, dt.float32
        return a.shape, a.dtype

    def emit(p, regs, in_dtypes, out):
        r = regs[0]
        if out.is_float:
            return p.op(fop, F, p.as_float(r))
        if int_identity:
            return r
        return _wrap(p, p.op(iop, I, r), out)
    return _public(defop(name, "elementwise", infer, np_fn, emit=emit), 1, f"Elementwise `{name}`.")


abs = _unary("abs", np.abs, lib.EX_OP_F_ABS, lib.EX_OP_I_ABS, no_bool=True)
negative = _unary("negative", np.negative, lib.EX_OP_F_NEG, lib.EX_OP_I_NEG, no_bool=True)
exp = _unary("exp", np.exp, lib.EX_OP_F_EXP, float_only=True)
log = _unary("log", np.log, lib.EX_OP_F_LOG, float_only=True)
sqrt = _unary("sqrt", np.sqrt, lib.EX_OP_F_SQRT, float_only=True)
sin = _unary("sin", np.sin, lib.EX_OP_F_SIN, float_only=True)
cos = _unary("cos", np.cos, lib.EX_OP_F_COS, float_only=True)
tanh = _unary("tanh", np.tanh, lib.EX_OP_F_TANH, float_only=True)
floor = _unary("floor", np.floor, lib.EX_OP_F_FLOOR, int_identity=True)
ceil = _unary("ceil", np.ceil, lib.EX_OP_F_CEIL, int_identity=True)
round = _unary("round", np.round, lib.EX_OP_F_ROUND, int_identity=True)


def _erf(x):
    import math
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(np.asarray(x, np.float64) / np.sqrt(2.0)))


def _gelu_tanh(x):
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


# activations (exposed through express.nn.functional)
sigmoid = _unary("sigmoid", _sigmoid, lib.EX_OP_F_SIGMOID, float_only=True)
relu = _unary("relu", lambda x: np.maximum(x, 0), lib.EX_OP_F_RELU, float_only=True)
gelu = _unary("gelu", _gelu, lib.EX_OP_F_GELU, float_only=True)
gelu_tanh = _unary("gelu_tanh", _gelu_tanh, lib.EX_OP_F_GELU_TANH, float_only=True)
silu = _unary("silu", lambda x: np.asarray(x, np.float64) * _sigmoid(x), lib.EX_OP_F_SILU, float_only=True)
erf = _unary("erf", _erf, lib.EX_OP_F_ERF, float_only=True)
rsqrt = _unary("rsqrt", lambda x: 1.0 / np.sqrt(np.asarray(x, np.float64)), lib.EX_OP_F_RSQRT, float_only=True)
reciprocal = _unary("reciprocal", lambda x: 1.0 / np.asarray(x, np.float64), lib.EX_OP_F_RECIP, float_only=True)


def _square_emit(p, regs, in_dtypes, out):
    r = regs[0]
    if out.is_float:
        return p.op(lib.EX_OP_F_SQUARE, F, r)
    return _wrap(p, p.op(lib.EX_OP_I_MUL, I, r, r), out)


square = _public(defop("square", "elementwise", lambda a: (_no_bool("square", a), (a.shape, a.dtype))[1],
                       np.square, emit=_square_emit), 1, "Elementwise `x * x`.")


# ---- casts, copies, where, clip ----
def _cast_emit(p, regs, in_dtypes, out, dtype):
    r = regs[0]
    if out in (dt.float16, dt.bfloat16) and in_dtypes[0] != out:
        # registers hold float32: round here, or later ops in the chain would see the wide value
        return p.op(lib.EX_OP_F_NARROW, F, p.as_float(r), imm0=out.code)
    if out.is_float:
        return p.as_float(r)
    if out.is_bool:
        return p.as_truth(r)
    if p.kinds[r] == F:
        r = p.op(lib.EX_OP_F_TO_I, I, r)
    return _wrap(p, r, out)


_ASTYPE = defop("astype", "elementwise", lambda a, dtype: (a.shape, dtype),
                lambda a, dtype: np.asarray(a).astype(dtype.np), emit=_cast_emit)
# `copy` materializes its input (contiguous); the planner also inserts it where a kernel needs it
COPY = defop("copy", "elementwise", lambda a: (a.shape, a.dtype), lambda a: np.array(a),
             emit=lambda p, regs, ins, out: regs[0])


def astype(x, dtype):
    """`x` converted to `dtype` (floats to ints truncate toward zero; to bool is `!= 0`).

    >>> import express as ex
    >>> ex.astype(ex.asarray([1.7, -1.7, 0.0]), ex.int32).numpy()
    array([ 1, -1,  0], dtype=int32)
    """
    x = as_tensor(x)
    dtype = dt.as_dtype(dtype)
    return x if x.dtype is dtype else node(_ASTYPE, [x], dtype=dtype)


def _where_infer(c, a, b):
    return broadcast_shapes("where", c.shape, a.shape, b.shape), dt.promote(a.dtype, b.dtype)


def _where_emit(p, regs, in_dtypes, out):
    c = regs[0] if p.kinds[regs[0]] == I else p.as_truth(regs[0])
    a, b = _to_domain(p, regs[1:], out)
    return p.op(lib.EX_OP_F_WHERE if out.is_float else lib.EX_OP_I_WHERE, p.kinds[a], a, b, c)


_WHERE = defop("where", "elementwise", _where_infer, lambda c, a, b: np.where(c, a, b), emit=_where_emit)


def where(condition, x1, x2):
    """Elements of `x1` where `condition` is true (nonzero), else of `x2`, with broadcasting.

    >>> import express as ex
    >>> x = ex.asarray([-1.0, 2.0, -3.0])
    >>> ex.where(x > 0, x, 0.0).numpy()
    array([0., 2., 0.], dtype=float32)
    """
    like = next((t for t in (x1, x2) if isinstance(t, Tensor)), None)
    c = as_tensor(condition)
    a, b = as_tensor(x1, like), as_tensor(x2, like)
    return node(_WHERE, [c, a, b])


_CLAMP = defop("clamp", "elementwise", lambda a, lo, hi: (a.shape, a.dtype),
               lambda a, lo, hi: np.minimum(np.maximum(a, lo), hi),
               emit=lambda p, regs, ins, out, lo, hi: p.op(lib.EX_OP_F_CLAMP, F, p.as_float(regs[0]), imm0=lo, imm1=hi))


def clip(x, min=None, max=None):
    """`minimum(maximum(x, min), max)`; `min`/`max` may be scalars, tensors or None."""
    x = as_tensor(x)
    if x.dtype.is_float and isinstance(min, (int, float)) and isinstance(max, (int, float)):
        return node(_CLAMP, [x], lo=float(min), hi=float(max))
    if min is not None:
        x = maximum(x, min)
    if max is not None:
        x = minimum(x, max)
    return x
