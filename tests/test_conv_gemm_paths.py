"""The GEMM paths that convolutions take, called through the C entry points on every kernel
variant the CPU has, against NumPy: B read in place by the micro-kernel (few rows of A, or many
columns), a small A read in place, the transposed small-plane convolution with its in-register
transpose and epilogue, the skinny GEMV that prefetches its weight rows, and the direct kernel of
few-channel stems."""
import ml_dtypes
import numpy as np
import pytest

from express._lib import ffi, lib
from express.ops.nn import ACTS, _act_ref, conv2d_ref, conv_params, winograd_weights
from test_kernels import fp, rnd, vp  # the cffi pointer helpers of the kernel tests

# m from just past the skinny path (16) across 12 panels of 14 rows (168) and beyond; n across
# the 32-column panels and the 1024-column rule (n = 130 with many rows: at two threads, row
# ranges that each read B in place, not a B packed once and shared); B a view of a wider array
# (row stride > n), or with rows a multiple of 4 KB apart ("4k", which packs B instead)
@pytest.mark.parametrize("m", [17, 29, 65, 168, 169, 250])
@pytest.mark.parametrize("n,k", [(7, 1), (33, 16), (65, 515), (130, 100), (130, 600), (1025, 17), (1100, 40)])
@pytest.mark.parametrize("ld", ["pad", "4k"])
def test_matmul_b_in_place(m, n, k, ld, isa, threads):
    ldb = n + 9 if ld == "pad" else -(-(n + 3) // 1024) * 1024
    a, wide = rnd(m, k), rnd(k, ldb)
    b = wide[:, 3:3 + n]
    c = np.empty((m, n), np.float32)
    assert lib.ex_matmul(lib.EX_F32, vp(a), k, 1, vp(b), ldb, 1, vp(c), m, n, k, 0,
                         ffi.NULL, ffi.NULL, ffi.NULL) == 0
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))



# deep products with a C of 4 MB or more (past L2, read and written once per K block) take K
# blocks of up to 1024 under the AVX-512 kernel: k of 2048 (two blocks) and 2100 (three, 704 long);
# C starts 16 bytes past a 64-byte line, so each tile row spans one more line than it holds
@pytest.mark.parametrize("k", [2048, 2100])
def test_matmul_deep_large_c(k, isa, threads):
    m = n = 1024
    a, b = rnd(m, k), rnd(k, n)
    c = np.empty(m * n + 20, np.float32)[4:4 + m * n].reshape(m, n)
    assert lib.ex_matmul(lib.EX_F32, vp(a), k, 1, vp(b), n, 1, vp(c), m, n, k, 0, ffi.NULL, ffi.NULL, ffi.NULL) == 0
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    # and with the epilogue (bias per column, residual, ReLU) applied after the last K block
    w, bias, res = rnd(n, k), rnd(n), rnd(m, n)
    assert lib.ex_linear(fp(a), vp(w), lib.EX_F32, fp(bias), fp(res), fp(c), m, n, k, lib.EX_ACT_RELU) == 0
    ref = np.maximum(a.astype(np.float64) @ w.T + bias + res, 0)
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


# A read in place (small row-major A; rows not 2 KB apart): row counts across the 14-row panels,
# depths across one and two K blocks (k > 512), A a view with row stride k + pad, or k rounded up
# to a multiple of 512 floats ("2k": rows 2 KB apart, which packs A instead)
@pytest.mark.parametrize("m,n,k", [(17, 40, 64), (31, 33, 100), (64, 64, 64), (99, 70, 20), (128, 128, 128),
                                   (20, 50, 700), (250, 17, 90)])
