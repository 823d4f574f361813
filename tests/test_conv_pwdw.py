"""The fused 1x1 expansion + depthwise convolution (ex_conv_pwdw) on every kernel variant the CPU
has, against NumPy: 3x3 and 5x5, stride 1 and 2, padding 0..2 and uneven, odd plane sizes, batch 2,
with and without biases, residual and activations, weights pre-packed or not, planes cut into many
row bands (two threads take bands); and the planner forming it only where it may."""
import numpy as np
import pytest

import express as ex
import express.nn.functional as F
from express._lib import ffi, lib
from express.ops.nn import conv_params
from test_depthwise import ref as dw_ref  # the depthwise reference, float64

RNG = np.random.default_rng(11)


def fp(a):
    return ffi.NULL if a is None else ffi.cast("float *", a.__array_interface__["data"][0])


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def act_ref(y, act):
    return np.maximum(y, 0) if act == "relu" else np.clip(y, 0, 6) if act == "relu6" else y


def ref(x, w1, b1, act1, w2, b2, stride, pads, res, act, out_hw):
    """The two convolutions by their definition in float64: the expansion here, the depthwise one
    by test_depthwise's reference (zero padding top, left, bottom, right)."""
    e = np.einsum("nchw,oc->nohw", x.astype(np.float64), w1[:, :, 0, 0].astype(np.float64))
    if b1 is not None:
        e += b1[None, :, None, None]
    return dw_ref(act_ref(e, act1), w2, stride, pads, b2, res, act, out_hw)


def run(x, w1, b1, act1, w2, b2, stride, pad, res, act, out_hw, pack):
    n, c, h, w = x.shape
    e, k = w1.shape[0], w2.shape[2]
    y = np.full((n, e) + out_hw, np.nan, np.float32)
    p1 = conv_params(x.shape, (n, e, h, w), (1, 1), (1, 1), (0, 0), (1, 1), 1, act1, "gemm")
    p2 = conv_params((n, e, h, w), y.shape, (k, k), (stride, stride), (pad, pad), (1, 1), e, act, "depthwise")
    if pack:
        packed = np.empty(lib.ex_conv_packed_size(p1), np.float32)
        assert lib.ex_conv_pack_weights(p1, fp(w1), fp(packed)) == 0
        p1.wpack = fp(packed)
    rc = lib.ex_conv_pwdw(p1, fp(w1), fp(b1), p2, fp(w2), fp(b2), fp(x), fp(res), fp(y))
    assert rc == 0
    return y


