"""Depthwise convolution (one channel per group) called directly through ex_conv2d on every kernel
variant the CPU has, against a NumPy reference written here: 3x3 and 5x5, stride 1 and 2, padding
0..2 (and uneven), odd plane sizes and vector tails (rows narrower and wider than a vector),
batch 2, bias, residual and activations, planes split into row strips over two threads, small
planes 16 channels at a time; plus the nn.functional route with other shapes and its shape errors,
and adaptive average pooling."""
import numpy as np
import pytest

import express as ex
import express.nn.functional as F
from express._lib import ffi, lib
from express.ops.nn import conv_params

RNG = np.random.default_rng(7)


def fp(a):
    return ffi.cast("float *", a.__array_interface__["data"][0])


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def ref(x, w, stride, pads, bias=None, res=None, act="none", out_hw=None):
    """Depthwise convolution by its definition in float64: zero padding (top, left, bottom, right),
    then for every tap the strided window of each plane times that channel's weight."""
    n, c, h, wd = x.shape
    k = w.shape[2]
    t, l, b, r = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)))
    oh, ow = out_hw or ((h + t + b - k) // stride + 1, (wd + l + r - k) // stride + 1)
    y = np.zeros((n, c, oh, ow))
    for i in range(k):
        for j in range(k):
            win = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            y += win * w[:, 0, i, j].astype(np.float64)[None, :, None, None]
    if bias is not None:
        y += bias[None, :, None, None]
    if res is not None:
        y += res
    if act == "relu":
        y = np.maximum(y, 0)
    elif act == "relu6":
        y = np.clip(y, 0, 6)
    return y


def run(x, w, stride, pad, bias=None, res=None, act="none", out_hw=None):
    """ex_conv2d as a depthwise convolution; pad: top/left padding, out_hw: the output size
    (bottom/right padding follows from it)."""
    n, c, h, wd = x.shape
    k = w.shape[2]
    oh, ow = out_hw or ((h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1)
    y = np.full((n, c, oh, ow), np.nan, np.float32)
    p = conv_params(x.shape, y.shape, (k, k), (stride, stride), (pad, pad), (1, 1), c, act, "depthwise")
    rc = lib.ex_conv2d(p, fp(x), fp(w), ffi.NULL if bias is None else fp(bias),
                       ffi.NULL if res is None else fp(res), fp(y))
    assert rc == 0
    return y


HW = [(1, 1), (1, 7), (7, 7), (7, 17), (17, 7), (9, 8), (14, 14), (16, 16), (17, 17), (1, 65), (65, 1), (17, 65),
      (65, 33)]


# every kernel size and padding whose kernel fits the padded input
KPH = [(k, pad, hw) for k in (3, 5) for pad in (0, 1, 2) for hw in HW if min(hw) + 2 * pad >= k]


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k,pad,hw", KPH)
def test_depthwise_matches_reference(k, stride, pad, hw, isa):
    h, w = hw
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    for c, bias, act, res in ((1, False, "none", False), (5, True, "relu6", False), (17, False, "relu", True),
                              (33, True, "none", False)):
        x, wt = rnd(2, c, h, w), rnd(c, 1, k, k)
        b = rnd(c) if bias else None
        r = rnd(2, c, oh, ow) if res else None
        got = run(x, wt, stride, pad, b, r, act)
        want = ref(x, wt, stride, (pad,) * 4, b, r, act)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"c={c} act={act}")


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("hw", [(7, 7), (16, 33), (28, 28), (56, 56), (14, 113)])
def test_depthwise_residual_and_uneven_padding(k, stride, hw, isa):
    """A residual added before the activation; one extra output row and column (padding only at
    the top/left given, the bottom/right implied by the output size, as ONNX "SAME_UPPER" does)."""
    h, w = hw
    c, pad = 3, 1
    oh, ow = (h + 2 * pad - k) // stride + 2, (w + 2 * pad - k) // stride + 2
    x, wt, b, r = rnd(2, c, h, w), rnd(c, 1, k, k), rnd(c), rnd(2, c, oh, ow)
    bottom, right = (oh - 1) * stride + k - h - pad, (ow - 1) * stride + k - w - pad
    for act in ("relu", "relu6", "none"):
        got = run(x, wt, stride, pad, b, r, act, (oh, ow))
        want = ref(x, wt, stride, (pad, pad, bottom, right), b, r, act, (oh, ow))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=act)


@pytest.mark.parametrize("shape", [(1, 1, 130, 129), (1, 2, 224, 224), (2, 3, 57, 200), (1, 17, 66, 70),
                                   (2, 9, 64, 64)])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_large_planes_in_strips(shape, stride, isa, threads):
    """Large planes: few of them are split into strips of rows over the pool, 16 or more go to the
    threads whole."""
    n, c, h, w = shape
    x, wt, b = rnd(n, c, h, w), rnd(c, 1, 3, 3), rnd(c)
    got = run(x, wt, stride, 1, b, act="relu6")
    np.testing.assert_allclose(got, ref(x, wt, stride, (1,) * 4, b, act="relu6"), rtol=1e-5, atol=1e-5)


