"""express.nn.functional convolution, pooling, norms, attention, interpolate, pad and the layers,
against independent NumPy references (float64), on every kernel variant the CPU has."""
import numpy as np
import pytest

import express as ex
import express.nn as nn
import express.nn.functional as F
from express.ops.nn import conv2d_ref

RNG = np.random.default_rng(0)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def close(got, want, rtol=1e-4, atol=1e-4):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- conv2d
CONV_CASES = [  # (n, c, h, w, oc, k, stride, padding, dilation, groups)
    (1, 3, 7, 7, 5, 3, 1, 1, 1, 1),
    (2, 4, 17, 9, 6, 3, 2, 1, 1, 1),
    (1, 6, 9, 11, 4, 1, 1, 0, 1, 1),      # 1x1 as a GEMM
    (1, 6, 9, 11, 4, 1, 2, 0, 1, 1),      # strided 1x1
    (1, 4, 13, 13, 8, 3, 1, 2, 2, 2),     # dilation, groups
    (1, 8, 12, 10, 8, 3, 1, 1, 1, 8),     # depthwise 3x3 s1
    (2, 7, 17, 17, 7, 3, 2, 1, 1, 7),     # depthwise 3x3 s2
    (1, 5, 11, 9, 5, 5, 1, 2, 1, 5),      # depthwise 5x5
    (1, 5, 12, 12, 5, 5, 2, 2, 1, 5),     # depthwise 5x5 s2
    (1, 3, 20, 20, 16, 7, 2, 3, 1, 1),    # stem-like 7x7 s2
    (1, 1, 1, 1, 1, 1, 1, 0, 1, 1),
    (1, 2, 5, 4, 3, (2, 3), (1, 2), (1, 0), 1, 1),  # rectangular
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(case, isa):
    n, c, h, w, oc, k, s, p, d, g = case
    k = (k, k) if isinstance(k, int) else k
    x, wt, b = rnd(n, c, h, w), rnd(oc, c // g, *k), rnd(oc)
    y = F.conv2d(x, wt, b, stride=s, padding=p, dilation=d, groups=g)
    ss, pp, dd = (F._pair("", v) for v in (s, p, d))
    close(y, conv2d_ref(x, wt, b, ss, pp + pp, dd, g))


@pytest.mark.parametrize("algo", ["gemm", "winograd"])
@pytest.mark.parametrize("shape", [(1, 16, 8, 8, 16), (2, 17, 13, 9, 19), (1, 32, 30, 30, 24)])
def test_conv2d_algorithms_agree(algo, shape, isa):
    """Every algorithm against the direct definition (Winograd within 1e-4 relative)."""
    from express.ops import nn as ops_nn
    n, c, h, w, oc = shape
    x, wt, b, r = rnd(n, c, h, w), rnd(oc, c, 3, 3), rnd(oc), rnd(n, oc, h, w)
    want = conv2d_ref(x, wt, b, pads=(1, 1, 1, 1))
    node = ops_nn.node(ops_nn.CONV2D, [ex.asarray(x), ex.asarray(wt), ex.asarray(b), ex.asarray(r)], stride=(1, 1),
                       pads=(1, 1, 1, 1), dilation=(1, 1), groups=1, act="relu", has_bias=True, has_res=True,
                       algo=algo)
    got = np.asarray(node, np.float64)
    want = np.maximum(want + r, 0)
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_conv2d_padding_forms_and_errors():
    x, w = rnd(1, 2, 6, 6), rnd(3, 2, 3, 3)
    close(F.conv2d(x, w, padding="same"), conv2d_ref(x, w, pads=(1, 1, 1, 1)))
    close(F.conv2d(x, w, padding="valid"), conv2d_ref(x, w))
    close(F.conv2d(x, w, padding=(0, 1, 2, 1)), conv2d_ref(x, w, pads=(0, 1, 2, 1)))
    with pytest.raises(ex.ShapeError, match="conv2d"):
        F.conv2d(x, rnd(3, 3, 3, 3))
    with pytest.raises(ex.ShapeError, match="too small"):
        F.conv2d(rnd(1, 2, 2, 2), w)
    with pytest.raises(ex.ShapeError, match="groups"):
        F.conv2d(x, w, groups=2)


@pytest.mark.parametrize("case", [(1, 4, 5, 5, 3, 3, 2, 1, 1, 1, 1), (2, 4, 4, 6, 6, 2, 2, 0, 0, 1, 2),
                                  (1, 3, 7, 7, 2, 3, 1, 1, 0, 2, 1), (1, 2, 3, 3, 4, 4, 3, 1, 2, 1, 2)])
def test_conv_transpose2d(case, isa):
    import torch
    n, c, h, w, oc, k, s, p, op, d, g = case
    x, wt, b = rnd(n, c, h, w), rnd(c, oc // g, k, k), rnd(oc)
    y = F.conv_transpose2d(x, wt, b, stride=s, padding=p, output_padding=op, groups=g, dilation=d)
    want = torch.nn.functional.conv_transpose2d(torch.from_numpy(x).double(), torch.from_numpy(wt).double(),
                                                torch.from_numpy(b).double(), s, p, op, g, d).numpy()
    close(y, want)


# ---------------------------------------------------------------- pooling
@pytest.mark.parametrize("args", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2),
                                  dict(kernel_size=3, stride=2, ceil_mode=True), dict(kernel_size=(2, 3), stride=1)])
def test_pools(args, isa):
    import torch
    x = rnd(2, 3, 9, 11)
    tx = torch.from_numpy(x).double()
    close(F.max_pool2d(x, **args), torch.nn.functional.max_pool2d(tx, **args).numpy())
    close(F.avg_pool2d(x, **args), torch.nn.functional.avg_pool2d(tx, **args).numpy())
    close(F.avg_pool2d(x, count_include_pad=False, **args),
          torch.nn.functional.avg_pool2d(tx, count_include_pad=False, **args).numpy())


def _window_fits(hw, k, p, d):
    dh, dw = (d, d) if isinstance(d, int) else d
    return hw[0] + 2 * p >= (k - 1) * dh + 1 and hw[1] + 2 * p >= (k - 1) * dw + 1


POOL_S2 = [(hw, *a) for hw in [(1, 1), (2, 3), (7, 7), (8, 17), (17, 8), (33, 20), (112, 112)]
           for a in [(3, 2, 1, False, 1), (3, 2, 0, True, 1), (2, 2, 0, False, 1), (5, 2, 2, False, 1),
                     (3, (1, 2), 1, False, 1), (3, 2, 1, False, (2, 1))]  # k, stride, padding, ceil_mode, dilation
           if _window_fits(hw, a[0], a[2], a[4])]


@pytest.mark.parametrize("hw,k,s,p,ceil,d", POOL_S2)
def test_max_pool_stride2_columns(hw, k, s, p, ceil, d, isa):
    """The max pool that reads its rows straight from the input (column stride 2), NaN included."""
    import torch
    x = rnd(2, 3, *hw)
    x[0, 1].flat[::5] = np.nan  # NaN wins its windows, as in PyTorch
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x), k, s, p, dilation=d, ceil_mode=ceil).numpy()
    got = np.asarray(F.max_pool2d(x, k, s, p, dilation=d, ceil_mode=ceil))
    np.testing.assert_array_equal(got, want)