# (n, c, e, h, w): one band; many bands of 2 output rows (e * w * stride * 4 bytes past the band
# size), with an odd last band; a plane narrower than a vector; bands of 6 output rows (stride 1:
# a 5 x 5 kernel's 4 rows shared with the band before, which are moved, not computed again)
SHAPES = [(2, 5, 7, 9, 13), (1, 3, 300, 23, 150), (2, 4, 256, 19, 131), (1, 6, 33, 12, 5), (2, 3, 64, 41, 300)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k,stride,pad", [(3, 1, 1), (3, 2, 1), (3, 2, 0), (5, 1, 2), (5, 2, 2), (5, 1, 0)])
def test_pwdw_matches_reference(shape, k, stride, pad, isa, threads):
    n, c, e, h, w = shape
    if min(h, w) + 2 * pad < k:
        pytest.skip("kernel larger than the padded plane")
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    for bias, act1, act, res, pack in ((True, "relu6", "relu6", False, True), (False, "none", "relu", True, False),
                                       (True, "relu", "none", True, True)):
        x, w1, w2 = rnd(n, c, h, w), rnd(e, c, 1, 1), rnd(e, 1, k, k)
        b1, b2 = (rnd(e), rnd(e)) if bias else (None, None)
        r = rnd(n, e, oh, ow) if res else None
        got = run(x, w1, b1, act1, w2, b2, stride, pad, r, act, (oh, ow), pack)
        want = ref(x, w1, b1, act1, w2, b2, stride, (pad,) * 4, r, act, (oh, ow))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{act1} {act} res={res}")


@pytest.mark.parametrize("stride", [1, 2])
def test_pwdw_uneven_padding(stride, isa):
    """One extra output row and column: padding given at the top/left, the bottom/right implied
    by the output size (ONNX "SAME_UPPER")."""
    n, c, e, h, w, k, pad = 1, 3, 200, 17, 160, 3, 1
    oh, ow = (h + 2 * pad - k) // stride + 2, (w + 2 * pad - k) // stride + 2
    x, w1, b1, w2, b2 = rnd(n, c, h, w), rnd(e, c, 1, 1), rnd(e), rnd(e, 1, k, k), rnd(e)
    bottom, right = (oh - 1) * stride + k - h - pad, (ow - 1) * stride + k - w - pad
    got = run(x, w1, b1, "relu6", w2, b2, stride, pad, None, "relu6", (oh, ow), True)
    want = ref(x, w1, b1, "relu6", w2, b2, stride, (pad, pad, bottom, right), None, "relu6", (oh, ow))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_pwdw_bad_shapes_refused():
    x, w1, w2 = rnd(1, 4, 8, 8), rnd(6, 4, 1, 1), rnd(6, 1, 3, 3)
    y = np.empty((1, 6, 8, 8), np.float32)
    p1 = conv_params(x.shape, (1, 6, 8, 8), (1, 1), (1, 1), (0, 0), (1, 1), 1, "none", "gemm")
    p2 = conv_params((1, 6, 8, 8), y.shape, (3, 3), (1, 1), (1, 1), (1, 1), 6, "none", "depthwise")
    p2.c = 5  # the depthwise input is not the expansion's output
    assert lib.ex_conv_pwdw(p1, fp(w1), ffi.NULL, p2, fp(w2), ffi.NULL, fp(x), ffi.NULL, fp(y)) == lib.EX_EINVAL
    p2.c, p1.ph = 6, 1  # a padded 1x1
    assert lib.ex_conv_pwdw(p1, fp(w1), ffi.NULL, p2, fp(w2), ffi.NULL, fp(x), ffi.NULL, fp(y)) == lib.EX_EINVAL


def _block(x, w1, b1, w2, b2, stride):
    e = ex.clip(F.conv2d(x, w1, b1), 0, 6)
    return e, ex.clip(F.conv2d(e, w2, b2, stride=stride, padding=1, groups=w2.shape[0]), 0, 6)


@pytest.mark.parametrize("stride", [1, 2])
def test_planner_fuses_expansion_and_depthwise(stride):
    """A MobileNetV2 block's expansion (1.2 MB expanded) and depthwise run as one conv_pwdw step."""
    c, e, hw = 16, 96, 56
    w1, b1, w2, b2 = rnd(e, c, 1, 1), rnd(e), rnd(e, 1, 3, 3), rnd(e)
    x = rnd(1, c, hw, hw)
    f = ex.compile(lambda t: _block(t, *map(ex.asarray, (w1, b1, w2, b2)), stride)[1])
    got = f(x).numpy()
    plan = next(iter(f.cache.values())).plan
    assert plan.n_steps == 1
    oh = (hw - 1) // stride + 1
    want = ref(x, w1, b1, "relu6", w2, b2, stride, (1,) * 4, None, "relu6", (oh, oh))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_planner_keeps_expansion_others_read():
    """The expanded tensor is also an output, or small: the two convolutions stay apart."""
    c, e, hw = 16, 96, 56
    a = rnd(e, c, 1, 1), rnd(e), rnd(e, 1, 3, 3), rnd(e)
    x = rnd(1, c, hw, hw)
    f = ex.compile(lambda t: _block(t, *map(ex.asarray, a), 2))
    ge, gy = f(x)
    assert next(iter(f.cache.values())).plan.n_steps == 2
    np.testing.assert_allclose(gy.numpy(), ref(x, a[0], a[1], "relu6", a[2], a[3], 2, (1,) * 4, None, "relu6",
                                               (28, 28)), rtol=1e-4, atol=1e-4)
    small = ex.compile(lambda t: _block(t, *map(ex.asarray, a), 2)[1])
    xs = x[:, :, :20, :20]
    np.testing.assert_allclose(small(xs).numpy(), ref(xs, a[0], a[1], "relu6", a[2], a[3], 2, (1,) * 4, None, "relu6",
                                                      (10, 10)), rtol=1e-4, atol=1e-4)
    assert next(iter(small.cache.values())).plan.n_steps == 2