@pytest.mark.parametrize("pad", [0, 5, "2k"])
def test_matmul_a_in_place(m, n, k, pad, isa, threads):
    lda = -(-k // 512) * 512 if pad == "2k" else k + pad
    a = rnd(m, lda)[:, :k]
    b = rnd(k, n)
    c = np.empty((m, n), np.float32)
    assert lib.ex_matmul(lib.EX_F32, vp(a), lda, 1, vp(b), n, 1, vp(c), m, n, k, 0, ffi.NULL, ffi.NULL, ffi.NULL) == 0
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def run_conv(x, w, act, bias, res, pack, stride=1, pad=None, alias=False, algo="gemm", groups=1, wk=None):
    """ex_conv2d of a k x k convolution, 'same' padding unless given, weights optionally
    pre-packed (or wk, Winograd's transformed ones, in their place); the output starts as NaN, so
    a position left unwritten fails, or (alias) as the residual itself, passed as both (a residual
    that dies there gives the output its buffer)."""
    n, c, h, wd = x.shape
    oc, k = w.shape[0], w.shape[-1]
    pad = k // 2 if pad is None else pad
    y = np.full((n, oc, (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1), np.nan, np.float32)
    p = conv_params(x.shape, y.shape, (k, k), (stride, stride), (pad, pad), (1, 1), groups, act, algo)
    keep = None
    if pack:
        keep = np.empty(lib.ex_conv_packed_size(p), np.float32)
        assert lib.ex_conv_pack_weights(p, fp(w), fp(keep)) == 0
        p.wpack = fp(keep)
    if alias:
        y[...] = res
        res = y
    rc = lib.ex_conv2d(p, fp(x), fp(w if wk is None else wk), ffi.NULL if bias is None else fp(bias),
                       ffi.NULL if res is None else fp(res), fp(y))
    assert rc == 0
    return y


def check_conv(n, c, oc, hw, k, act, bias, res, stride=1, pad=None):
    """A k x k convolution ('same' padding unless given; bias, residual and activation as asked),
    weights as given (packed per call where the path wants them packed) and pre-packed, a residual
    apart from the output and as the output's own buffer, against NumPy."""
    h, w = hw
    pad = k // 2 if pad is None else pad
    x, wt = rnd(n, c, h, w), rnd(oc, c, k, k)
    b = rnd(oc) if bias else None
    want = conv2d_ref(x, wt, b, (stride, stride), (pad,) * 4)
    r = rnd(*want.shape) if res else None
    want = _act_ref(want if r is None else want + r, act)
    for pack in (False, True):
        for alias in (False, True) if res else (False,):
            got = run_conv(x, wt, act, b, r, pack, stride, pad, alias)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(c * k * k),
                                       err_msg=f"pack={pack} alias={alias}")


# the output written over its residual (the planner's choice for a 1x1 convolution whose residual
# dies there) on every path, not just the GEMM ones above: those that add the products onto the
# residual in place (im2col with two K blocks, 1x1), Winograd F(4x4) and F(2x2), whose output
# transforms read each residual element before writing it, and the paths that take a copy
# (depthwise direct and general, the few-channel stem, weights not pre-packed: with one output
# channel the GEMV, which adds the residual after writing the products)
@pytest.mark.parametrize("case", ["im2col", "1x1", "winograd", "winograd2", "dw3", "dw7", "stem", "unpacked",
                                  "unpacked1"])
def test_conv_residual_as_output(case, isa, threads):
    c, oc, k, stride, groups, algo = {
        "im2col": (70, 40, 3, 1, 1, "gemm"), "1x1": (600, 50, 1, 1, 1, "gemm"),
        "winograd": (24, 40, 3, 1, 1, "winograd"), "winograd2": (24, 40, 3, 1, 1, "winograd2"),
        "dw3": (40, 40, 3, 2, 40, "auto"), "dw7": (24, 24, 7, 1, 24, "auto"), "stem": (3, 32, 3, 2, 1, "gemm"),
        "unpacked": (30, 20, 3, 1, 1, "gemm"), "unpacked1": (30, 1, 1, 1, 1, "gemm")}[case]
    x, wt, b = rnd(2, c, 19, 22), rnd(oc, c // groups, k, k), rnd(oc)
    want = conv2d_ref(x, wt, b, (stride, stride), (k // 2,) * 4, groups=groups)
    r = rnd(*want.shape)
    want = np.maximum(want + r, 0)
    wk = winograd_weights(wt, algo) if algo.startswith("winograd") else None
    got = run_conv(x, wt, "relu", b, r, case not in ("unpacked", "unpacked1", "winograd", "winograd2"), stride, alias=True,
                   algo=algo, groups=groups, wk=wk)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(c * k * k))


# planes of 17..49 outputs with 64+ output channels run transposed (T = col^T @ W^T, then the
# 16 x 16 block transpose with the epilogue); channel counts with tails of 1..15 past a block
@pytest.mark.parametrize("hw", [(1, 17), (5, 5), (7, 7), (3, 9)])
@pytest.mark.parametrize("oc", [64, 71, 100, 130])
@pytest.mark.parametrize("act,bias,res", [("none", False, False), ("relu", True, True), ("relu6", True, False),
                                          ("silu", False, True)])
@pytest.mark.parametrize("k", [1, 3])
def test_conv_small_plane_transposed(hw, oc, act, bias, res, k, isa, threads):
    check_conv(2, 40, oc, hw, k, act, bias, res)


# deep 1x1 layers on small planes (MobileNetV2's 576 -> 96 at 14 x 14) run transposed, and with
# pre-packed weights under AVX-512 read the input in place at a per-channel offset (two K blocks
# here), a partial last tile of pixels (169 = 12 x 14 + 1) and of output channels included
@pytest.mark.parametrize("hw", [(14, 14), (13, 13), (7, 7)])
@pytest.mark.parametrize("oc", [64, 100, 260])
def test_conv_deep_1x1_transposed(hw, oc, isa, threads):
    check_conv(2, 600, oc, hw, 1, "relu", True, True)


# at most 256 output positions and a depth of at least twice the output channels run transposed
# whatever the fill (ResNet's 1024 -> 256 at 14 x 14, its 3 x 3 stride-2 layers): planes of 50 to
# 256 positions, 1 x 1 and 3 x 3 at stride 1 and 2, channel counts past a 16-channel block and a
# 32-column panel, weights as given and pre-packed, bias, residual and activations
@pytest.mark.parametrize("c,oc,k,stride", [(160, 64, 1, 1), (300, 71, 1, 2), (40, 100, 3, 2), (64, 130, 3, 1)])
@pytest.mark.parametrize("hw", [(10, 5), (16, 16), (27, 19)])
@pytest.mark.parametrize("act,bias,res", [("relu", True, True), ("none", False, False), ("silu", True, False)])
def test_conv_deep_small_plane_transposed(c, oc, k, stride, hw, act, bias, res, isa, threads):
    check_conv(1, c, oc, hw, k, act, bias, res, stride)


# stride 2 with a kernel past 1 x 1, at least 14 outputs a row (AVX-512): an implicit GEMM that
# reads the input split into even and odd columns at per-tap offsets, no im2col; kernels of even
# and odd sizes with and without padding, rows of one tile and of one and a bit (a short last
# tile), several K blocks (130 channels x 9), output channels past a 32-column panel, two images;
# weights pre-packed and as given (packed per call)
@pytest.mark.parametrize("c,k,pad", [(5, 3, 1), (40, 3, 0), (130, 3, 1), (24, 5, 2), (33, 2, 0)])
@pytest.mark.parametrize("hw", [(29, 28), (36, 35), (20, 64)])
@pytest.mark.parametrize("oc,act,bias,res", [(32, "relu", True, True), (45, "none", False, False),
                                             (100, "silu", True, False)])
def test_conv_stride2_implicit(c, k, pad, hw, oc, act, bias, res, isa, threads):
    check_conv(2, c, oc, hw, k, act, bias, res, 2, pad)


# a last tile of 1..4 columns past a 16-column vector, with A (the weights) pre-packed, goes a
# column at a time (uk_cols): planes of 81 (5 x 16 + 1), 100 (+ 4) and 98 (+ 2) outputs, and 77
# (+ 13, the masked vector) for contrast; 20 output channels (a partial 6-row panel); depths of
# one K block (43 and 387: past the last multiple of 4) and of two (600); bias per output
# channel, residual, activations
@pytest.mark.parametrize("hw", [(9, 9), (10, 10), (7, 14), (7, 11)])
@pytest.mark.parametrize("c,k", [(43, 1), (600, 1), (43, 3)])
@pytest.mark.parametrize("act,bias,res", [("none", False, False), ("relu", True, True), ("relu6", True, False),
                                          ("gelu", True, True)])
def test_conv_last_columns(hw, c, k, act, bias, res, isa, threads):
    check_conv(1, c, 20, hw, k, act, bias, res)


# a product of one K block walks its rows in groups of one or two tiles, each group across all
# its columns (while the block of B it walks stays in L2): output channels across several groups,
# MC blocks and a partial last tile, planes of several column panels with a ragged last one, a
# bias, a residual and activations read and applied per tile in the new order
@pytest.mark.parametrize("oc", [13, 29, 90, 171])
@pytest.mark.parametrize("c,hw", [(16, (19, 23)), (64, (12, 45)), (300, (9, 40))])
@pytest.mark.parametrize("act,bias,res", [("relu", True, True), ("none", False, False), ("gelu", True, True)])
def test_conv_1x1_row_groups(oc, c, hw, act, bias, res, isa, threads):
    check_conv(1, c, oc, hw, 1, act, bias, res)


def test_conv_small_plane_relu_keeps_nan(isa):
    """The transposed form's in-register ReLU lets NaN through, as NumPy and act_row do."""
    x, wt = rnd(1, 32, 7, 7), rnd(64, 32, 1, 1)
    x[0, :, 3, 4] = np.nan
    got = run_conv(x, wt, "relu", None, None, True)
    assert np.isnan(got[:, :, 3, 4]).all()
    mask = np.ones((7, 7), bool)
    mask[3, 4] = False
    want = np.maximum(conv2d_ref(x, wt), 0)
    np.testing.assert_allclose(got[:, :, mask], want[:, :, mask], rtol=1e-4, atol=1e-4)


# one row of x (the GEMV form of the skinny path): k across its 16-element steps and far past the
# 512-element prefetch distance
@pytest.mark.parametrize("k", [1, 15, 16, 17, 600, 1281])
@pytest.mark.parametrize("wdt", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_linear_one_row(k, wdt, isa, threads):
    n = 37
    x, w, b = rnd(1, k), rnd(n, k).astype(wdt), rnd(n)
    y = np.empty((1, n), np.float32)
    code = {np.float32: lib.EX_F32, np.float16: lib.EX_F16}.get(wdt, lib.EX_BF16)
    assert lib.ex_linear(fp(x), vp(w), code, fp(b), ffi.NULL, fp(y), 1, n, k, ACTS["relu"]) == 0
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


# few output channels and a short K: col built row-major, in chunks of output rows, and read in
# place by the GEMM; 5 x 203 x 199 at stride 1 makes several chunks (at most 4 input channels go
# to the direct kernel below instead)
@pytest.mark.parametrize("stride,oc", [(1, 17), (2, 45)])
def test_conv_stem_col_in_place(stride, oc, isa, threads):
    x, wt, b = rnd(1, 5, 203, 199), rnd(oc, 5, 3, 3), rnd(oc)
    oh, ow = (203 + 2 - 3) // stride + 1, (199 + 2 - 3) // stride + 1
    r = rnd(1, oc, oh, ow)
    y = np.empty((1, oc, oh, ow), np.float32)
    p = conv_params(x.shape, y.shape, (3, 3), (stride, stride), (1, 1), (1, 1), 1, "relu6", "gemm")
    keep = np.empty(lib.ex_conv_packed_size(p), np.float32)
    assert lib.ex_conv_pack_weights(p, fp(wt), fp(keep)) == 0
    p.wpack = fp(keep)
    assert lib.ex_conv2d(p, fp(x), fp(wt), fp(b), fp(r), fp(y)) == 0
    want = np.clip(conv2d_ref(x, wt, b, (stride, stride), (1, 1, 1, 1)) + r, 0, 6)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# a 1 x 1 convolution at stride 2 (ResNet's downsampling): im2col takes every other column, split
# in registers on AVX-512; widths give rows of one short vector, one and a bit, several, an odd
# last column and (padding) columns outside the row at both ends
@pytest.mark.parametrize("w,pad", [(9, 0), (33, 0), (62, 0), (35, 1), (64, 2)])
def test_conv_1x1_stride2(w, pad, isa, threads):
    c, h = 6, 11
    oh, ow = (h + 2 * pad - 1) // 2 + 1, (w + 2 * pad - 1) // 2 + 1
    for oc in (20, 200):  # col read in place by the GEMM / packed by it
        x, wt, b = rnd(2, c, h, w), rnd(oc, c, 1, 1), rnd(oc)
        y = np.full((2, oc, oh, ow), np.nan, np.float32)
        p = conv_params(x.shape, y.shape, (1, 1), (2, 2), (pad, pad), (1, 1), 1, "none", "gemm")
        assert lib.ex_conv2d(p, fp(x), fp(wt), fp(b), ffi.NULL, fp(y)) == 0
        want = conv2d_ref(x, wt, b, (2, 2), (pad,) * 4)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4, err_msg=f"oc={oc}")


# at most 4 input channels (the stems), 3 x 3 to 7 x 7 at stride 1 or 2: the direct kernel (AVX-512
# and AVX2) over a zero-padded copy of the input (split into even and odd columns at stride 2),
# tiles of 8 (AVX2: 4) output channels by up to 3 vectors of 16 (8) outputs; odd sizes give
# padding at both ends of a row, rows of one tile and of several with a last tile of 1 or 2
# vectors and a short last vector, and channel counts a short last block
@pytest.mark.parametrize("c,k,stride,pad", [(3, 3, 2, 1), (3, 7, 2, 3), (1, 5, 1, 2), (4, 3, 1, 0), (2, 7, 1, 1),
                                            (3, 5, 2, 0)])
@pytest.mark.parametrize("hw", [(37, 45), (17, 16), (40, 71), (20, 112)])
def test_conv_few_channels_direct(c, k, stride, pad, hw, isa, threads):
    h, w = hw
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    for oc, act, bias, res in ((16, "relu", True, False), (45, "none", False, True), (5, "relu6", True, True),
                               (33, "silu", True, False)):
        x, wt = rnd(2, c, h, w), rnd(oc, c, k, k)
        b = rnd(oc) if bias else None
        r = rnd(2, oc, oh, ow) if res else None
        y = np.full((2, oc, oh, ow), np.nan, np.float32)
        p = conv_params(x.shape, y.shape, (k, k), (stride, stride), (pad, pad), (1, 1), 1, act, "gemm")
        assert lib.ex_conv2d(p, fp(x), fp(wt), ffi.NULL if b is None else fp(b), ffi.NULL if r is None else fp(r),
                             fp(y)) == 0
        want = conv2d_ref(x, wt, b, (stride, stride), (pad,) * 4)
        want = _act_ref(want if r is None else want + r, act)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * k, err_msg=f"oc={oc} act={act}")
