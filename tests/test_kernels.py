"""The C kernels of the CNN/attention family called directly (cffi), on every variant the CPU
has, against NumPy: GEMM tiles and epilogues across odd sizes, f16/bf16 weights, conv algorithms,
argument validation."""
import ml_dtypes
import numpy as np
import pytest

from express._lib import ffi, lib
from express.ops.nn import ACTS, _act_ref, conv2d_ref, conv_params, winograd_weights

RNG = np.random.default_rng(1)


def fp(a):
    return ffi.cast("float *", a.__array_interface__["data"][0])


def vp(a):
    return ffi.cast("void *", a.__array_interface__["data"][0])


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


SIZES = [(1, 1, 1), (1, 65, 17), (7, 33, 65), (15, 31, 29), (17, 17, 300), (29, 65, 7), (64, 100, 257),
         (130, 97, 66), (128, 33, 200)]


@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
def test_linear_epilogue(m, n, k, act, isa, threads):
    x, w, b, r = rnd(m, k), rnd(n, k), rnd(n), rnd(m, n)
    y = np.empty((m, n), np.float32)
    assert lib.ex_linear(fp(x), vp(w), lib.EX_F32, fp(b), fp(r), fp(y), m, n, k, ACTS[act]) == 0
    want = _act_ref(x.astype(np.float64) @ w.T + b + r, act)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    assert lib.ex_linear(fp(x), vp(w), lib.EX_F32, ffi.NULL, ffi.NULL, fp(y), m, n, k, 0) == 0
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 130, 1027])
@pytest.mark.parametrize("k", [31, 32, 100, 1000])
def test_linear_one_row_parts(n, k, isa, threads):
    """One row of x: the weight rows as up to 4 parts walked side by side (n % 4 extra rows, n < 4
    rows, a k tail past whole steps), with bias, residual and an activation."""
    x, w, b, r = rnd(1, k), rnd(n, k), rnd(n), rnd(1, n)
    y = np.empty((1, n), np.float32)
    assert lib.ex_linear(fp(x), vp(w), lib.EX_F32, fp(b), fp(r), fp(y), 1, n, k, ACTS["gelu"]) == 0
    want = _act_ref(x.astype(np.float64) @ w.T + b + r, "gelu")
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("m", [1, 4, 16, 40])
@pytest.mark.parametrize("wdt", [np.float16, ml_dtypes.bfloat16])
def test_linear_half_weights(m, wdt, isa):
    n, k = 70, 133
    x, w = rnd(m, k), rnd(n, k).astype(wdt)
    y = np.empty((m, n), np.float32)
    code = lib.EX_F16 if wdt is np.float16 else lib.EX_BF16
    assert lib.ex_linear(fp(x), vp(w), code, ffi.NULL, ffi.NULL, fp(y), m, n, k, 0) == 0
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-4, atol=1e-3)


def test_linear_rejects_bad_arguments():
    x = rnd(2, 2)
    assert lib.ex_linear(fp(x), vp(x), lib.EX_I32, ffi.NULL, ffi.NULL, fp(x), 2, 2, 2, 0) == lib.EX_EDTYPE
    assert lib.ex_linear(fp(x), vp(x), lib.EX_F32, ffi.NULL, ffi.NULL, fp(x), 2, 2, 2, 99) == lib.EX_EINVAL
    assert lib.ex_linear(ffi.NULL, vp(x), lib.EX_F32, ffi.NULL, ffi.NULL, fp(x), 2, 2, 2, 0) == lib.EX_EINVAL


