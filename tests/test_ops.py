"""Every op against its NumPy reference, over random shapes, broadcasting, dtypes and
non-contiguous inputs, on both kernel variants."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import express as ex
from express.ops.registry import REGISTRY

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
DTYPES = [ex.float32, ex.float16, ex.bfloat16, ex.int8, ex.uint8, ex.int32, ex.int64, ex.bool]
FLOATS = [ex.float32, ex.float16, ex.bfloat16]
INTS = [ex.int8, ex.uint8, ex.int32, ex.int64]
TOL = {ex.float32: 2e-5, ex.float16: 2e-3, ex.bfloat16: 1.6e-2}


def make(data, shape, dtype, lo=-10, hi=10, noncontig=None):
    """A NumPy array of `dtype` drawn by hypothesis, sometimes a non-contiguous view."""
    if noncontig is None:
        noncontig = data.draw(st.sampled_from(["c", "t", "s"]))
    if dtype.is_bool:
        base = data.draw(hnp.arrays(np.bool_, shape))
    elif dtype.is_int:
        info = np.iinfo(dtype.np)
        base = data.draw(hnp.arrays(dtype.np, shape, elements=st.integers(max(info.min, lo * 10), min(info.max, hi * 10))))
    else:
        base = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(lo, hi, width=32))).astype(dtype.np)
    if noncontig == "t" and base.ndim >= 2:  # a transposed view of a contiguous buffer
        return np.ascontiguousarray(np.swapaxes(base, -1, -2)).swapaxes(-1, -2)
    if noncontig == "s":  # a strided slice
        big = np.repeat(base[..., None], 2, axis=-1)
        return big[..., 0]
    return base


def up(a):
    """Reference inputs: float16/bfloat16 widen to float32 (Express computes them in float32)."""
    return a.astype(np.float32) if a.dtype in (np.float16, ml_dtypes.bfloat16) else a


def assert_matches(got, want, dtype):
    got = np.asarray(got)
    assert got.dtype == dtype.np, (got.dtype, dtype)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if dtype.is_float:
        tol = TOL[dtype]
        with np.errstate(all="ignore"):
            want = want.astype(dtype.np).astype(np.float64)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want.astype(dtype.np))


shapes2 = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=5)
shapes3 = hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=4)

ARITH = ["add", "subtract", "multiply", "divide", "maximum", "minimum"]
COMPARE = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]
LOGICAL = ["logical_and", "logical_or"]


@pytest.mark.parametrize("name", ARITH + COMPARE + LOGICAL + ["pow"])
@SETTINGS
@given(data=st.data(), shapes=shapes2, da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES))
def test_binary(isa, name, data, shapes, da, db):
    if name in ("add", "subtract", "multiply", "divide", "pow") and (da.is_bool and db.is_bool):
        with pytest.raises(ex.DTypeError, match=name):
            getattr(ex, name)(ex.asarray(np.zeros(shapes.input_shapes[0], bool)), ex.asarray(np.zeros(shapes.input_shapes[1], bool)))
        return
    lo, hi = (-3, 3) if name == "pow" else (-10, 10)
    a = make(data, shapes.input_shapes[0], da, lo, hi)
    b = make(data, shapes.input_shapes[1], db, 0 if name == "pow" and not (da.is_float or db.is_float) else lo, hi)
    if name == "pow":
        if da.is_float or db.is_float:
            a = np.abs(a) if not a.dtype == np.bool_ else a
        else:
            b = np.clip(b, 0, 4).astype(b.dtype)
    if name in ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal") and (da.is_float != db.is_float):
        pass  # ints in the test range are exact in float32, so mixed comparisons agree with NumPy's
    y = getattr(ex, name)(ex.asarray(a), ex.asarray(b))
    ra, rb = up(a), up(b)
    if y.dtype.is_int:  # integer ops compute in the result type (int8 with uint8 gives int32 here)
        ra, rb = ra.astype(y.dtype.np), rb.astype(y.dtype.np)
    with np.errstate(all="ignore"):
        want = REGISTRY[name].ref(ra, rb)
    assert_matches(y.numpy(), want, y.dtype)


UNARY = ["abs", "negative", "exp", "log", "sqrt", "sin", "cos", "tanh", "floor", "ceil", "round",
         "logical_not", "square", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "erf", "rsqrt", "reciprocal"]
POSITIVE = {"log", "sqrt", "rsqrt"}


def _unary_fn(name):
    import express.nn.functional as F
    return getattr(ex, name, None) or getattr(F, name)


@pytest.mark.parametrize("name", UNARY)
@SETTINGS
@given(data=st.data(), shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=6), d=st.sampled_from(DTYPES))
def test_unary(isa, name, data, shape, d):
    if name in ("abs", "negative", "square") and d.is_bool:
        with pytest.raises(ex.DTypeError):
            _unary_fn(name)(ex.asarray(np.zeros(shape, bool)))
        return
    lo = 0 if name in POSITIVE else -10
    a = make(data, shape, d, lo, 10)
    if name in POSITIVE and d.is_float:
        a = (np.abs(a.astype(np.float32)) + 0.01).astype(a.dtype)
    y = _unary_fn(name)(ex.asarray(a))
    ra = up(a).astype(np.float32) if y.dtype.is_float else up(a)  # ints compute as float32
    with np.errstate(all="ignore"):
        want = REGISTRY[name].ref(ra)
    assert_matches(y.numpy(), want, y.dtype)


def test_registry_covered():
    """Every elementwise op in the registry is exercised by a test above."""
    tested = set(ARITH + COMPARE + LOGICAL + UNARY + ["pow", "where", "astype", "copy", "clamp"])
    missing = {n for n, op in REGISTRY.items() if op.kind == "elementwise"} - tested
    assert not missing, missing


@SETTINGS
@given(data=st.data(), shapes=shapes3, dc=st.sampled_from(DTYPES), da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES))
def test_where(isa, data, shapes, dc, da, db):
    c, a, b = (make(data, s, d) for s, d in zip(shapes.input_shapes, (dc, da, db)))
    y = ex.where(ex.asarray(c), ex.asarray(a), ex.asarray(b))
    assert_matches(y.numpy(), np.where(c != 0, up(a), up(b)), y.dtype)


@SETTINGS
@given(data=st.data(), shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=6), src=st.sampled_from(DTYPES), dst=st.sampled_from(DTYPES))
def test_astype(isa, data, shape, src, dst):
    a = make(data, shape, src, -100, 100)
    if dst.is_int and not src.is_bool:  # keep float->int conversions in range (C leaves overflow undefined)
        info = np.iinfo(dst.np)
        a = np.clip(up(a), info.min, info.max).astype(a.dtype) if src.is_float else a
    y = ex.astype(ex.asarray(a), dst).numpy()
    want = up(a)
    if dst.is_int and src.is_float:
        want = np.trunc(want).astype(np.int64)
    assert_matches(y, want if not dst.is_bool else want != 0, dst) if not (dst.is_int and src.is_int) else \
        np.testing.assert_array_equal(y, a.astype(dst.np))


@pytest.mark.parametrize("src", ["float32", "float16", "int32"])
@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_astype_half_rounds_inside_a_fused_chain(isa, src, half):
    """A cast to half precision between float32 ops rounds, as NumPy's does (the fused program's
    registers are float32, so the cast must round explicitly)."""
    import ml_dtypes
    a = (np.random.default_rng(0).normal(size=257) * 3000).astype(src)
    hnp_ = np.float16 if half == "float16" else ml_dtypes.bfloat16
    got = (ex.asarray(a).astype(getattr(ex, half)).astype(ex.float32) * 2 + 1).numpy()
    want = a.astype(hnp_).astype(np.float32) * 2 + 1
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lo,hi", [(-1.0, 2.0), (None, 0.5), (ex.zeros(()), None)])
def test_clip(isa, lo, hi):
    a = np.linspace(-3, 3, 25, dtype=np.float32).reshape(5, 5)
    got = ex.clip(ex.asarray(a), lo, hi).numpy()
    want = np.clip(a, None if lo is None else np.asarray(lo), None if hi is None else np.asarray(hi))
    np.testing.assert_allclose(got, want)


def test_nan_semantics(isa):
    a = np.array([np.nan, 1.0, -np.inf, 0.0], np.float32)
    b = np.array([1.0, np.nan, np.inf, -0.0], np.float32)
    for name in ARITH + COMPARE:
        with np.errstate(all="ignore"):
            want = getattr(np, "true_divide" if name == "divide" else name)(a, b)
        got = getattr(ex, name)(a, b).numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)
    np.testing.assert_array_equal(ex.max(ex.asarray(a)).numpy(), np.max(a))
    assert ex.argmax(ex.asarray(a)).item() == np.argmax(a)


def test_operators_and_scalars(isa):
    a = np.arange(6, dtype=np.int8).reshape(2, 3)
    x = ex.asarray(a)
    assert (x + 1).dtype is ex.int8 and (x * 2.5).dtype is ex.float32 and (x > 2).dtype is ex.bool
    np.testing.assert_array_equal((2 * x - 1).numpy(), 2 * a - 1)
    np.testing.assert_allclose((1 / (x + 1)).numpy(), 1 / (a + 1.0), rtol=1e-6)
    np.testing.assert_array_equal((-x).numpy(), -a)
    np.testing.assert_array_equal(((x > 1) & (x < 4)).numpy(), (a > 1) & (a < 4))
    np.testing.assert_array_equal((~(x > 1)).numpy(), ~(a > 1))
    np.testing.assert_array_equal((a + x).numpy(), a + a)  # NumPy on the left defers to Tensor
    with pytest.raises(ex.DTypeError, match="does not fit"):
        x + 1000


# ---- reductions ----
RED = ["sum", "prod", "mean", "max", "min"]


@pytest.mark.parametrize("name", RED + ["argmax", "argmin"])
@SETTINGS
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=6), d=st.sampled_from(DTYPES), keep=st.booleans())
def test_reduce(isa, name, data, shape, d, keep):
    a = make(data, shape, d, -3, 3)
    if name.startswith("arg"):
        axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    else:
        axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1),
                                   st.lists(st.integers(0, len(shape) - 1), unique=True).map(tuple)))
    y = getattr(ex, name)(ex.asarray(a), axis=axis, keepdims=keep)
    want = getattr(np, name)(up(a) if not (name in ("sum", "prod") and a.dtype.kind in "iub") else a.astype(np.int64),
                             axis=axis, keepdims=keep)
    if name in ("max", "min") and d.is_bool:
        want = want.astype(bool)
    got = y.numpy()
    if d in (ex.float16, ex.bfloat16) and name in ("sum", "prod", "mean"):  # accumulated in float32, rounded once
        with np.errstate(over="ignore"):
            want = np.asarray(want).astype(d.np).astype(np.float64)  # rounded (or overflowed) as the result is
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=TOL[d], atol=TOL[d] * np.abs(up(a)).sum() / max(up(a).size, 1) * 4 + TOL[d])
        return
    assert_matches(got, want, y.dtype)


@SETTINGS
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=7), d=st.sampled_from(DTYPES))
def test_cumsum(isa, data, shape, d):
    a = make(data, shape, d, -3, 3)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    y = ex.cumsum(ex.asarray(a), axis=axis)
    want = np.cumsum(up(a) if d.is_float else a.astype(np.int64), axis=axis)
    assert_matches(y.numpy(), want, y.dtype)


def test_reduce_large_accuracy(isa, threads):
    a = np.random.default_rng(0).standard_normal(1_000_003).astype(np.float32)
    np.testing.assert_allclose(ex.sum(ex.asarray(a)).numpy(), a.astype(np.float64).sum(), rtol=1e-5, atol=1e-2)
    b = a[:1_000_000].reshape(1000, 1000)
    np.testing.assert_allclose(ex.sum(ex.asarray(b), axis=0).numpy(), b.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(ex.mean(ex.asarray(b), axis=1).numpy(), b.astype(np.float64).mean(1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("log", [False, True])
@SETTINGS
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=7))
def test_softmax(isa, log, data, shape):
    import express.nn.functional as F
    a = make(data, shape, ex.float32, -20, 20)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    got = (F.log_softmax if log else F.softmax)(ex.asarray(a), axis=axis).numpy()
    np.testing.assert_allclose(got, REGISTRY["softmax"].ref(a, axis % len(shape), log), rtol=1e-5, atol=1e-6)


# ---- shape ops ----
@SETTINGS
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=5), d=st.sampled_from(DTYPES))
def test_views(isa, data, shape, d):
    a = make(data, shape, d)
    x = ex.asarray(a)
    perm = data.draw(st.permutations(range(len(shape))))
    np.testing.assert_array_equal(ex.permute_dims(x, perm).numpy(), np.transpose(a, perm))
    np.testing.assert_array_equal(x.T.numpy(), a.T)
    np.testing.assert_array_equal(ex.transpose(x).reshape(-1).numpy(), a.T.reshape(-1))  # reshape of a view copies
    np.testing.assert_array_equal(ex.flip(x, axis=0).numpy(), np.flip(a, 0))
    np.testing.assert_array_equal(ex.flip(x).numpy(), np.flip(a))
    np.testing.assert_array_equal(ex.expand_dims(x, 1).numpy(), np.expand_dims(a, 1))
    np.testing.assert_array_equal(ex.squeeze(ex.expand_dims(x, 0), 0).numpy(), a)
    np.testing.assert_array_equal(ex.broadcast_to(x, (2,) + a.shape).numpy(), np.broadcast_to(a, (2,) + a.shape))
    np.testing.assert_array_equal(ex.maximum(ex.flip(x, axis=-1), x.T.T).numpy(), np.maximum(np.flip(a, -1), a))


KEYS = [(0,), (slice(None, None, -1),), (Ellipsis, 1), (None, slice(1, None)), (slice(None), None, slice(None, None, 2)),
        (-1, Ellipsis, slice(0, 1)), ([0, 2, 1],), (np.array([[1, 0]]),), (slice(None), [1, -1]),
        ([0, 1], [1, 0]), (np.array([True, False, True]),)]


@pytest.mark.parametrize("key", KEYS, ids=str)
def test_getitem(isa, key):
    a = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    got = ex.asarray(a)[key].numpy()
    np.testing.assert_array_equal(got, a[key])


def test_take_concat_stack_split(isa):
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    x = ex.asarray(a)
    for axis in (0, 1, 2, None):
        idx = np.array([[1, 0], [-1, 1]])
        np.testing.assert_array_equal(ex.take(x, idx, axis=axis).numpy(), np.take(a, idx, axis=axis))
    lazy_idx = ex.asarray(np.array([2, 0])) * 1
    np.testing.assert_array_equal(ex.take(x, lazy_idx, axis=1).numpy(), np.take(a, [2, 0], axis=1))
    b = np.ones((2, 1, 4), np.float16)
    np.testing.assert_array_equal(ex.concat([x, ex.asarray(b), x.T.T], axis=1).numpy(), np.concatenate([a, b, a], axis=1))
    np.testing.assert_array_equal(ex.stack([x, x + 1], axis=-1).numpy(), np.stack([a, a + 1], axis=-1))
    for got, want in zip(ex.split(x, 3, axis=1), np.split(a, 3, axis=1)):
        np.testing.assert_array_equal(got.numpy(), want)
    for got, want in zip(ex.split(x, [1, 3], axis=2), np.split(a, [1, 3], axis=2)):
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("k", [-1, 0, 2])
def test_tril_triu(isa, k):
    a = np.arange(2 * 4 * 5, dtype=np.float32).reshape(2, 4, 5)
    np.testing.assert_array_equal(ex.tril(ex.asarray(a), k).numpy(), np.tril(a, k))
    np.testing.assert_array_equal(ex.triu(ex.asarray(a), k).numpy(), np.triu(a, k))


# ---- matmul ----
@SETTINGS
@given(data=st.data(), m=st.sampled_from([1, 2, 7, 17, 33]), n=st.sampled_from([1, 3, 16, 65]), k=st.sampled_from([1, 5, 31, 64]),
       batch=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3), d=st.sampled_from(FLOATS + INTS))
def test_matmul(isa, threads, data, m, n, k, batch, d):
    a = make(data, batch.input_shapes[0] + (m, k), d, -2, 2)
    b = make(data, batch.input_shapes[1] + (k, n), d, -2, 2)
    y = ex.matmul(ex.asarray(a), ex.asarray(b))
    want = np.matmul(up(a).astype(np.float64), up(b).astype(np.float64)) if d.is_float else np.matmul(a, b)
    if d.is_float:
        np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=TOL[d], atol=TOL[d] * math.sqrt(k) * 2)
    else:
        assert_matches(y.numpy(), want, d)


def test_matmul_vectors(isa):
    a, b = np.arange(3, dtype=np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    for x, y in ((a, b), (b.T, a), (a, a), (np.ones((2, 4, 3), np.float32), a)):
        np.testing.assert_allclose(ex.matmul(x, y).numpy(), np.matmul(x, y))


# ---- creation ----
def test_creation():
    np.testing.assert_array_equal(ex.zeros((2, 3)).numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(ex.ones((2,), ex.int8).numpy(), np.ones(2, np.int8))
    np.testing.assert_array_equal(ex.full((2, 2), 7).numpy(), np.full((2, 2), 7))
    np.testing.assert_array_equal(ex.arange(1, 10, 3).numpy(), np.arange(1, 10, 3))
    np.testing.assert_allclose(ex.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5))
    np.testing.assert_array_equal(ex.eye(3, k=1).numpy(), np.eye(3, k=1))
    assert ex.array(np.zeros(3)).dtype is ex.float32  # float64 narrows
    a = np.zeros(3, np.float32)
    t = ex.array(a)
    a[0] = 1
    assert t.numpy()[0] == 0 and ex.asarray(a).numpy()[0] == 1  # array copies, asarray shares
    assert ex.array(ml_dtypes.bfloat16(1) * np.ones(2, ml_dtypes.bfloat16)).dtype is ex.bfloat16
    r1, r2 = ex.random.normal((3, 3), seed=3), ex.random.normal((3, 3), seed=3)
    np.testing.assert_array_equal(r1.numpy(), r2.numpy())
    u = ex.random.uniform((1000,), -1, 1, seed=1).numpy()
    assert -1 <= u.min() and u.max() < 1 and abs(u.mean()) < 0.1