def test_max_pool_dilation_and_adaptive(isa):
    import torch
    x = rnd(1, 2, 13, 10)
    tx = torch.from_numpy(x).double()
    close(F.max_pool2d(x, 3, 1, 1, dilation=2), torch.nn.functional.max_pool2d(tx, 3, 1, 1, dilation=2).numpy())
    for o in [1, (3, 4), (5, 7), (13, 10)]:
        close(F.adaptive_avg_pool2d(x, o), torch.nn.functional.adaptive_avg_pool2d(tx, o).numpy())
        close(F.adaptive_max_pool2d(x, o), torch.nn.functional.adaptive_max_pool2d(tx, o).numpy())
    with pytest.raises(ex.ShapeError, match="max_pool2d"):
        F.max_pool2d(rnd(2, 3, 4), 2)


# ---------------------------------------------------------------- norms
@pytest.mark.parametrize("n", [1, 7, 65, 4099])
def test_layer_and_rms_norm(n, isa):
    x, w, b = rnd(3, n) * 3 + 1, rnd(n), rnd(n)
    x64 = x.astype(np.float64)
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    close(F.layer_norm(x, n, w, b), (x64 - mu) / np.sqrt(var + 1e-5) * w + b)
    close(F.layer_norm(x, (n,)), (x64 - mu) / np.sqrt(var + 1e-5))
    close(F.rms_norm(x, w, eps=1e-6), x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w)
    close(F.rms_norm(x), x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6))