@pytest.mark.parametrize("n", [14, 32, 100, 513])
def test_matmul_tile_edges(n, isa, threads):
    """Square products crossing the 6x16 / 14x32 micro-tile and KC/MC blocking edges."""
    a, b = rnd(n, n + 3), rnd(n + 3, n - 1)
    c = np.empty((n, n - 1), np.float32)
    assert lib.ex_matmul(lib.EX_F32, vp(a), n + 3, 1, vp(b), n - 1, 1, vp(c), n, n - 1, n + 3, 0,
                         ffi.NULL, ffi.NULL, ffi.NULL) == 0
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def conv(x, w, oc, k, stride, pad, algo, act="none", bias=None, res=None):
    n, c, h, wd = x.shape
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    y = np.empty((n, oc, oh, ow), np.float32)
    p = conv_params(x.shape, y.shape, (k, k), (stride, stride), (pad, pad), (1, 1), 1, act, algo)
    rc = lib.ex_conv2d(p, fp(x), fp(w), ffi.NULL if bias is None else fp(bias), ffi.NULL if res is None else fp(res),
                       fp(y))
    return rc, y


@pytest.mark.parametrize("shape", [(1, 1, 4, 4, 1), (1, 8, 7, 7, 5), (2, 16, 17, 9, 33), (1, 64, 28, 28, 64),
                                   (2, 8, 33, 64, 7), (1, 16, 61, 40, 9)])
