"""The C kernel library (express._cext) driven directly through cffi, checked against NumPy.

Every test runs on each kernel variant the CPU offers (portable, AVX2) with 1 and 2 threads.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from express._cext import ffi, lib

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(t) for t in (np.float32, np.float16, BF16, np.int8, np.uint8, np.int32, np.int64, np.bool_)]
CODE = {dt: i for i, dt in enumerate(DTYPES)}  # matches enum ex_dtype
FLOATS = DTYPES[:3]
F, I = lib.EX_REG_F, lib.EX_REG_I
ISAS = [lib.EX_ISA_GENERIC] + ([lib.EX_ISA_AVX2] if lib.ex_cpu_has_avx2() else [])
rng = np.random.default_rng(0)


@pytest.fixture(autouse=True, params=[(i, t) for i in ISAS for t in (1, 2)],
                ids=lambda p: f"{['generic', 'avx2'][p[0]]}-{p[1]}t")
def variant(request):
    isa, threads = request.param
    before = lib.ex_isa(), lib.ex_get_num_threads()
    assert lib.ex_set_isa(isa) == 0
    lib.ex_set_num_threads(threads)
    yield
    lib.ex_set_isa(before[0])
    lib.ex_set_num_threads(before[1])


def ptr(a):
    return ffi.cast("void *", a.ctypes.data)


def estrides(a, shape=None):
    v = a if shape is None else np.broadcast_to(a, shape)
    return [s // a.itemsize for s in v.strides]


# ---------------------------------------------------------------- elementwise programs
DUMMY = np.zeros(16, np.float32)


def run(shape, ins, outs, code, kinds, ndim=None, raw_shape=None):
    """ins/outs: (array, reg) pairs, inputs broadcast to shape; code: (op, dst, a, b, c, imm0, imm1)
    tuples, missing trailing fields default to -1 / 0.  Returns the status code."""
    p = ffi.new("ex_program *")
    p.ndim = len(shape) if ndim is None else ndim
    for d, s in enumerate(shape if raw_shape is None else raw_shape):
        p.shape[d] = s
    keep = [p]

    def operands(pairs):
        arr = ffi.new("ex_operand[]", max(1, len(pairs)))
        keep.append(arr)
        for k, (a, reg) in enumerate(pairs):
            if isinstance(a, int):  # a raw (invalid) dtype code over dummy data
                arr[k].data, arr[k].dtype = ptr(DUMMY), a
            else:
                arr[k].data, arr[k].dtype = ptr(a), CODE[a.dtype]
                for d, s in enumerate(estrides(a, shape)):
                    arr[k].strides[d] = s
            arr[k].reg = reg
        return arr

    p.n_in = len(ins)
    setattr(p, "in", operands(ins))  # `in` is a Python keyword
    p.n_out, p.out = len(outs), operands(outs)
    instrs = ffi.new("ex_instr[]", max(1, len(code)))
    for k, ins_ in enumerate(code):
        f = list(ins_) + [-1] * (5 - len(ins_))
        imm = list(ins_[5:]) + [0.0] * (2 - len(ins_[5:]))
        instrs[k].op, instrs[k].dst, instrs[k].a, instrs[k].b, instrs[k].c = f[:5]
        instrs[k].imm0, instrs[k].imm1 = imm
    kinds_ = ffi.new("int32_t[]", max(1, len(kinds)))
    kinds_[0:len(kinds)] = kinds
    p.n_instr, p.code, p.n_reg, p.reg_kind = len(code), instrs, len(kinds), kinds_
    keep += [instrs, kinds_]
    return lib.ex_elementwise(p)


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.5, 2.5, -2.5, 1e-40, 3e38, -7.0],
                   np.float32)


def fdata(n, lo=-4.0, hi=4.0):
    x = rng.uniform(lo, hi, n).astype(np.float32)
    x[: min(n, len(SPECIAL))] = SPECIAL[: min(n, len(SPECIAL))]
    return x


def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


def sig(x):
    return 1 / (1 + np.exp(-x))


# op name -> (arity, reference on float32 arrays, exact?)
FOPS = {
    "F_ADD": (2, lambda x, y: x + y, 1), "F_SUB": (2, lambda x, y: x - y, 1),
    "F_MUL": (2, lambda x, y: x * y, 1), "F_DIV": (2, lambda x, y: x / y, 1),
    "F_POW": (2, np.power, 0), "F_MAX": (2, np.maximum, 1), "F_MIN": (2, np.minimum, 1),
    "F_ABS": (1, np.abs, 1), "F_NEG": (1, np.negative, 1), "F_EXP": (1, np.exp, 0),
    "F_LOG": (1, np.log, 0), "F_SQRT": (1, np.sqrt, 1), "F_SIN": (1, np.sin, 0),
    "F_COS": (1, np.cos, 0), "F_TANH": (1, np.tanh, 0), "F_FLOOR": (1, np.floor, 1),
    "F_CEIL": (1, np.ceil, 1), "F_ROUND": (1, np.round, 1), "F_SIGMOID": (1, sig, 0),
    "F_RELU": (1, lambda x: np.where(x < 0, np.float32(0), x), 1),
    "F_GELU": (1, lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))), 0),
    "F_GELU_TANH": (1, lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype(np.float64) ** 3))), 0),
    "F_SILU": (1, lambda x: x * sig(x), 0), "F_ERF": (1, erf, 0),
    "F_RSQRT": (1, lambda x: np.float32(1) / np.sqrt(x), 1), "F_RECIP": (1, lambda x: np.float32(1) / x, 1),
    "F_SQUARE": (1, np.square, 1),
}
CMPS = {"F_EQ": np.equal, "F_NE": np.not_equal, "F_LT": np.less, "F_LE": np.less_equal,
        "F_GT": np.greater, "F_GE": np.greater_equal}


def op(name):
    return getattr(lib, "EX_OP_" + name)


@pytest.mark.parametrize("name", list(FOPS))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float_ops(name):
    arity, ref, exact = FOPS[name]
    n = 1000
    x, y = fdata(n), fdata(n)[::-1].copy()
    if name == "F_POW":
        x = np.abs(x)
        y = np.clip(y, -3, 3)
    out = np.empty(n, np.float32)
    code = [(op(name), 2, 0, 1 if arity == 2 else -1)]
    assert run([n], [(x, 0), (y, 1)], [(out, 2)], code, [F, F, F]) == 0
    with np.errstate(all="ignore"):
        want = (ref(x, y) if arity == 2 else ref(x)).astype(np.float32)
    if exact:
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_allclose(out, want, rtol=3e-6, atol=1e-6, equal_nan=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_imm_ops_and_where():
    n = 777
    x, y = fdata(n), fdata(n)
    c = (rng.integers(0, 3, n)).astype(np.int32)
    o1, o2, o3 = (np.empty(n, np.float32) for _ in range(3))
    code = [(op("F_AXPB"), 3, 0, -1, -1, 1.5, -0.25), (op("F_CLAMP"), 4, 0, -1, -1, -1.0, 2.0),
            (op("F_WHERE"), 5, 0, 1, 2)]
    assert run([n], [(x, 0), (y, 1), (c, 2)], [(o1, 3), (o2, 4), (o3, 5)], code, [F, F, I, F, F, F]) == 0
    np.testing.assert_array_equal(o1, x * np.float32(1.5) + np.float32(-0.25))
    np.testing.assert_array_equal(o2, np.minimum(np.maximum(x, np.float32(-1)), np.float32(2)))
    np.testing.assert_array_equal(o3, np.where(c != 0, x, y))


@pytest.mark.parametrize("name", list(CMPS) + ["F_NONZERO", "F_TO_I"])
def test_compare_and_convert(name):
    n = 300
    x, y = fdata(n), fdata(n)
    y[::3] = x[::3]
    out = np.empty(n, np.int64)
    code = [(op(name), 2, 0, -1 if name in ("F_NONZERO", "F_TO_I") else 1)]
    assert run([n], [(x, 0), (y, 1)], [(out, 2)], code, [F, F, I]) == 0
    if name in CMPS:
        want = CMPS[name](x, y)
    elif name == "F_NONZERO":
        want = x != 0
    else:
        with np.errstate(invalid="ignore"):
            want = np.where(np.isfinite(x) & (np.abs(x) < 2.0**63), np.trunc(x), 0).astype(np.int64)
        want[~(np.isfinite(x) & (np.abs(x) < 2.0**63))] = np.iinfo(np.int64).min
    np.testing.assert_array_equal(out, want.astype(np.int64))


IMIN, IMAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def ipow_ref(a, b):
    out = []
    for x, e in zip(a.tolist(), b.tolist()):
        out.append(0 if e < 0 else ((x ** e + 2**63) % 2**64) - 2**63)
    return np.array(out, np.int64)


IOPS = {
    "I_ADD": lambda x, y: x + y, "I_SUB": lambda x, y: x - y, "I_MUL": lambda x, y: x * y,
    "I_MAX": np.maximum, "I_MIN": np.minimum, "I_ABS": lambda x: np.abs(x), "I_NEG": np.negative,
    "I_POW": ipow_ref, "I_EQ": np.equal, "I_NE": np.not_equal, "I_LT": np.less,
    "I_LE": np.less_equal, "I_GT": np.greater, "I_GE": np.greater_equal,
    "I_AND": lambda x, y: (x != 0) & (y != 0), "I_OR": lambda x, y: (x != 0) | (y != 0),
    "I_NOT": lambda x: x == 0,
}


@pytest.mark.parametrize("name", list(IOPS))
def test_int_ops(name):
    n = 500
    x = rng.integers(-1000, 1000, n)
    y = rng.integers(-1000, 1000, n)
    x[:6] = [IMIN, IMAX, 0, -1, 1, 0]
    y[:6] = [IMAX, 2, 0, 0, -5, 7]
    y[::7] = x[::7]
    if name == "I_POW":
        y = rng.integers(-2, 6, n)
    ref = IOPS[name]
    unary = ref.__code__.co_argcount == 1 if hasattr(ref, "__code__") else name in ("I_NEG",)
    out = np.empty(n, np.int64)
    code = [(op(name), 2, 0, -1 if unary else 1)]
    assert run([n], [(x, 0), (y, 1)], [(out, 2)], code, [I, I, I]) == 0
    with np.errstate(all="ignore"):
        want = ref(x) if unary else ref(x, y)
    np.testing.assert_array_equal(out, np.asarray(want).astype(np.int64))


def test_int_where_wrap_and_i_to_f():
    n = 600
    x = rng.integers(-(2**40), 2**40, n)
    c = rng.integers(0, 2, n).astype(np.bool_)
    outs = [np.empty(n, np.int64) for _ in range(5)] + [np.empty(n, np.float32)]
    code = [(op("I_WHERE"), 1, 0, 2, 3)] + [
        (op("I_WRAP"), 4 + k, 0, -1, -1, float(lib.EX_I8 + k if k < 3 else lib.EX_BOOL)) for k in range(4)
    ] + [(op("I_TO_F"), 8, 0)]
    kinds = [I, I, I, I, I, I, I, I, F]
    x2 = rng.integers(-5, 5, n)
    ins = [(x, 0), (x2, 2), (c, 3)]
    assert run([n], ins, list(zip(outs, [1, 4, 5, 6, 7, 8])), code, kinds) == 0
    np.testing.assert_array_equal(outs[0], np.where(c, x, x2))
    for k, t in enumerate([np.int8, np.uint8, np.int32]):
        np.testing.assert_array_equal(outs[1 + k], x.astype(t).astype(np.int64))
    np.testing.assert_array_equal(outs[4], (x != 0).astype(np.int64))
    np.testing.assert_array_equal(outs[5], x.astype(np.float32))


def sample(dt, n):
    if dt.kind == "f" or dt == BF16:
        v = rng.uniform(-200, 200, n)
        k = min(n, 6)
        v[:k] = [0.0, -0.0, 0.5, -1.5, 127.9, -128.0][:k]
        return v.astype(dt)
    if dt == np.bool_:
        return rng.integers(0, 2, n).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


@pytest.mark.parametrize("kind", [F, I])
@pytest.mark.parametrize("src", DTYPES, ids=str)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_load_store_conversions(src, kind):
    n = 257
    x = sample(src, n)
    outs = [np.empty(n, dt) for dt in DTYPES]
    assert run([n], [(x, 0)], [(o, 0) for o in outs], [], [kind]) == 0
    if kind == F:
        reg = x.astype(np.float32)
    else:
        reg = np.trunc(x.astype(np.float64)).astype(np.int64) if src in FLOATS else x.astype(np.int64)
    for o, dt in zip(outs, DTYPES):
        if dt == np.bool_:
            want = reg != 0
        elif dt in FLOATS:
            want = reg.astype(np.float32).astype(dt)
        else:
            want = (np.trunc(reg).astype(np.int64) if kind == F else reg).astype(dt)
        np.testing.assert_array_equal(o.view(np.uint8), want.view(np.uint8), err_msg=f"{src}->{dt}")


@pytest.mark.parametrize("half", [np.float16, BF16], ids=["f16", "bf16"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_half_conversions_exhaustive(half):
    bits = np.arange(65536, dtype=np.uint16)
    h = bits.view(half)
    f = np.empty(65536, np.float32)
    assert run([65536], [(h, 0)], [(f, 0)], [], [F]) == 0
    np.testing.assert_array_equal(f, h.astype(np.float32))
    # f32 -> half: random bit patterns, ties, subnormals, overflow
    x = rng.integers(0, 2**32, 200003, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    ties = (bits.astype(np.uint32) << (13 if half == np.float16 else 16)) | (1 << (12 if half == np.float16 else 15))
    ties = (ties + (np.uint32(112 << 23) if half == np.float16 else 0)).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, ties, np.float32([65504, 65519.99, 65520, 1e-8, 6e-8, 3e-8, 2.98e-8, -0.0])])
    y = np.empty(len(x), half)
    assert run([len(x)], [(x, 0)], [(y, 0)], [], [F]) == 0
    want = x.astype(half)
    nan = np.isnan(x)
    np.testing.assert_array_equal(y.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(y[nan].astype(np.float32)).all()


def random_view(shape, dtype=np.float32):
    """A non-contiguous view of `shape` with a permutation, steps and negative steps."""
    nd = len(shape)
    perm = rng.permutation(nd)
    big_shape = [0] * nd
    for d in range(nd):
        big_shape[perm[d]] = shape[d] * 2
    base = sample(np.dtype(dtype), int(np.prod(big_shape))).reshape(big_shape)
    v = base.transpose(perm) if nd else base
    sl = tuple(slice(None, None, -2) if rng.integers(2) else slice(0, None, 2) for _ in range(nd))
    v = v[sl] if nd else v
    assert v.shape == tuple(shape)
    return v


@pytest.mark.parametrize("nd", range(9))
def test_broadcast_strides_ndim(nd):
    shape = list(rng.integers(1, 4, nd) + (nd < 4) * 3)
    a = random_view(shape)
    bshape = [s if rng.integers(2) else 1 for s in shape]
    b = random_view(bshape, np.float16)
    c = np.asarray(rng.standard_normal(bshape), np.float32)
    big = np.zeros([s * 2 for s in shape], np.float32)
    out = big[tuple(slice(None, None, 2) for _ in shape)] if nd else big
    code = [(op("F_MUL"), 3, 0, 1), (op("F_ADD"), 3, 3, 2)]
    assert run(shape, [(a, 0), (b, 1), (c, 2)], [(out, 3)], code, [F, F, F, F]) == 0
    want = a * b.astype(np.float32) + c
    np.testing.assert_array_equal(out, want)
    if nd:  # the gaps between the strided output's elements stay untouched
        assert not big[tuple(slice(1, None, 2) for _ in shape)].any()


@pytest.mark.parametrize("n", [0, 1, 7, 17, 65, 1000, 100003])
def test_sizes(n):
    x = sample(np.dtype(np.float16), n)
    y = rng.standard_normal(n).astype(np.float32)
    out = np.empty(n, np.float32)
    out16 = np.empty(n, BF16)
    assert run([n], [(x, 0), (y, 1)], [(out, 2), (out16, 2)], [(op("F_SUB"), 2, 0, 1)], [F, F, F]) == 0
    np.testing.assert_array_equal(out, x.astype(np.float32) - y)
    np.testing.assert_array_equal(out16, (x.astype(np.float32) - y).astype(BF16))
    # short rows packed into tiles: [n, 3] + [3] (rows never coalesce)
    m = np.float32(rng.standard_normal((n, 3)))
    v = np.float32([1, 2, 3])
    o2 = np.empty((n, 3), np.int32)
    code = [(op("F_MUL"), 2, 0, 1), (op("F_TO_I"), 3, 2)]
    assert run([n, 3], [(m, 0), (v, 1)], [(o2, 3)], code, [F, F, F, I]) == 0
    np.testing.assert_array_equal(o2, np.trunc(m * v).astype(np.int32))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_fused_reuse_and_aliasing():
    n = 5000
    x = fdata(n, -2, 2)
    x0 = x.copy()
    e = np.empty(n, np.float16)
    # r1 = exp(x); r0 = r1 * x (reuses r0); out0 -> x in place, out1 = r1 as f16
    code = [(op("F_EXP"), 1, 0), (op("F_MUL"), 0, 1, 0)]
    assert run([n], [(x, 0)], [(x, 0), (e, 1)], code, [F, F]) == 0
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(x, np.exp(x0) * x0, rtol=3e-6, equal_nan=True)
        np.testing.assert_allclose(e.astype(np.float32), np.exp(x0), rtol=1e-3, equal_nan=True)
    # output aliases its input, and a later instruction still reads that input
    x = x0.copy()
    y = np.empty(n, np.float32)
    code = [(op("F_AXPB"), 1, 0, -1, -1, 1.0, 1.0), (op("F_ADD"), 2, 0, 0)]
    assert run([n], [(x, 0)], [(x, 1), (y, 2)], code, [F, F, F]) == 0
    np.testing.assert_array_equal(x, x0 + np.float32(1))
    np.testing.assert_array_equal(y, x0 + x0)


def test_scalar_program():
    x = np.float32([3.0])
    out = np.zeros((), np.int8)
    assert run([], [(x.reshape(()), 0)], [(out, 1)], [(op("F_TO_I"), 1, 0)], [F, I]) == 0
    assert out == 3


def test_invalid_programs():
    x = np.ones(8, np.float32)
    out = np.empty(8, np.float32)
    good = [(op("F_ADD"), 1, 0, 0)]
    assert run([8], [(x, 0)], [(out, 1)], good, [F, F]) == 0
    assert run([8], [(x, 0)], [(out, 1)], [(lib.EX_OP_COUNT, 1, 0, 0)], [F, F]) == lib.EX_EOPCODE
    assert run([8], [(x, 0)], [(out, 1)], [(-1, 1, 0, 0)], [F, F]) == lib.EX_EOPCODE
    assert run([8], [(x, 0)], [(out, 1)], [(op("F_ADD"), 2, 0, 0)], [F, F]) == lib.EX_EINVAL
    assert run([8], [(x, 0)], [(out, 1)], [(op("F_ADD"), 1, 0, -1)], [F, F]) == lib.EX_EINVAL
    assert run([8], [(x, 0)], [(out, 1)], [(op("F_ADD"), 1, 0, 0)], [F, I]) == lib.EX_EINVAL
    assert run([8], [(x, 0)], [(out, 1)], [(op("I_ADD"), 1, 0, 0)], [I, F]) == lib.EX_EINVAL
    assert run([8], [(x, 0)], [(out, 1)], [(op("I_WRAP"), 1, 0, -1, -1, 0.0)], [I, I]) == lib.EX_EDTYPE
    assert run([8], [(x, 0)], [(out, 1)], good, [F, 7]) == lib.EX_EINVAL
    assert run([8], [(x, 0)], [(out, 5)], good, [F, F]) == lib.EX_EINVAL
    assert run([8], [(8, 0)], [(out, 1)], good, [F, F]) == lib.EX_EDTYPE  # dtype code 8
    x0, out0 = np.ones((), np.float32), np.empty((), np.float32)
    assert run([], [(x0, 0)], [(out0, 1)], good, [F, F], ndim=9) == lib.EX_EINVAL
    assert run([], [(x0, 0)], [(out0, 1)], good, [F, F], ndim=1, raw_shape=[-1]) == lib.EX_EINVAL
    assert lib.ex_elementwise(ffi.NULL) == lib.EX_EINVAL
    p = ffi.new("ex_program *", {"ndim": 1, "shape": [4], "n_in": 1, "n_out": 0})
    assert lib.ex_elementwise(p) == lib.EX_EINVAL  # n_in > 0 with a NULL operand array


# ---------------------------------------------------------------- reductions
RED = ["SUM", "PROD", "MEAN", "MAX", "MIN", "ARGMAX", "ARGMIN"]
SHAPES = [(1, 1, 1), (3, 7, 1), (2, 1000, 1), (2, 5, 3), (3, 65, 130), (1, 2049, 1), (2, 3, 300)]


def red_out_dtype(name, dt):
    if name in ("MAX", "MIN"):
        return dt
    if name.startswith("ARG"):
        return np.dtype(np.int64)
    if dt in FLOATS:
        return dt
    return np.dtype(np.float32 if name == "MEAN" else np.int64)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_reduce(dt, shape):
    outer, r, inner = shape
    for name in RED:
        if name == "PROD":
            x = (rng.uniform(0.995, 1.005, shape) if dt in FLOATS else rng.integers(-3, 4, shape)).astype(dt)
        elif dt in FLOATS:
            x = rng.uniform(-1, 1, shape).astype(dt)
        else:
            x = sample(dt, outer * r * inner).reshape(shape)
            if dt.itemsize > 1:
                x = (x % 50).astype(dt)  # ties for ARG*
        odt = red_out_dtype(name, dt)
        y = np.empty((outer, inner), odt)
        assert lib.ex_reduce(getattr(lib, "EX_RED_" + name), CODE[dt], ptr(x), CODE[odt], ptr(y), outer, r, inner) == 0
        wide = x.astype(np.float64 if dt in FLOATS else np.int64)
        with np.errstate(all="ignore"):
            want = {"SUM": lambda: wide.sum(1), "PROD": lambda: wide.prod(1), "MEAN": lambda: wide.mean(1),
                    "MAX": lambda: x.max(1), "MIN": lambda: x.min(1),
                    "ARGMAX": lambda: x.argmax(1), "ARGMIN": lambda: x.argmin(1)}[name]()
        if name in ("SUM", "PROD", "MEAN") and (dt in FLOATS or name == "MEAN"):
            tol = {np.dtype(np.float32): 1e-5}.get(odt, 1e-2)
            np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol * np.abs(wide).sum(1).max() / r, err_msg=name)
        else:
            np.testing.assert_array_equal(y, want.astype(odt), err_msg=name)


def test_reduce_nan_and_precision():
    x = rng.uniform(-1, 1, (4, 100, 3)).astype(np.float32)
    x[1, 17, 0] = x[1, 60, 0] = np.nan
    x[2, 5:, 2] = np.nan
    for name, f in [("MAX", np.max), ("MIN", np.min), ("ARGMAX", np.argmax), ("ARGMIN", np.argmin)]:
        odt = np.int64 if name.startswith("ARG") else np.float32
        y = np.empty((4, 3), odt)
        assert lib.ex_reduce(getattr(lib, "EX_RED_" + name), lib.EX_F32, ptr(x), CODE[np.dtype(odt)], ptr(y), 4, 100, 3) == 0
        np.testing.assert_array_equal(y, f(x, axis=1))
        xc = np.ascontiguousarray(x.transpose(0, 2, 1))  # the inner == 1 path
        y = np.empty((4, 3), odt)
        assert lib.ex_reduce(getattr(lib, "EX_RED_" + name), lib.EX_F32, ptr(xc), CODE[np.dtype(odt)], ptr(y), 12, 100, 1) == 0
        np.testing.assert_array_equal(y.ravel(), f(xc.reshape(12, 100), axis=1))
    for inner in (1, 3):
        x = rng.uniform(0, 1, (1, 10**6 // inner, inner)).astype(np.float32)
        y = np.empty(inner, np.float32)
        assert lib.ex_reduce(lib.EX_RED_SUM, lib.EX_F32, ptr(x), lib.EX_F32, ptr(y), 1, x.shape[1], inner) == 0
        np.testing.assert_allclose(y, x.astype(np.float64).sum(1)[0], rtol=2e-6)


def test_reduce_edge_cases():
    x = np.zeros(4, np.float32)
    y = np.full(2, 7, np.float32)
    assert lib.ex_reduce(lib.EX_RED_SUM, lib.EX_F32, ptr(x), lib.EX_F32, ptr(y), 2, 0, 1) == 0
    assert (y == 0).all()
    assert lib.ex_reduce(lib.EX_RED_PROD, lib.EX_F32, ptr(x), lib.EX_F32, ptr(y), 2, 0, 1) == 0
    assert (y == 1).all()
    assert lib.ex_reduce(lib.EX_RED_MAX, lib.EX_F32, ptr(x), lib.EX_F32, ptr(y), 2, 0, 1) == lib.EX_EINVAL
    assert lib.ex_reduce(lib.EX_RED_SUM, lib.EX_F32, ptr(x), lib.EX_I64, ptr(y), 2, 2, 1) == lib.EX_EDTYPE
    assert lib.ex_reduce(lib.EX_RED_SUM, lib.EX_I32, ptr(x), lib.EX_I32, ptr(y), 2, 2, 1) == lib.EX_EDTYPE
    assert lib.ex_reduce(lib.EX_RED_MAX, lib.EX_F32, ptr(x), lib.EX_F16, ptr(y), 2, 2, 1) == lib.EX_EDTYPE
    assert lib.ex_reduce(lib.EX_RED_ARGMAX, lib.EX_F32, ptr(x), lib.EX_I32, ptr(y), 2, 2, 1) == lib.EX_EDTYPE
    assert lib.ex_reduce(99, lib.EX_F32, ptr(x), lib.EX_F32, ptr(y), 2, 2, 1) == lib.EX_EOPCODE
    assert lib.ex_reduce(lib.EX_RED_SUM, 9, ptr(x), lib.EX_F32, ptr(y), 2, 2, 1) == lib.EX_EDTYPE
    assert lib.ex_reduce(lib.EX_RED_SUM, lib.EX_F32, ptr(x), lib.EX_F32, ptr(y), -1, 2, 1) == lib.EX_EINVAL
    assert lib.ex_reduce(lib.EX_RED_SUM, lib.EX_F32, ffi.NULL, lib.EX_F32, ptr(y), 2, 2, 1) == lib.EX_EINVAL


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 1000, 1), (2, 7, 5), (2, 65, 200), (1, 3000, 1)], ids=str)
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_cumsum(dt, shape):
    x = (rng.uniform(0, 1, shape) if dt in FLOATS else sample(dt, int(np.prod(shape))).reshape(shape)).astype(dt)
    odt = dt if dt in FLOATS else np.dtype(np.int64)
    y = np.empty(shape, odt)
    assert lib.ex_cumsum(CODE[dt], ptr(x), CODE[odt], ptr(y), *shape) == 0
    if dt in FLOATS:
        want = x.astype(np.float64).cumsum(1)
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-4 if dt == np.float32 else 1e-2)
    else:
        np.testing.assert_array_equal(y, x.astype(np.int64).cumsum(1))
    assert lib.ex_cumsum(lib.EX_F32, ptr(x), lib.EX_I64, ptr(y), *shape) == lib.EX_EDTYPE


# ---------------------------------------------------------------- copy
@pytest.mark.parametrize("es", [1, 2, 3, 4, 8])
def test_copy(es):
    for nd in range(6):
        shape = list(rng.integers(1, 6, nd))
        base = rng.integers(0, 256, [s * 2 for s in shape] + [es], dtype=np.uint8)
        v = base[tuple(slice(None, None, -2) if rng.integers(2) else slice(1, None, 2) for _ in shape)]
        v = v.transpose(list(rng.permutation(nd)) + [nd])
        out = np.empty(v.shape, np.uint8)
        st = ffi.new("int64_t[]", [s // es for s in v.strides[:-1]] or [0])
        sh = ffi.new("int64_t[]", list(v.shape[:-1]) or [0])
        assert lib.ex_copy(es, ptr(v), st, ptr(out), nd, sh) == 0
        np.testing.assert_array_equal(out, v)


@pytest.mark.parametrize("es,dt", [(1, np.uint8), (2, np.float16), (4, np.float32), (8, np.int64)])
def test_copy_transpose(es, dt):
    for shape, axes in [((1000, 777), (1, 0)), ((3, 65, 130), (0, 2, 1)), ((40, 50, 60), (2, 0, 1))]:
        x = sample(np.dtype(dt), int(np.prod(shape))).reshape(shape)
        v = x.transpose(axes)[..., ::-1]
        out = np.empty(v.shape, dt)
        assert lib.ex_copy(es, ptr(v), estrides(v), ptr(out), v.ndim, list(v.shape)) == 0
        np.testing.assert_array_equal(out, v)


def test_copy_invalid():
    x = np.zeros(4, np.float32)
    assert lib.ex_copy(0, ptr(x), [1], ptr(x), 1, [4]) == lib.EX_EINVAL
    assert lib.ex_copy(4, ptr(x), [1], ptr(x), 9, [4] * 9) == lib.EX_EINVAL
    assert lib.ex_copy(4, ffi.NULL, [1], ptr(x), 1, [4]) == lib.EX_EINVAL
    assert lib.ex_copy(4, ffi.NULL, [1], ffi.NULL, 1, [0]) == 0


# ---------------------------------------------------------------- matmul
def matmul(a, b, c, batch=(), abs_=(), bbs=()):
    m, k = a.shape[-2:]
    n = b.shape[-1]
    sa, sb = estrides(a)[-2:], estrides(b)[-2:]
    dt = lib.EX_F32 if c.dtype == np.float32 else lib.EX_I64
    return lib.ex_matmul(dt, ptr(a), sa[0], sa[1], ptr(b), sb[0], sb[1], ptr(c), m, n, k,
                         len(batch), list(batch) or ffi.NULL, list(abs_) or ffi.NULL, list(bbs) or ffi.NULL)


def layouts(x):
    yield x
    yield np.ascontiguousarray(x.T).T     # column-major
    yield x[::-1][::-1].copy()[::-1][::-1]  # contiguous again, via copies
    yield np.flip(np.flip(x, 0).copy(), 0)  # negative row stride


def check_mm(got, a, b):
    want = a.astype(np.float64) @ b.astype(np.float64)
    k = a.shape[-1]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1, k) ** 0.5 * 4)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 17, 33), (33, 1, 17), (5, 7, 1), (6, 16, 256),
                                   (7, 17, 257), (65, 33, 129), (257, 129, 65), (100, 200, 300), (2, 3, 0)])
def test_matmul_f32(m, n, k):
    a0 = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b0 = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    for i, (a, b) in enumerate(zip(layouts(a0), list(layouts(b0))[::-1])):
        c = np.full((m, n), np.nan, np.float32)
        assert matmul(a, b, c) == 0
        check_mm(c, a0, b0)


def test_matmul_broadcast_strides_and_large():
    a = np.broadcast_to(rng.uniform(-1, 1, (1, 40)).astype(np.float32), (30, 40))  # zero row stride
    b = rng.uniform(-1, 1, (40, 50)).astype(np.float32)
    c = np.empty((30, 50), np.float32)
    assert matmul(a, b, c) == 0
    check_mm(c, a, b)
    a = rng.uniform(-1, 1, (513, 300)).astype(np.float32)
    b = rng.uniform(-1, 1, (300, 520)).astype(np.float32).T.copy().T
    c = np.empty((513, 520), np.float32)
    assert matmul(a, b, c) == 0
    check_mm(c, a, b)


def test_matmul_batched():
    a = rng.uniform(-1, 1, (1, 3, 9, 11)).astype(np.float32)
    b = rng.uniform(-1, 1, (2, 1, 13, 11)).astype(np.float32).transpose(0, 1, 3, 2)
    c = np.empty((2, 3, 9, 13), np.float32)
    abs_ = [0, estrides(a)[1]]
    bbs = [estrides(b)[0], 0]
    assert matmul(a[0, 0], b[0, 0], c, (2, 3), abs_, bbs) == 0
    check_mm(c, np.broadcast_to(a, (2, 3, 9, 11)), np.broadcast_to(b, (2, 3, 11, 13)))
    big_a = rng.uniform(-1, 1, (3, 70, 80)).astype(np.float32)
    big_b = rng.uniform(-1, 1, (3, 80, 90)).astype(np.float32)
    c = np.empty((3, 70, 90), np.float32)
    assert matmul(big_a[0], big_b[0], c, (3,), [70 * 80], [80 * 90]) == 0
    check_mm(c, big_a, big_b)


def test_matmul_i64_and_errors():
    a = rng.integers(-(2**40), 2**40, (7, 9))
    b = rng.integers(-(2**40), 2**40, (9, 5)).T.copy().T
    c = np.empty((7, 5), np.int64)
    assert matmul(a, b, c) == 0
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(c, a @ b)
    x = np.zeros(4, np.float32)
    args = (ptr(x), 1, 1, ptr(x), 1, 1, ptr(x), 1, 1, 1, 0, ffi.NULL, ffi.NULL, ffi.NULL)
    assert lib.ex_matmul(lib.EX_F16, *args) == lib.EX_EDTYPE
    assert lib.ex_matmul(lib.EX_F32, *args[:7], -1, *args[8:]) == lib.EX_EINVAL
    assert lib.ex_matmul(lib.EX_F32, *args[:10], 7, [1] * 7, [0] * 7, [0] * 7) == lib.EX_EINVAL
    assert lib.ex_matmul(lib.EX_F32, *args[:10], 1, ffi.NULL, ffi.NULL, ffi.NULL) == lib.EX_EINVAL
    assert lib.ex_matmul(lib.EX_F32, ffi.NULL, *args[1:]) == lib.EX_EINVAL


# ---------------------------------------------------------------- softmax
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 7, 1), (2, 1000, 1), (2, 5, 3), (3, 65, 300), (1, 3000, 1)], ids=str)
@pytest.mark.parametrize("log", [0, 1])
def test_softmax(shape, log):
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    x.reshape(-1)[:: 7] = -np.inf
    x[..., 0, :] = 1e30 if shape[1] > 3 else x[..., 0, :]
    wide = x.astype(np.float64)
    e = np.exp(wide - wide.max(1, keepdims=True))
    with np.errstate(invalid="ignore"):
        lse = wide.max(1, keepdims=True) + np.log(e.sum(1, keepdims=True))
        want = wide - lse if log else e / e.sum(1, keepdims=True)
    y = np.empty(shape, np.float32)
    assert lib.ex_softmax(ffi.cast("float *", ptr(x)), ffi.cast("float *", ptr(y)), *shape, log) == 0
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6)
    xi = x.copy()  # in place
    assert lib.ex_softmax(ffi.cast("float *", ptr(xi)), ffi.cast("float *", ptr(xi)), *shape, log) == 0
    np.testing.assert_array_equal(xi, y)
    assert lib.ex_softmax(ffi.NULL, ffi.NULL, -1, 1, 1, 0) == lib.EX_EINVAL


# ---------------------------------------------------------------- runtime
def test_runtime():
    before = lib.ex_mem_current()
    p = lib.ex_alloc(1000)
    q = lib.ex_alloc(24)
    assert int(ffi.cast("uintptr_t", p)) % 64 == 0 and int(ffi.cast("uintptr_t", q)) % 64 == 0
    assert lib.ex_mem_current() == before + 1024
    assert lib.ex_mem_peak() >= before + 1024
    lib.ex_free(p)
    lib.ex_free(q)
    lib.ex_free(ffi.NULL)
    assert lib.ex_mem_current() == before
    for alloc, n in [(a, n) for a in (lib.ex_alloc, lib.ex_alloc_huge) for n in ((1 << 20) - 64, 3 << 20, (4 << 20) - 64)]:
        p = alloc(n)  # large blocks, on the heap or mapped: each byte usable, counted, freed
        a = np.frombuffer(ffi.buffer(p, n), np.uint8)
        assert int(ffi.cast("uintptr_t", p)) % 64 == 0
        if alloc == lib.ex_alloc_huge:  # after the 64-byte header, on a 2 MB boundary
            assert int(ffi.cast("uintptr_t", p)) % (2 << 20) == 64
        a[:] = 7
        assert lib.ex_mem_current() == before + n and a.sum() == 7 * n
        del a
        lib.ex_free(p)
        assert lib.ex_mem_current() == before
    lib.ex_mem_reset_peak()
    assert lib.ex_mem_peak() == before
    assert lib.ex_set_isa(7) == lib.EX_EINVAL
    assert lib.ex_isa() in ISAS
    lib.ex_set_num_threads(3)
    assert lib.ex_get_num_threads() == 3
    lib.ex_set_num_threads(0)
    assert lib.ex_get_num_threads() == 1