def test_layer_norm_multi_axis_and_dtypes():
    x = rnd(2, 3, 4, 5)
    x64 = x.astype(np.float64).reshape(2, 3, 20)
    want = ((x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    close(F.layer_norm(x, (4, 5)), want)
    y = F.layer_norm(ex.asarray(x).astype(ex.float16), (4, 5))
    assert y.dtype == ex.float16
    close(y, want, rtol=1e-2, atol=1e-2)
    with pytest.raises(ex.ShapeError, match="layer_norm"):
        F.layer_norm(x, (4, 4))


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 7), 3), ((1, 4, 3), 4), ((1, 8, 64, 65), 2)])
def test_group_norm(shape, groups, isa):
    x, w, b = rnd(*shape) + 2, rnd(shape[1]), rnd(shape[1])
    g = x.astype(np.float64).reshape(shape[0], groups, -1)
    y = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(shape)
    cs = (1, shape[1]) + (1,) * (len(shape) - 2)
    close(F.group_norm(x, groups, w, b), y * w.reshape(cs) + b.reshape(cs))
    with pytest.raises(ex.ShapeError, match="group_norm"):
        F.group_norm(x, 5)


def test_batch_norm(isa):
    x, m, v, w, b = rnd(2, 5, 4, 3), rnd(5), np.abs(rnd(5)) + 0.1, rnd(5), rnd(5)
    cs = (1, 5, 1, 1)
    want = (x - m.reshape(cs)) / np.sqrt(v.reshape(cs).astype(np.float64) + 1e-3) * w.reshape(cs) + b.reshape(cs)
    close(F.batch_norm(x, m, v, w, b, eps=1e-3), want)
    with pytest.raises(ex.ShapeError, match="batch_norm"):
        F.batch_norm(x, m[:4], v)


# ---------------------------------------------------------------- attention
def attn_ref(q, k, v, mask=None, causal=False, scale=None):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if mask is not None:
        s = s + (np.where(mask, 0, -np.inf) if mask.dtype == bool else mask)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ v


