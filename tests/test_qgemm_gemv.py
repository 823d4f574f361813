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


def _prefetch_plan(bits, k, group, weights):
    req = ffi.new("ex_prefetch *")
    ns = ffi.new("int64_t[]", [n for n, _, _ in weights])
    wq = ffi.new("void *[]", [ffi.cast("void *", q.ctypes.data) for _, q, _ in weights])
    sc = ffi.new("void *[]", [ffi.cast("void *", s.ctypes.data) for _, _, s in weights])
    lib.ex_qgemm_prefetch_plan(bits, k, group, len(weights), ns, wq, sc, req)
    return [(int(ffi.cast("uintptr_t", req.p[i])), req.bytes[i]) for i in range(req.n)]


@pytest.mark.parametrize("bits", [4, 8])
def test_prefetch_plan_names_each_streams_start_inside_its_weight(threads, bits):
    """The lines ex_qgemm_prefetch_plan asks the idle worker for: where each of the 4 streams of
    each thread's share of the row groups starts, in the weights and in their scales, never past
    either buffer's end."""
    k, group = 96, 32
    weights = []
    for n in (200, 65, 16):
        q, s = quantize_weight(np.ones((n, k), np.float32), bits, group)
        weights.append((n, q, s))
    req = _prefetch_plan(bits, k, group, weights)
    assert req and len(req) <= 128
    starts = {id(q): set() for _, q, _ in weights}
    for addr, nbytes in req:
        (a,) = [a for _, q, s in weights for a in (q, s)
                if a.ctypes.data <= addr and addr + nbytes <= a.ctypes.data + a.nbytes]
        assert nbytes > 0
        group_bytes = a.nbytes // a.shape[0]  # one 16-row group of weights or of scales
        assert (addr - a.ctypes.data) % group_bytes == 0
        if id(a) in starts:
            starts[id(a)].add((addr - a.ctypes.data) // group_bytes)
    # one thread: each weight whole, in 4 parts (13 groups as 4 + 3 + 3 + 3; 5 as 2 + 1 + 1 + 1)
    if threads == 1:
        assert [sorted(starts[id(q)]) for _, q, _ in weights] == [[0, 4, 7, 10], [0, 2, 3, 4], [0]]
    assert all(0 in v for v in starts.values())
    assert _prefetch_plan(5, k, group, weights) == [] and _prefetch_plan(bits, 48, group, weights) == []


def test_prefetch_request_of_bad_addresses_never_faults(threads):
    """A request is only a hint: lines that are not mapped are skipped by the CPU, a count out of
    range is clipped, and the next job still runs and is right."""
    req = ffi.new("ex_prefetch *")
    req.n = 3
    for i, addr in enumerate((0, 64, (1 << 47) - 4096)):
        req.p[i] = ffi.cast("void *", addr)
        req.bytes[i] = 1 << 20
    lib.ex_prefetch_async(req)
    req.n = 1000
    lib.ex_prefetch_async(req)
    req.n = -5
    lib.ex_prefetch_async(req)
    lib.ex_prefetch_async(ffi.NULL)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((40, 64)).astype(np.float32)
    q, s = quantize_weight(w, 8, 32)
    y = qlinear(ex.asarray(x), q, s, bits=8, group_size=32, out_features=40).numpy()
    np.testing.assert_allclose(y, rounded_x(x) @ dequantize_weight(q, s, 8, 32, 40).T, rtol=1e-4, atol=1e-4)


def test_compiled_decode_step_chains_the_prefetches():
    """In a compiled one-row plan each quantized product hands the pool the next one's weights
    (the last the first's), and the results are those of the products run alone."""
    rng = np.random.default_rng(3)
    ws = [quantize_weight(rng.standard_normal((n, 64)).astype(np.float32), 4, 32) for n in (64, 48, 64)]

    def step(x):
        h = qlinear(x, *ws[0], bits=4, group_size=32, out_features=64)
        h = qlinear(h * 0.5 + 1, *ws[1], bits=4, group_size=32, out_features=48)
        return qlinear(ex.concat([h, h[:, :16]], axis=1), *ws[2], bits=4, group_size=32, out_features=64)
    f = ex.compile(step)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    got = f(ex.asarray(x)).numpy()
    plan = next(iter(f.cache.values())).plan
    chain = [t.prefetch for t in plan.thunks if hasattr(t, "prefetch")]
    assert len(chain) == 3
    size = ffi.sizeof("ex_prefetch")
    for (_, then), (reads, _) in zip(chain, chain[1:] + chain[:1]):
        assert reads.n > 0 and ffi.buffer(then, size)[:] == ffi.buffer(reads, size)[:]
    assert np.array_equal(got, step(ex.asarray(x)).numpy())