def test_depthwise_other_activation_and_nan(isa):
    """Activations other than ReLU/ReLU6 run after the row (here SiLU); NaN passes ReLU6 as NumPy's clip."""
    c = 4
    x, wt, b = rnd(1, c, 9, 40), rnd(c, 1, 3, 3), rnd(c)
    y = run(x, wt, 1, 1, b, act="silu")
    z = ref(x, wt, 1, (1,) * 4, b)
    np.testing.assert_allclose(y, z / (1 + np.exp(-z)), rtol=1e-5, atol=1e-5)
    x[0, 1, 4, 20] = np.nan
    y = run(x, wt, 1, 1, b, act="relu6")
    want = ref(x, wt, 1, (1,) * 4, b, act="relu6")
    assert np.array_equal(np.isnan(y), np.isnan(want)) and np.isnan(y).sum() == 9
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hw,k,stride,pad", [((7, 7), 3, 1, 1), ((14, 14), 3, 2, 1), ((15, 13), 5, 2, 2),
                                              ((8, 8), 5, 1, 2), ((3, 5), 3, 1, 0), ((19, 19), 5, 2, 0),
                                              ((14, 14), 3, 1, 1), ((28, 27), 3, 2, 1), ((13, 11), 5, 1, 2),
                                              ((28, 28), 3, 1, 1), ((56, 55), 3, 2, 1), ((59, 57), 5, 2, 2),
                                              ((29, 28), 3, 1, 1)])
def test_depthwise_small_planes_across_channels(hw, k, stride, pad, isa, threads):
    """Small outputs (MobileNetV2's 7 x 7 to 28 x 28 stages), computed across planes: 16 at a time
    on AVX-512 (outputs up to 8 x 8), 8 with AVX2 (up to 28 x 28; 29 x 28 just past it): channel
    counts around 8 and 16, planes of a block spanning two images, SiLU after the row, and NaN
    through ReLU6."""
    h, w = hw
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    for c, act, res in ((16, "relu6", False), (15, "none", True), (17, "relu", True), (960, "silu", False),
                        (7, "relu6", True), (9, "none", False)):
        x, wt, b = rnd(2, c, h, w), rnd(c, 1, k, k), rnd(c)
        r = rnd(2, c, oh, ow) if res else None
        if act == "relu6":
            x[1, 3, h // 2, w // 2] = np.nan
        got = run(x, wt, stride, pad, b, r, act)
        want = ref(x, wt, stride, (pad,) * 4, b, r, "none" if act == "silu" else act)
        if act == "silu":
            want = want / (1 + np.exp(-want))
        assert np.array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"c={c} act={act}")


@pytest.mark.parametrize("k,stride,dilation", [(3, 3, 1), (3, 1, 2), (7, 1, 1), (1, 1, 1)])
def test_depthwise_other_shapes_through_functional(k, stride, dilation, isa):
    """Shapes outside the direct kernel (other strides, dilation, kernel sizes) still run, through
    F.conv2d with groups == channels."""
    c, pad = 6, 2
    x, wt, b = rnd(2, c, 23, 19), rnd(c, 1, k, k), rnd(c)
    got = F.conv2d(ex.asarray(x), ex.asarray(wt), ex.asarray(b), stride=stride, padding=pad, dilation=dilation,
                   groups=c).numpy()
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ek = dilation * (k - 1) + 1
    oh, ow = (23 + 2 * pad - ek) // stride + 1, (19 + 2 * pad - ek) // stride + 1
    want = np.zeros((2, c, oh, ow)) + b[None, :, None, None]
    for i in range(k):
        for j in range(k):
            win = xp[:, :, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                     j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
            want += win * wt[:, 0, i, j][None, :, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_depthwise_bad_shapes_raise():
    x = ex.asarray(rnd(1, 4, 8, 8))
    with pytest.raises(ex.ExpressError):
        F.conv2d(x, ex.asarray(rnd(4, 2, 3, 3)), groups=4)  # weight says 2 input channels per group
    with pytest.raises(ex.ExpressError):
        F.conv2d(x, ex.asarray(rnd(4, 1, 3, 3)), ex.asarray(rnd(3)), groups=4)  # bias for 3 channels
    with pytest.raises(ex.ExpressError):
        F.conv2d(x, ex.asarray(rnd(4, 1, 11, 11)), groups=4)  # kernel larger than the input
    p = conv_params((1, 4, 8, 8), (1, 4, 6, 6), (3, 3), (1, 1), (0, 0), (1, 1), 4, "none", "depthwise")
    p.sh = 0  # a bad stride reaching the C entry point directly is refused, not run
    y = np.empty((1, 4, 6, 6), np.float32)
    a = rnd(1, 4, 8, 8)
    assert lib.ex_conv2d(p, fp(a), fp(a), ffi.NULL, ffi.NULL, fp(y)) == lib.EX_EINVAL


@pytest.mark.parametrize("hw,out", [((7, 7), (1, 1)), ((1, 1), (1, 1)), ((17, 65), (1, 1)), ((9, 5), (4, 1)),
                                    ((9, 5), (2, 3)), ((65, 1), (7, 1))])
def test_adaptive_avg_pool_whole_rows(hw, out, isa):
    """Adaptive average pooling (MobileNet's global pool is the 1x1 case): windows that span whole
    rows are summed as one contiguous run, others row by row; both against NumPy's means."""
    (h, w), (oh, ow) = hw, out
    nc = 33
    x = rnd(nc, h, w)
    y = np.empty((nc, oh, ow), np.float32)
    assert lib.ex_adaptive_pool2d(lib.EX_POOL_AVG, fp(x), fp(y), nc, h, w, oh, ow) == 0
    want = np.empty((nc, oh, ow))
    for i in range(oh):
        for j in range(ow):
            ys, ye = i * h // oh, -(-(i + 1) * h // oh)
            xs, xe = j * w // ow, -(-(j + 1) * w // ow)
            want[:, i, j] = x[:, ys:ye, xs:xe].astype(np.float64).mean(axis=(1, 2))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
