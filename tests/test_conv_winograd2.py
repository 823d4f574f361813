"""Winograd F(2x2, 3x3) convolution, the planner's choice of it, its packed-weight marker, and the
GEMM micro-kernel's in-register epilogue on partial panels: all against float64 NumPy references,
on every kernel variant the CPU has."""
import numpy as np
import pytest

import express as ex
import express.nn.functional as F
from express._lib import ffi, lib
from express.errors import ShapeError
from express.ops import nn as ops_nn
from express.ops.nn import conv2d_ref

RNG = np.random.default_rng(2)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def act(y, a):
    return np.maximum(y, 0) if a == "relu" else np.clip(y, 0, 6) if a == "relu6" else y


def rel_err(got, want):
    return np.abs(np.asarray(got, np.float64) - want).max() / max(1.0, np.abs(want).max())


def conv_node(x, w, b, r, pads, a, algo):
    ins = [ex.asarray(x), ex.asarray(w)] + [ex.asarray(t) for t in (b, r) if t is not None]
    return ops_nn.node(ops_nn.CONV2D, ins, stride=(1, 1), pads=pads, dilation=(1, 1), groups=1, act=a,
                       has_bias=b is not None, has_res=r is not None, algo=algo)


SHAPES = [  # (n, c, h, w, oc, pads)
    (1, 64, 14, 14, 64, (1, 1, 1, 1)),
    (2, 17, 13, 9, 19, (1, 1, 1, 1)),     # odd plane, channels not a multiple of 8 or 16, batch
    (1, 65, 7, 17, 33, (1, 1, 1, 1)),
    (3, 7, 1, 1, 5, (1, 1, 1, 1)),        # one pixel: a tile mostly padding
    (1, 9, 6, 5, 1, (0, 0, 0, 0)),        # no padding: oh, ow odd-sized 4 x 3
    (2, 24, 12, 11, 17, (2, 0, 1, 2)),    # asymmetric padding
    (1, 3, 29, 31, 65, (1, 1, 1, 1)),     # several tile blocks (over 128 tiles)
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("a", ["none", "relu", "relu6"])
def test_winograd2_matches_direct(shape, a, isa):
    """Constant weights (transformed and packed once), with bias and residual, within 1e-4 relative."""
    n, c, h, w, oc, pads = shape
    x, wt, b = rnd(n, c, h, w), rnd(oc, c, 3, 3), rnd(oc)
    ref = conv2d_ref(x, wt, b, pads=pads)
    r = rnd(*ref.shape)
    assert rel_err(conv_node(x, wt, b, r, pads, a, "winograd2"), act(ref + r, a)) <= 1e-4
    assert rel_err(conv_node(x, wt, None, None, pads, a, "winograd2"), act(conv2d_ref(x, wt, pads=pads), a)) <= 1e-4


def test_winograd2_runtime_weights(threads, isa):
    """Weights that are an input of the compiled function are transformed on every call."""
    x = rnd(2, 20, 14, 14)
    f = ex.compile(lambda t, w: ops_nn.node(ops_nn.CONV2D, [t, w], stride=(1, 1), pads=(1, 1, 1, 1),
                                            dilation=(1, 1), groups=1, act="relu", has_bias=False,
                                            has_res=False, algo="winograd2"))
    for _ in range(2):  # a second call with new weights must not reuse the first transform
        wt = rnd(23, 20, 3, 3)
        assert rel_err(f(x, wt), act(conv2d_ref(x, wt, pads=(1, 1, 1, 1)), "relu")) <= 1e-4


def test_planner_picks_winograd2_for_small_planes(threads, isa):
    small = "winograd2" if isa == "avx512" else "winograd"  # 14x14: F(4x4) suits the 6 x 16 kernels
    assert ops_nn.choose_conv_algo(128, 128, 14, 14, (3, 3), (1, 1), (1, 1), 1) == small
    assert ops_nn.choose_conv_algo(256, 256, 14, 14, (3, 3), (1, 1), (1, 1), 1) == "winograd"  # and 256 channels
    assert ops_nn.choose_conv_algo(256, 256, 11, 11, (3, 3), (1, 1), (1, 1), 1) == "winograd2"
    assert ops_nn.choose_conv_algo(512, 512, 7, 7, (3, 3), (1, 1), (1, 1), 1) == "winograd2"
    assert ops_nn.choose_conv_algo(128, 128, 28, 28, (3, 3), (1, 1), (1, 1), 1) == "winograd"
    assert ops_nn.choose_conv_algo(256, 256, 14, 14, (3, 3), (2, 2), (1, 1), 1) == "gemm"
    assert ops_nn.choose_conv_algo(32, 32, 14, 14, (3, 3), (1, 1), (1, 1), 1) == "gemm"
    # through the public API and the fusion passes (conv + bias + residual + relu in one kernel)
    x, wt, b, r = rnd(1, 70, 14, 14), rnd(66, 70, 3, 3), rnd(66), rnd(1, 66, 14, 14)
    f = ex.compile(lambda t, res: F.relu(F.conv2d(t, ex.asarray(wt), ex.asarray(b), padding=1) + res))
    want = np.maximum(conv2d_ref(x, wt, b, pads=(1, 1, 1, 1)) + r, 0)
    assert rel_err(f(x, r), want) <= 1e-4


def _params(n, c, h, w, oc, algo):
    return ffi.new("ex_conv_params *", dict(n=n, c=c, h=h, w=w, oc=oc, oh=h, ow=w, kh=3, kw=3, sh=1, sw=1,
                                            ph=1, pw=1, dh=1, dw=1, groups=1, act=lib.EX_ACT_NONE, algo=algo))


def _fp(a):
    return ffi.cast("float *", a.ctypes.data)


@pytest.mark.parametrize("run_algo,pack_algo", [("winograd2", "winograd"), ("winograd", "winograd2")])
def test_packed_weights_of_the_other_transform_are_not_taken(run_algo, pack_algo):
    """Each Winograd kernel takes pre-packed weights only when they carry its own mark: given the
    other transform's packed weights it uses its raw transformed weights, and stays right."""
    n, c, h, w, oc = 1, 16, 14, 14, 16
    x, wt = rnd(n, c, h, w), rnd(oc, c, 3, 3)
    other = _params(n, c, h, w, oc, ops_nn._ALGOS[pack_algo])
    packed = np.zeros(lib.ex_conv_packed_size(other), np.float32)
    assert lib.ex_conv_pack_weights(other, _fp(ops_nn.winograd_weights(wt, pack_algo)), _fp(packed)) == 0
    p = _params(n, c, h, w, oc, ops_nn._ALGOS[run_algo])
    p.wpack = _fp(packed)
    u = ops_nn.winograd_weights(wt, run_algo)
    y = np.zeros((n, oc, h, w), np.float32)
    assert lib.ex_conv2d(p, _fp(x), _fp(u), ffi.NULL, ffi.NULL, _fp(y)) == 0
    assert rel_err(y, conv2d_ref(x, wt, pads=(1, 1, 1, 1))) <= 1e-4


def test_winograd2_bad_input():
    x = ex.asarray(rnd(1, 8, 9, 9))
    with pytest.raises(ShapeError, match="Winograd"):  # F(4x4)-transformed weights given to F(2x2)
        ops_nn.node(ops_nn.CONV2D, [x, ex.asarray(rnd(36, 8, 8))], stride=(1, 1), pads=(1, 1, 1, 1),
                    dilation=(1, 1), groups=1, act="none", has_bias=False, has_res=False, algo="winograd2",
                    kernel=(3, 3), wlayout="winograd")
    p = _params(1, 8, 9, 9, 8, lib.EX_CONV_WINOGRAD2)
    p.sh = 2  # not a stride-1 3x3: the kernel refuses
    buf = np.zeros(4096, np.float32)
    assert lib.ex_conv2d(p, _fp(buf), _fp(buf), ffi.NULL, ffi.NULL, _fp(buf)) != 0


@pytest.mark.parametrize("m", [1, 7, 13, 15, 17, 29, 65])
@pytest.mark.parametrize("a", ["none", "relu", "relu6"])
def test_gemm_epilogue_partial_panels(m, a, isa):
    """GEMM rows not a multiple of the micro-kernel's panel, with column bias (linear) or row bias
    (a 1x1 convolution), a residual and an activation applied in registers."""
    k, n = 37, 65
    x, w, b, r = rnd(m, k), rnd(n, k), rnd(n), rnd(m, n)
    y = ops_nn.node(ops_nn.LINEAR, [ex.asarray(t) for t in (x, w, b, r)], act=a, has_bias=True, has_res=True)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b + r
    assert rel_err(y, act(want, a)) <= 1e-5
    xc, wc, bc = rnd(2, k, 9, 7), rnd(m, k, 1, 1), rnd(m)
    ref = conv2d_ref(xc, wc, bc)
    rc = rnd(*ref.shape)
    got = ops_nn.node(ops_nn.CONV2D, [ex.asarray(t) for t in (xc, wc, bc, rc)], stride=(1, 1), pads=(0, 0, 0, 0),
                      dilation=(1, 1), groups=1, act=a, has_bias=True, has_res=True, algo="gemm")
    assert rel_err(got, act(ref + rc, a)) <= 1e-5


@pytest.mark.parametrize("a", ["relu", "relu6"])
def test_gemm_epilogue_keeps_nan(a, isa):
    """ReLU / ReLU6 in the micro-kernel's registers pass NaN through, as NumPy's maximum / clip and
    the epilogue pass after the store do."""
    m, k, n = 29, 37, 65
    x, w, b = rnd(m, k), rnd(n, k), rnd(n)
    x[3, 5] = np.nan  # row 3 of the output is all NaN
    y = np.asarray(ops_nn.node(ops_nn.LINEAR, [ex.asarray(t) for t in (x, w, b)], act=a, has_bias=True,
                                 has_res=False))
    want = act(x.astype(np.float64) @ w.T.astype(np.float64) + b, a)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    assert np.isnan(want[3]).all()
    ok = ~np.isnan(want)
    assert rel_err(y[ok], want[ok]) <= 1e-5