def test_winograd_within_1e4_of_direct(shape, isa, threads):
    n, c, h, w, oc = shape
    x, wt, b = rnd(n, c, h, w), rnd(oc, c, 3, 3), rnd(oc)
    want = conv2d_ref(x, wt, b, pads=(1, 1, 1, 1))
    rc, y = conv(x, winograd_weights(wt), oc, 3, 1, 1, "winograd", bias=b)
    assert rc == 0
    assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max()
    rc, y2 = conv(x, wt, oc, 3, 1, 1, "gemm", bias=b)
    assert rc == 0
    assert np.abs(y2 - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("act", ["none", "relu6", "silu", "gelu"])
@pytest.mark.parametrize("shape", [(2, 16, 13, 9, 19), (1, 8, 28, 30, 24), (3, 8, 5, 41, 5), (1, 8, 6, 6, 9),
                                   (1, 8, 56, 56, 9)])  # 196 tiles: blocks of 200, or 104 + 92 a thread
def test_winograd_epilogue_runs(shape, act, isa, threads):
    """F(4x4)'s output rows are written a run of tiles at a time (tiles of one row, split where a
    group of 8 tiles, 16 with AVX-512, crosses rows or images, clipped at the plane's edge): bias,
    residual, each activation, and NaN in the residual passing through ReLU6 at its own position."""
    n, c, h, w, oc = shape
    x, wt, b, r = rnd(n, c, h, w), rnd(oc, c, 3, 3), rnd(oc), rnd(n, oc, h, w)
    r[0, 0, 0, 1] = r[-1, -1, -1, -1] = np.nan
    rc, y = conv(x, winograd_weights(wt), oc, 3, 1, 1, "winograd", act=act, bias=b, res=r)
    assert rc == 0
    want = _act_ref(conv2d_ref(x, wt, b, pads=(1, 1, 1, 1)) + r, act)
    assert np.array_equal(np.isnan(y), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.abs(y[ok] - want[ok]).max() <= 1e-4 * max(1.0, np.abs(want[ok]).max())


@pytest.mark.parametrize("shape", [(1, 17, 9, 13, 1), (2, 33, 17, 7, 65), (1, 7, 65, 5, 7), (1, 520, 9, 9, 19),
                                   (1, 520, 13, 13, 65)])
def test_winograd_prepacked_weights(shape, isa, threads):
    """Transformed weights packed once for the GEMM (K blocks past 512 channels, odd sizes)."""
    n, c, h, w, oc = shape
    x, wt, b, r = rnd(n, c, h, w), rnd(oc, c, 3, 3), rnd(oc), rnd(n, oc, h, w)
    u = winograd_weights(wt)
    y = np.empty((n, oc, h, w), np.float32)
    p = conv_params(x.shape, y.shape, (3, 3), (1, 1), (1, 1), (1, 1), 1, "relu", "winograd")
    packed = np.empty(lib.ex_conv_packed_size(p), np.float32)
    assert lib.ex_conv_pack_weights(p, fp(u), fp(packed)) == 0
    p.wpack = fp(packed)
    assert lib.ex_conv2d(p, fp(x), fp(u), fp(b), fp(r), fp(y)) == 0
    want = np.maximum(conv2d_ref(x, wt, b, pads=(1, 1, 1, 1)) + r, 0)
    assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("case", [(1, 64, 65, 17, 7, 3, 2, 1, 1), (1, 3, 17, 65, 65, 7, 2, 3, 1),
                                  (2, 6, 7, 7, 4, 3, 1, 0, 2), (1, 5, 1, 1, 3, 3, 1, 1, 1),
                                  (1, 4, 33, 20, 6, 5, 3, 2, 2)])
@pytest.mark.parametrize("prepack", [False, True])
def test_conv_im2col_packed_chunks(case, prepack, isa, threads):
    """im2col written in the GEMM's packed-B layout: several K blocks (64 x 3 x 3 > 512), several
    chunks of output rows, odd widths, strides, padding, groups, with and without packed weights."""
    n, c, h, w, oc, k, s, pad, g = case
    x, wt, b, r = rnd(n, c, h, w), rnd(oc, c // g, k, k), rnd(oc), None
    oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    y = np.empty((n, oc, oh, ow), np.float32)
    r = rnd(n, oc, oh, ow)
    p = conv_params(x.shape, y.shape, (k, k), (s, s), (pad, pad), (1, 1), g, "relu", "gemm")
    if prepack:
        packed = np.empty(lib.ex_conv_packed_size(p), np.float32)
        assert lib.ex_conv_pack_weights(p, fp(wt), fp(packed)) == 0
        p.wpack = fp(packed)
    assert lib.ex_conv2d(p, fp(x), fp(wt), fp(b), fp(r), fp(y)) == 0
    want = np.maximum(conv2d_ref(x, wt, b, (s, s), (pad,) * 4, (1, 1), g) + r, 0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.sqrt(c * k * k))


@pytest.mark.parametrize("hw", [5, 7, 14])
def test_conv_small_spatial_transposed_gemm(hw, isa, threads):
    """Few output positions and many channels: the GEMM runs transposed, then the epilogue."""
    x, w, b, r = rnd(2, 32, hw, hw), rnd(96, 32, 3, 3), rnd(96), rnd(2, 96, hw, hw)
    rc, y = conv(x, w, 96, 3, 1, 1, "gemm", "relu", b, r)
    assert rc == 0
    np.testing.assert_allclose(y, np.maximum(conv2d_ref(x, w, b, pads=(1, 1, 1, 1)) + r, 0), rtol=1e-4, atol=1e-4)


def conv_full(x, w, stride, pad, groups, act="none", bias=None, res=None, algo="auto", pack_isa=None):
    """ex_conv2d with square stride/padding and groups; pack_isa: weights pre-packed (for the GEMM
    micro-kernel) by that kernel variant first."""
    import express as ex
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.empty((n, oc, oh, ow), np.float32)
    p = conv_params(x.shape, y.shape, (kh, kw), (stride, stride), (pad, pad), (1, 1), groups, act, algo)
    keep = None
    if pack_isa is not None:
        run_isa = ex.isa()
        ex.set_isa(pack_isa)
        keep = np.empty(lib.ex_conv_packed_size(p), np.float32)
        assert lib.ex_conv_pack_weights(p, fp(w), fp(keep)) == 0
        ex.set_isa(run_isa)
        p.wpack = fp(keep)
    rc = lib.ex_conv2d(p, fp(x), fp(w), ffi.NULL if bias is None else fp(bias), ffi.NULL if res is None else fp(res),
                       fp(y))
    assert rc == 0
    return y


def conv_want(x, w, stride, pad, groups, act, b, r):
    return _act_ref(conv2d_ref(x, w, b, (stride, stride), (pad,) * 4, (1, 1), groups) + r, act)


@pytest.mark.parametrize("shape", [(1, 8, 7, 7, 64), (2, 16, 14, 14, 96), (1, 32, 9, 5, 128)])
def test_conv_prepacked_weights(shape, isa, threads):
    """Weights pre-packed for the micro-kernel (as A, or as B for the transposed small-N form);
    packed by another kernel variant they are ignored (their header does not match)."""
    n, c, h, w, oc = shape
    x, wt, b, r = rnd(n, c, h, w), rnd(oc, c, 3, 3), rnd(oc), rnd(n, oc, h, w)
    want = conv_want(x, wt, 1, 1, 1, "relu", b, r)
    for pack_isa in {isa, "generic"}:
        got = conv_full(x, wt, 1, 1, 1, "relu", b, r, "gemm", pack_isa)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_gemm_in_row_chunks(stride, isa, threads):
    """An output large enough that im2col runs in chunks of output rows (epilogue offsets per chunk)."""
    x, wt, b = rnd(1, 64, 201, 23), rnd(8, 64, 3, 3), rnd(8)
    oh, ow = (201 + 2 - 3) // stride + 1, (23 + 2 - 3) // stride + 1
    r = rnd(1, 8, oh, ow)
    got = conv_full(x, wt, stride, 1, 1, "relu6", b, r, "gemm", isa)
    np.testing.assert_allclose(got, conv_want(x, wt, stride, 1, 1, "relu6", b, r), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("hw", [(1, 1), (2, 3), (7, 7), (8, 14), (17, 33), (40, 65)])
@pytest.mark.parametrize("pad", [0, 1, 2])
def test_depthwise_3x3(stride, hw, pad, isa):
    """The direct depthwise 3x3 kernel at stride 1 and 2 across plane sizes and padding."""
    h, w = hw
    if h + 2 * pad < 3 or w + 2 * pad < 3:
        return
    c = 5
    x, wt, b = rnd(2, c, h, w), rnd(c, 1, 3, 3), rnd(c)
    oh, ow = (h + 2 * pad - 3) // stride + 1, (w + 2 * pad - 3) // stride + 1
    r = rnd(2, c, oh, ow)
    for act, res in (("relu6", None), ("relu", r)):
        got = conv_full(x, wt, stride, pad, c, act, b, res, "depthwise")
        want = conv_want(x, wt, stride, pad, c, act, b, 0.0 if res is None else res)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_epilogue_and_validation(isa):
    x, w, b = rnd(1, 3, 9, 9), rnd(6, 3, 3, 3), rnd(6)
    r = rnd(1, 6, 9, 9)
    rc, y = conv(x, w, 6, 3, 1, 1, "gemm", "relu6", b, r)
    assert rc == 0
    np.testing.assert_allclose(y, np.clip(conv2d_ref(x, w, b, pads=(1, 1, 1, 1)) + r, 0, 6), rtol=1e-4, atol=1e-4)
    assert conv(x, w, 6, 3, 2, 1, "winograd")[0] == lib.EX_EINVAL   # Winograd is stride 1 only
    assert conv(x, w, 6, 3, 1, 1, "depthwise")[0] == lib.EX_EINVAL  # not one channel per group
    bad = conv_params(x.shape, (1, 6, 9, 9), (3, 3), (0, 1), (1, 1), (1, 1), 1, "none", "gemm")
    assert lib.ex_conv2d(bad, fp(x), fp(w), ffi.NULL, ffi.NULL, fp(y)) == lib.EX_EINVAL
    assert lib.ex_conv2d(ffi.NULL, fp(x), fp(w), ffi.NULL, ffi.NULL, fp(y)) == lib.EX_EINVAL


def test_pool_pad_norm_validation():
    x = rnd(4)
    assert lib.ex_pool2d(7, fp(x), fp(x), 1, 2, 2, 1, 1, 2, 2, 1, 1, 0, 0, 1, 1) == lib.EX_EOPCODE
    assert lib.ex_pool2d(0, fp(x), fp(x), 1, 2, 2, 1, 1, 0, 2, 1, 1, 0, 0, 1, 1) == lib.EX_EINVAL
    shape = ffi.new("int64_t[3]", [1, 1, 4])
    big = ffi.new("int64_t[3]", [0, 0, 4])
    assert lib.ex_pad(4, lib.EX_PAD_REFLECT, vp(x), vp(x), 1, shape, big, big, ffi.NULL) == lib.EX_EINVAL
    assert lib.ex_group_norm(fp(x), ffi.NULL, ffi.NULL, fp(x), 1, 3, 1, 2, 1e-5, 0) == lib.EX_EINVAL
    assert lib.ex_attention(fp(x), ffi.NULL, fp(x), ffi.NULL, fp(x), ffi.NULL, ffi.NULL, ffi.NULL, fp(x),
                            1, 3, 2, 1, 1, 1, 1, 1.0, 0) == lib.EX_EINVAL


def test_isa_names():
    import express as ex
    have = ["generic"] + (["avx2"] if lib.ex_cpu_has_avx2() else []) + (["avx512"] if lib.ex_cpu_has_avx512() else [])
    before = ex.isa()
    for name in have:
        ex.set_isa(name)
        assert ex.isa() == name
    ex.set_isa(before)
    with pytest.raises(ex.ExpressError, match="set_isa"):
        ex.set_isa("sse9")


def attention_call(q, k, v, mask=None, scale=0.3, causal=False):
    """ex_attention on (B, H, L, D) arrays of any strides along B/H/L (unit along D)."""
    b, hq, lq, _ = q.shape
    y = np.empty((b, hq, lq, v.shape[3]), np.float32)
    st = [ffi.new("int64_t[3]", [s // 4 for s in a.strides[:3]]) for a in (q, k, v)]
    m, ms = ffi.NULL, ffi.NULL
    if mask is not None:
        mask = np.broadcast_to(mask, (b, hq, lq, k.shape[2]))
        m, ms = fp(mask), ffi.new("int64_t[4]", [s // 4 for s in mask.strides])
    rc = lib.ex_attention(fp(q), st[0], fp(k), st[1], fp(v), st[2], m, ms, fp(y), b, hq, k.shape[1], lq,
                          k.shape[2], q.shape[3], v.shape[3], scale, int(causal))
    assert rc == 0
    return y


def attention_reference(q, k, v, mask=None, scale=0.3, causal=False):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ v


# many rows per KV head take the packed-K/V path: key blocks of whole vectors with a ragged
# last one, head dims that are no multiple of the vector width, GQA, causal with lq != lk
@pytest.mark.parametrize("b,hq,hk,lq,lk,d,dv", [(2, 2, 2, 64, 77, 40, 40), (1, 4, 2, 37, 300, 40, 40),
                                                (1, 2, 1, 150, 70, 80, 80), (1, 1, 1, 70, 150, 160, 160),
                                                (1, 3, 3, 16, 129, 7, 5), (1, 8, 2, 4, 1000, 64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_packed_blocks(b, hq, hk, lq, lk, d, dv, causal, isa, threads):
    q, k, v = rnd(b, hq, lq, d), rnd(b, hk, lk, d), rnd(b, hk, lk, dv)
    np.testing.assert_allclose(attention_call(q, k, v, causal=causal), attention_reference(q, k, v, causal=causal),
                               rtol=1e-4, atol=1e-5)


def test_attention_packed_masks_and_views(isa):
    # (B, L, H, D) storage seen as (B, H, L, D); rows masked for whole key blocks, then visible
    q = rnd(2, 40, 3, 16).transpose(0, 2, 1, 3)
    k, v = rnd(2, 3, 260, 16), rnd(2, 3, 260, 24)
    mask = np.where(RNG.random((40, 260)) > 0.2, rnd(40, 260), -np.inf).astype(np.float32)
    mask[:20, :200] = -np.inf
    mask[:, 259] = 0.0
    np.testing.assert_allclose(attention_call(q, k, v, mask), attention_reference(q, k, v, mask), rtol=1e-4,
                               atol=1e-5)
    mask = rnd(2, 1, 40, 1)  # broadcast along heads and keys (zero strides)
    np.testing.assert_allclose(attention_call(q, k, v, mask, causal=True),
                               attention_reference(q, k, v, mask, causal=True), rtol=1e-4, atol=1e-5)
    big = q * 10  # large scores (float32 rounding of them grows too): the running max must rescale
    np.testing.assert_allclose(attention_call(big, k, v), attention_reference(big, k, v), rtol=1e-4, atol=1e-4)


# a KV cache bucket filled up to `filled` keys (the rest masked with -inf, and NaN in K/V so that a
# read of it would show) and queries at positions filled - lq .. filled - 1 (a causal mask): decode
# (few rows, K/V read in place) and prefill chunks (packed path), GQA, head dims of whole vectors
# or not, random finite mask values where visible; the reference sees only the filled keys
@pytest.mark.parametrize("b,hq,hk,lq,lk,filled,d,dv", [
    (1, 14, 2, 1, 256, 161, 64, 64), (2, 6, 3, 1, 77, 50, 40, 40), (1, 8, 1, 1, 100, 97, 24, 20),
    (1, 4, 2, 3, 130, 67, 32, 48), (1, 14, 2, 37, 128, 57, 64, 64), (1, 2, 2, 40, 300, 40, 16, 24),
    (1, 3, 1, 5, 33, 33, 16, 16)])
@pytest.mark.parametrize("extra", ["none", "values", "causal"])
def test_attention_masked_tail(b, hq, hk, lq, lk, filled, d, dv, extra, isa, threads):
    q, k, v = rnd(b, hq, lq, d), rnd(b, hk, lk, d), rnd(b, hk, lk, dv)
    k[:, :, filled:] = np.nan
    v[:, :, filled:] = np.nan
    pos = np.arange(filled - lq, filled)[:, None]
    mask = np.where(np.arange(lk)[None, :] <= pos, 0.0, -np.inf).astype(np.float32)
    if extra == "values":
        mask = np.where(mask == 0, rnd(lq, lk), mask).astype(np.float32)
    causal = extra == "causal"  # also the flag (top-left aligned, so stricter for lq > 1)
    want = attention_reference(q, k[:, :, :filled], v[:, :, :filled], mask[:, :filled], causal=causal)
    np.testing.assert_allclose(attention_call(q, k, v, mask, causal=causal), want, rtol=1e-4, atol=1e-5)


def test_silu_vectorized_exp(isa):
    """silu and the MLP's silu(gate) * up (one fused program) against float64 x * sigmoid(x): the
    vectorized exp over the whole float range, the over/underflow edges, inf and NaN."""
    import express as ex
    import express.nn.functional as F
    edges = [-89.5, -88.7, -88.3, -87.1, -86.9, 86.9, 88.5, 89.5, 1e30, -1e30, 1e-40, -1e-40, 0.0, -0.0]
    x = np.concatenate([np.linspace(-120, 120, 20001), np.linspace(-1e-3, 1e-3, 101), edges]).astype(np.float32)
    ref = lambda a: a.astype(np.float64) / (1.0 + np.exp(-a.astype(np.float64)))  # noqa: E731
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(F.silu(ex.asarray(x)).numpy(), ref(x), rtol=1e-6, atol=1e-35)
        special = np.array([np.inf, -np.inf, np.nan], np.float32)
        np.testing.assert_array_equal(F.silu(ex.asarray(special)).numpy(), np.array([np.inf, np.nan, np.nan]))
        g, u = rnd(37, 203) * 8, rnd(37, 203)
        np.testing.assert_allclose((F.silu(ex.asarray(g)) * ex.asarray(u)).numpy(), ref(g) * u, rtol=1e-6, atol=1e-30)
