"""The one-row quantized GEMV (ex_qgemm at m = 1, the decode step's kernel) against a NumPy
dequantization, and ex_read_sum (the bandwidth probe of benchmarks/llm.py) against NumPy's sum."""
import numpy as np
import pytest

import express as ex
from express._lib import ffi, lib
from express.ops.quant import dequantize_weight, pack_weight, qlinear, quantize_weight


def rounded_x(x):
    """x as the kernel rounds it: int8 per 32 values, scale max|x| / 127."""
    b = x.reshape(x.shape[0], -1, 32)
    s = np.abs(b).max(-1, keepdims=True) / 127
    return (np.rint(b / np.where(s > 0, s, 1)) * s).reshape(x.shape)


# n: a single row, partial and full 16-row groups, group counts that leave 1, 2 or 3 groups over
# the four streams of a thread's share, and ones that split into unequal chunks on two threads; k: one block, odd block counts, the model's hidden size, group sizes above 32
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n", [1, 7, 16, 17, 65, 96, 97, 129, 200, 256])
@pytest.mark.parametrize("k, group", [(32, 32), (96, 32), (224, 32), (256, 64), (896, 32), (1152, 128)])
def test_gemv_matches_dequantized_reference(isa, threads, bits, n, k, group):
    rng = np.random.default_rng(n * 7 + k + bits)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    if k > 32:
        x[0, 32:64] = 0  # an all-zero block (activation scale 0)
    b = rng.standard_normal(n).astype(np.float32)
    q, s = quantize_weight(w, bits, group)
    wd = dequantize_weight(q, s, bits, group, n)
    y = qlinear(ex.asarray(x), q, s, b, bits=bits, group_size=group, out_features=n).numpy()
    ref = rounded_x(x) @ wd.T + b
    np.testing.assert_allclose(y, ref, atol=2e-4 * np.abs(ref).max(), rtol=1e-5)
    # and the float product to within what rounding x can change: half a step of x's block scale
    step = np.repeat(np.abs(x).reshape(-1, 32).max(-1) / 127, 32)
    assert np.all(np.abs(y - (x @ wd.T + b)) <= (0.5 * step) @ np.abs(wd).T * 1.001 + 1e-5)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n, k", [(9, 64), (70, 288), (136, 4864)])
def test_gemv_extreme_codes_no_bias(isa, bits, n, k):
    """The largest codes at every position (int16 partial sums must not saturate), x at +-max."""
    rng = np.random.default_rng(n + k)
    lo, hi = (-127, 127) if bits == 8 else (-8, 7)
    q, s = pack_weight(rng.choice([lo, hi], (n, k)), rng.uniform(0.5, 1, (n, k // 32)), bits, 32)
    x = rng.choice([-1.0, 1.0], (1, k)).astype(np.float32) * 3
    y = qlinear(ex.asarray(x), q, s, bits=bits, group_size=32, out_features=n).numpy()
    ref = x.astype(np.float64) @ dequantize_weight(q, s, bits, 32, n).T.astype(np.float64)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_gemv_bad_arguments_are_rejected():
    """Sizes the packed layout cannot have come back as EX_EINVAL from C, not as a crash."""
    x = np.ones((1, 64), np.float32)
    y = np.empty((1, 8), np.float32)
    q, s = quantize_weight(np.ones((8, 64), np.float32), 4, 32)
    p = lambda a, t: ffi.cast(t, a.ctypes.data)  # noqa: E731
    for bits, k, group in ((5, 64, 32), (4, 64, 48), (4, 48, 32), (4, 0, 32), (4, 64, 0)):
        assert lib.ex_qgemm(bits, 1, 8, k, group, p(x, "float *"), p(q, "void *"), p(s, "void *"), ffi.NULL,
                            p(y, "float *")) == lib.EX_EINVAL
    with pytest.raises(ex.ExpressError):
        qlinear(ex.ones((1, 96)), q, s, bits=4, group_size=32)


@pytest.mark.parametrize("n", [0, 1, 7, 17, 65, 4096, 4096 * 9 + 13, (1 << 20) + 3])
def test_read_sum_matches_numpy(isa, threads, n):
    rng = np.random.default_rng(n)
    a = rng.uniform(-1, 2, n + 1).astype(np.float32)
    for v in (a[:n], a[1:]):  # aligned and one float off
        got = lib.ex_read_sum(ffi.cast("float *", v.ctypes.data), len(v))
        assert got == pytest.approx(float(v.astype(np.float64).sum()), rel=1e-5, abs=1e-4)
    assert lib.ex_read_sum(ffi.NULL, 10) == 0.0
    assert lib.ex_read_sum(ffi.cast("float *", a.ctypes.data), -1) == 0.0