@pytest.mark.parametrize("b,hq,hk,lq,lk,d,dv", [(1, 2, 2, 5, 5, 8, 8), (2, 4, 2, 17, 17, 16, 12),
                                                (1, 8, 2, 1, 70, 64, 64), (1, 1, 1, 130, 70, 7, 5)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention(b, hq, hk, lq, lk, d, dv, causal, isa):
    q, k, v = rnd(b, hq, lq, d), rnd(b, hk, lk, d), rnd(b, hk, lk, dv)
    close(F.scaled_dot_product_attention(q, k, v, is_causal=causal), attn_ref(q, k, v, causal=causal))


def test_attention_masks_views_and_3d(isa):
    q, k, v = rnd(2, 3, 9, 8), rnd(2, 3, 11, 8), rnd(2, 3, 11, 8)
    add = rnd(1, 1, 9, 11)
    close(F.scaled_dot_product_attention(q, k, v, mask=add, scale=0.3), attn_ref(q, k, v, add, scale=0.3))
    keep = RNG.random((9, 11)) > 0.3
    keep[:, 0] = True
    close(F.scaled_dot_product_attention(q, k, v, mask=keep), attn_ref(q, k, v, keep))
    # (B, L, H, D) storage seen as (B, H, L, D): a strided view, no copy needed by the kernel
    qs = ex.asarray(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).permute_dims((0, 2, 1, 3))
    close(F.scaled_dot_product_attention(qs, k, v), attn_ref(q, k, v))
    close(F.scaled_dot_product_attention(q[0], k[0], v[0]), attn_ref(q[0], k[0], v[0]))
    with pytest.raises(ex.ShapeError, match="scaled_dot_product_attention"):
        F.scaled_dot_product_attention(q, rnd(2, 2, 11, 8), v)


# ---------------------------------------------------------------- interpolate, pad
@pytest.mark.parametrize("kw", [dict(size=(7, 5), mode="nearest"), dict(scale_factor=2, mode="nearest"),
                                dict(size=(9, 4), mode="bilinear"), dict(scale_factor=2, mode="bilinear"),
                                dict(size=(9, 13), mode="bilinear", align_corners=True),
                                dict(scale_factor=0.5, mode="bilinear")])
def test_interpolate(kw, isa):
    import torch
    x = rnd(2, 3, 6, 8)
    close(F.interpolate(x, **kw), torch.nn.functional.interpolate(torch.from_numpy(x).double(), **kw).numpy())


@pytest.mark.parametrize("pad,mode", [((1, 2), "constant"), ((1, 2, 3, 0), "reflect"), ((2, 2, 1, 1), "replicate"),
                                      ((0, 1, 2, 3, 1, 1), "constant"), ((3, 3, 2, 2), "reflect")])
def test_pad(pad, mode):
    x = rnd(2, 3, 5, 6)
    np_pad = [(0, 0)] * 4
    for i in range(len(pad) // 2):
        np_pad[3 - i] = (pad[2 * i], pad[2 * i + 1])
    want = np.pad(x, np_pad, mode={"replicate": "edge"}.get(mode, mode), **({"constant_values": 1.5}
                                                                          if mode == "constant" else {}))
    close(F.pad(x, pad, mode, value=1.5), want)
    xi = ex.asarray(np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(F.pad(xi, (1, 1), value=-1).numpy(), np.pad(np.arange(12).reshape(3, 4),
                                                                               ((0, 0), (1, 1)), constant_values=-1))
    with pytest.raises(ex.ShapeError, match="pad"):
        F.pad(x, (6, 0), "reflect")


# ---------------------------------------------------------------- linear
@pytest.mark.parametrize("m", [1, 3, 7, 16, 17, 65])
@pytest.mark.parametrize("wdt", ["float32", "float16", "bfloat16"])
def test_linear(m, wdt, isa):
    import ml_dtypes
    k, n = 67, 33
    x, w, b = rnd(m, k), rnd(n, k), rnd(n)
    wq = w.astype(ml_dtypes.bfloat16 if wdt == "bfloat16" else wdt)
    y = F.linear(x, ex.asarray(wq), b)
    assert y.dtype == ex.float32
    close(y, x.astype(np.float64) @ wq.astype(np.float64).T + b, rtol=1e-4, atol=1e-3)


def test_linear_batched_and_relu6():
    x, w = rnd(2, 3, 5), rnd(4, 5)
    close(F.linear(x, w), x.astype(np.float64) @ w.T)
    close(F.relu6(ex.asarray(np.array([-1, 3, 7], np.float32))), [0, 3, 6])


# ---------------------------------------------------------------- layers
def test_layers_match_torch():
    import torch
    tm = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
                             torch.nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False), torch.nn.BatchNorm2d(8),
                             torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1), torch.nn.ConvTranspose2d(8, 4, 2, 2),
                             torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                             torch.nn.Dropout(0.5), torch.nn.Linear(4, 3)).eval()
    with torch.no_grad():
        for mod in tm:
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.normal_()
                mod.running_var.uniform_(0.5, 2)
                mod.weight.normal_()
                mod.bias.normal_()
    em = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU6(),
                       nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                       nn.MaxPool2d(3, 2, 1), nn.ConvTranspose2d(8, 4, 2, 2), nn.AvgPool2d(2),
                       nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(4, 3))
    em.load_weights({k: v.numpy() for k, v in tm.state_dict().items()})
    x = rnd(2, 3, 16, 16)
    with torch.no_grad():
        want = tm(torch.from_numpy(x)).numpy()
    close(em(ex.asarray(x)), want, rtol=1e-4, atol=1e-4)
    close(ex.compile(lambda t: em(t))(x), want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- fusion
def test_fusion_conv_bn_add_relu_is_one_kernel():
    """conv -> batch norm -> + skip -> relu runs as one conv kernel (folded BN, residual, ReLU epilogue)."""
    from express.plan import Plan
    import torch
    x, w = rnd(1, 16, 10, 10), rnd(16, 16, 3, 3)
    m, v, g, b = rnd(16), np.abs(rnd(16)) + 0.5, rnd(16), rnd(16)
    cw, cb = ex.asarray(w), ex.asarray(rnd(16))
    tx = ex.asarray(x)

    def block(t):
        y = F.batch_norm(F.conv2d(t, cw, cb, padding=1), ex.asarray(m), ex.asarray(v), ex.asarray(g), ex.asarray(b))
        return F.relu(y + t)
    out = block(tx)
    plan = Plan([out])
    assert plan.n_steps == 1
    tt = torch.from_numpy(x).double()
    want = torch.relu(torch.nn.functional.batch_norm(
        torch.nn.functional.conv2d(tt, torch.from_numpy(w).double(), torch.from_numpy(cb.numpy()).double(), padding=1),
        torch.from_numpy(m).double(), torch.from_numpy(v).double(), torch.from_numpy(g).double(),
        torch.from_numpy(b).double()) + tt).numpy()
    close(plan.run()[0], want)
    close(ex.compile(block)(x), want)


def test_conv_output_takes_over_dying_residual(threads):
    """A 1x1 convolution's output is written over its residual's buffer when nothing reads the
    residual after it: one buffer for both.  Not when a later step reads the residual, nor when
    the residual is the convolution's own input (read while the output is written).  Each graph
    against NumPy."""
    from express.plan import Plan
    x, wa, wb, wc, wd = rnd(1, 8, 20, 20), rnd(16, 8, 1, 1), rnd(16, 8, 1, 1), rnd(4, 16, 1, 1), rnd(16, 16, 1, 1)
    tx, plane = ex.asarray(x), 16 * 20 * 20 * 4
    ra, rb = conv2d_ref(x, wa), conv2d_ref(x, wb)
    r = F.conv2d(tx, wa)
    z = F.conv2d(F.relu(F.conv2d(tx, wb) + r), wc)  # r dies in the residual convolution
    plan = Plan([z])
    assert plan.arena_bytes == plane
    close(plan.run()[0], conv2d_ref(np.maximum(rb + ra, 0), wc))
    r = F.conv2d(tx, wa)
    z = F.conv2d(F.relu(F.conv2d(tx, wb) + r) + r, wc)  # r read again after it
    plan = Plan([z])
    assert plan.arena_bytes == 2 * plane
    close(plan.run()[0], conv2d_ref(np.maximum(rb + ra, 0) + ra, wc))
    r = F.conv2d(tx, wa)
    z = F.conv2d(F.conv2d(r, wd) + r, wc)  # the residual is also the input
    close(z, conv2d_ref(conv2d_ref(ra, wd) + ra, wc))


def test_fusion_keeps_shared_producers():
    """A conv output that is also returned is not absorbed into its consumer."""
    x, w = rnd(1, 4, 6, 6), rnd(4, 4, 1, 1)
    y = F.conv2d(x, w)
    z = F.relu6(y)
    ex.eval(y, z)
    want = conv2d_ref(x, w)
    close(y, want)
    close(z, np.clip(want, 0, 6))


def test_fusion_linear_epilogues():
    x, w, b, r = rnd(5, 8), rnd(6, 8), rnd(6), rnd(5, 6)
    y = F.silu(F.linear(x, w, b) + ex.asarray(r))
    z = x.astype(np.float64) @ w.T + b + r
    close(y, z / (1 + np.exp(-z)))
    gx = rnd(2, 4, 3, 3)
    gn = F.gelu(F.group_norm(gx, 2))
    g = gx.astype(np.float64).reshape(2, 2, -1)
    gz = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(gx.shape)
    from express.ops.elementwise import _gelu
    close(gn, _gelu(gz))


def test_folded_weights_outlive_the_graph():
    """Weights made by the fusion pass (folded batch norm, Winograd, packed) stay alive with the plan."""
    import gc
    x = rnd(1, 16, 20, 20)
    w1, w2 = rnd(16, 16, 3, 3), rnd(8, 16, 1, 1)
    m, v = rnd(16), np.abs(rnd(16)) + 0.5

    def net(t):
        y = F.relu(F.batch_norm(F.conv2d(t, w1, padding=1), m, v))
        return F.conv2d(F.max_pool2d(y, 2), w2)
    f = ex.compile(net)
    f(x)
    gc.collect()
    junk = [np.full((64, 1024), 7.0, np.float32) for _ in range(64)]  # reuse any freed memory
    y = conv2d_ref(x, w1, pads=(1, 1, 1, 1))
    y = np.maximum((y - m[None, :, None, None]) / np.sqrt(v[None, :, None, None] + 1e-5), 0)
    y = y.reshape(1, 16, 10, 2, 10, 2).max(axis=(3, 5))
    close(f(x), conv2d_ref(y, w2))
    del junk


def test_winograd_weights_cached_per_weight_tensor():
    """A constant weight tensor used by several evaluations is transformed once and stays right."""
    x, w = rnd(1, 16, 32, 32), ex.asarray(rnd(16, 16, 3, 3))
    want = conv2d_ref(x, w.numpy(), pads=(1, 1, 1, 1))
    for _ in range(2):  # Winograd's error: 1e-4 of the output's magnitude (elementwise, near-zero outputs fail)
        close(F.conv2d(x, w, padding=1), want, rtol=0, atol=1e-4 * np.abs(want).max())
