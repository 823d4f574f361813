"""Neural-network kernels: linear (fused epilogue, f16/bf16 weights), conv2d, conv_transpose2d,
pooling, interpolate, pad, layer/rms/group/batch norm and fused attention.

Each op is one `defop(kind="kernel")` over float32 NCHW / row-major data; the public wrappers in
`express.nn.functional` cast around them. Ops with an epilogue carry an `act` attribute (one of
`ACTS`) and optional bias/residual inputs: the fusion pass (express/fusion.py) folds a following
activation, residual add or batch norm into them. `conv_algo` is the planner's choice of
convolution algorithm."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from .._lib import KernelCall, check, ffi, lib, ptr
from ..errors import DTypeError, ShapeError
from ..io import packed_buffer
from ..tensor import node
from .registry import defop

ACTS = {"none": lib.EX_ACT_NONE, "relu": lib.EX_ACT_RELU, "relu6": lib.EX_ACT_RELU6,
        "silu": lib.EX_ACT_SILU, "gelu": lib.EX_ACT_GELU, "gelu_tanh": lib.EX_ACT_GELU_TANH,
        "sigmoid": lib.EX_ACT_SIGMOID}
_ALGOS = {"auto": lib.EX_CONV_AUTO, "gemm": lib.EX_CONV_GEMM, "depthwise": lib.EX_CONV_DEPTHWISE,
          "winograd": lib.EX_CONV_WINOGRAD, "winograd2": lib.EX_CONV_WINOGRAD2}
WINOGRAD_POINTS = {"winograd": 36, "winograd2": 16}  # transform points: F(4x4, 3x3), F(2x2, 3x3)


def _weight_buffer(n: int) -> np.ndarray:
    """n floats for weights packed once and read on every run, in 2 MB pages: a layer's packed
    weights stream from memory, and the hardware prefetcher stops at every 4 KB page (a 512-channel
    F(2x2) layer at 7 x 7, 16 MB of weights, 8-10% faster at one thread)."""
    return packed_buffer(4 * n).view(np.float32)


def _fp(a):
    return ffi.cast("float *", ptr(a))


def _keeps(prepare):
    """The kernel holds raw pointers: keep its arrays alive as long as the prepared call (graph
    passes create constants, e.g. folded weights, that nothing else references)."""
    def wrapped(out, ins, **attrs):
        f = prepare(out, ins, **attrs)
        f.arrays = (out, tuple(ins))
        return f
    wrapped.__name__ = prepare.__name__
    return wrapped


def _fp_opt(a):
    return ffi.NULL if a is None else _fp(a)


def _act_ref(y, act):
    y = np.asarray(y, np.float64)
    if act == "relu":
        return np.maximum(y, 0)
    if act == "relu6":
        return np.clip(y, 0, 6)
    if act == "silu":
        return y / (1 + np.exp(-y))
    if act == "sigmoid":
        return 1 / (1 + np.exp(-y))
    if act == "gelu":
        from .elementwise import _gelu
        return _gelu(y)
    if act == "gelu_tanh":
        from .elementwise import _gelu_tanh
        return _gelu_tanh(y)
    return y


def _need_f32(name, *ts):
    for t in ts:
        if t is not None and t.dtype is not dt.float32:
            raise DTypeError(f"{name}: kernel takes float32, got {t.dtype.name}")


def _split_opt(ins, has_bias, has_res=False):
    """(x, w, bias or None, res or None) from a kernel's input list."""
    it = iter(ins[2:])
    return ins[0], ins[1], next(it) if has_bias else None, next(it) if has_res else None


# ---------------------------------------------------------------- linear
def _linear_infer(x, w, *rest, act, has_bias, has_res):
    _need_f32("linear", x, *rest)
    if w.dtype not in (dt.float32, dt.float16, dt.bfloat16):
        raise DTypeError(f"linear: weight must be float32/float16/bfloat16, got {w.dtype.name}")
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ShapeError(f"linear: input {x.shape} does not match weight {w.shape} (out, in)")
    out = x.shape[:-1] + (w.shape[0],)
    _, _, b, r = _split_opt((x, w) + rest, has_bias, has_res)
    if b is not None and b.shape != (w.shape[0],):
        raise ShapeError(f"linear: bias {b.shape} does not match {w.shape[0]} outputs")
    if r is not None and r.shape != out:
        raise ShapeError(f"linear: residual {r.shape} does not match output {out}")
    return out, dt.float32


def _linear_ref(x, w, *rest, act, has_bias, has_res):
    _, _, b, r = _split_opt((x, w) + rest, has_bias, has_res)
    y = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    if b is not None:
        y = y + b
    if r is not None:
        y = y + r
    return _act_ref(y, act)


def _linear_prepare(out, ins, act, has_bias, has_res):
    x, w, b, r = _split_opt(ins, has_bias, has_res)
    n, k = w.shape
    m = out.size // n if n else 0
    args = (_fp(x), ffi.cast("void *", ptr(w)), dt.from_numpy(w.dtype).code, _fp_opt(b), _fp_opt(r), _fp(out),
            m, n, k, ACTS[act])
    return KernelCall("linear", args, "linear")


LINEAR = defop("linear", "kernel", _linear_infer, _linear_ref, prepare=_keeps(_linear_prepare),
               contiguous=(0, 1, 2, 3))


def linear(x, w, bias=None, act="none"):
    return node(LINEAR, [x, w] + ([bias] if bias is not None else []), act=act, has_bias=bias is not None,
                has_res=False)


# ---------------------------------------------------------------- conv2d
def conv_out(size, k, s, p0, p1, d):
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


def choose_conv_algo(c, oc, oh, ow, kernel, stride, dilation, groups):
    """The planner's convolution algorithm for a shape: depthwise direct for one channel per group;
    for 3x3 stride-1 convolutions Winograd F(4x4, 3x3) with enough channels and area, F(2x2, 3x3) on
    small planes (7x7 to 26x26, where F(4x4)'s tiles waste much of their area and leave its GEMMs
    few columns) with many channels, for the kernel variant in use; else (im2col +) GEMM."""
    if groups == c == oc and c > 1:
        return "depthwise"
    if kernel != (3, 3) or stride != (1, 1) or dilation != (1, 1) or groups != 1:
        return "gemm"
    tiles = -(-oh // 4) * -(-ow // 4)  # F(4x4, 3x3) output tiles: its 36 GEMMs have N = tiles
    if c >= 16 and oc >= 16 and tiles >= 48:
        return "winograd"
    if c >= 64 and oc >= 64 and 7 <= oh <= 26 and 7 <= ow <= 26:
        # F(2x2)'s transposed GEMMs suit the AVX-512 kernel's 14-row panels; the narrower AVX2 and
        # portable kernels (6 x 16) run F(4x4)'s 16-column GEMMs well from 12 x 12 up, and so does
        # the AVX-512 kernel from 256 channels (on Zen 4, 256 -> 256 at 14 x 14: 1.11 -> 0.93 ms at
        # one thread, 0.60 -> 0.49 at two; 128 -> 128: 0.33 -> 0.30 at one, but 0.21 -> 0.24 at two)
        wide = tiles >= 16 and min(c, oc) >= 256
        return "winograd2" if (lib.ex_isa() == lib.EX_ISA_AVX512 and not wide) or min(oh, ow) < 12 else "winograd"
    return "gemm"


def _conv_infer(x, w, *rest, stride, pads, dilation, groups, act, has_bias, has_res, algo="auto",
                kernel=None, wlayout="oihw", prepack=False):
    _need_f32("conv2d", x, w, *rest)
    if x.ndim != 4:
        raise ShapeError(f"conv2d: input must be NCHW (4-D), got shape {x.shape}")
    if wlayout == "winograd":
        if algo not in WINOGRAD_POINTS or w.ndim != 3 or w.shape[0] != WINOGRAD_POINTS[algo]:
            raise ShapeError(f"conv2d: transformed Winograd weight {w.shape} does not match algo={algo!r}")
        oc, cg, (kh, kw) = w.shape[1], w.shape[2], kernel
    else:
        if w.ndim != 4:
            raise ShapeError(f"conv2d: weight must be (out, in/groups, kh, kw), got shape {w.shape}")
        oc, cg, kh, kw = w.shape
    n, c, h, wd = x.shape
    if groups < 1 or c % groups or oc % groups or c // groups != cg:
        raise ShapeError(f"conv2d: input {x.shape} with weight {w.shape} and groups={groups}: "
                         f"channels {c} / groups must equal weight's {cg} and divide out channels {oc}")
    oh = conv_out(h, kh, stride[0], pads[0], pads[2], dilation[0])
    ow = conv_out(wd, kw, stride[1], pads[1], pads[3], dilation[1])
    if oh < 1 or ow < 1:
        raise ShapeError(f"conv2d: input {x.shape} is too small for kernel {(kh, kw)} with padding {pads}, "
                         f"dilation {dilation}, stride {stride}")
    _, _, b, r = _split_opt((x, w) + rest, has_bias, has_res)
    if b is not None and b.shape != (oc,):
        raise ShapeError(f"conv2d: bias {b.shape} does not match {oc} output channels")
    if r is not None and r.shape != (n, oc, oh, ow):
        raise ShapeError(f"conv2d: residual {r.shape} does not match output {(n, oc, oh, ow)}")
    return (n, oc, oh, ow), dt.float32


def conv2d_ref(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """Direct convolution in float64 (the definition)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = conv_out(h, kh, stride[0], pads[0], pads[2], dilation[0])
    ow = conv_out(wd, kw, stride[1], pads[1], pads[3], dilation[1])
    y = np.zeros((n, oc, oh, ow))
    ocg = oc // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dilation[0]: i * dilation[0] + stride[0] * (oh - 1) + 1: stride[0],
                           j * dilation[1]: j * dilation[1] + stride[1] * (ow - 1) + 1: stride[1]]
                y[:, g * ocg:(g + 1) * ocg] += np.einsum("nchw,oc->nohw", patch, w[g * ocg:(g + 1) * ocg, :, i, j])
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None]
    return y


def _conv_ref(x, w, *rest, stride, pads, dilation, groups, act, has_bias, has_res, algo="auto", kernel=None,
              wlayout="oihw", prepack=False):
    if wlayout != "oihw":
        raise ValueError("conv2d reference: takes weights in (out, in, kh, kw) layout")
    _, _, b, r = _split_opt((x, w) + rest, has_bias, has_res)
    y = conv2d_ref(x, w, b, stride, pads, dilation, groups)
    return _act_ref(y if r is None else y + r, act)


def conv_params(x_shape, out_shape, kernel, stride, pads, dilation, groups, act, algo):
    n, c, h, w = x_shape
    return ffi.new("ex_conv_params *", dict(
        n=n, c=c, h=h, w=w, oc=out_shape[1], oh=out_shape[2], ow=out_shape[3], kh=kernel[0], kw=kernel[1],
        sh=stride[0], sw=stride[1], ph=pads[0], pw=pads[1], dh=dilation[0], dw=dilation[1], groups=groups,
        act=ACTS[act], algo=_ALGOS[algo]))


_G2 = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])  # F(2x2, 3x3) weight transform


def winograd_weights(w: np.ndarray, algo: str = "winograd") -> np.ndarray:
    """(oc, ic, 3, 3) float32 weights transformed for F(4x4, 3x3): shape (36, oc, ic); or, with
    algo="winograd2", for F(2x2, 3x3): G w G^T, shape (16, oc, ic)."""
    w = np.ascontiguousarray(w, np.float32)
    oc, ic = w.shape[:2]
    if algo == "winograd2":
        u = np.einsum("ai,ocij,bj->aboc", _G2, w.astype(np.float64), _G2)
        return np.ascontiguousarray(u.reshape(16, oc, ic), np.float32)
    u = np.empty((36, oc, ic), np.float32)
    check(lib.ex_winograd_weights(_fp(w), _fp(u), oc, ic), "winograd_weights")
    return u


def _conv_prepare(out, ins, stride, pads, dilation, groups, act, has_bias, has_res, algo="auto", kernel=None,
                  wlayout="oihw", prepack=False):
    x, w, b, r = _split_opt(ins, has_bias, has_res)
    kernel = kernel or w.shape[2:]
    if algo == "auto":
        algo = choose_conv_algo(x.shape[1], out.shape[1], out.shape[2], out.shape[3], tuple(kernel), stride,
                                dilation, groups)
    keep = [w]
    runtime_wino = algo in WINOGRAD_POINTS and wlayout != "winograd"
    if runtime_wino:  # weights computed at run time: transform each run
        u = np.empty((WINOGRAD_POINTS[algo],) + w.shape[:2], np.float32)
        keep.append(u)
    p = conv_params(x.shape, out.shape, kernel, stride, pads, dilation, groups, act, algo)
    if prepack and (algo == "gemm" or (algo in WINOGRAD_POINTS and not runtime_wino)):
        # constant weights (or transformed Winograd weights): packed once for the GEMM micro-kernel
        packed = _weight_buffer(lib.ex_conv_packed_size(p))
        check(lib.ex_conv_pack_weights(p, _fp(w), _fp(packed)), "conv2d")
        keep.append(packed)
        p.wpack = _fp(packed)
    args = (p, _fp(x), _fp(keep[1] if runtime_wino else w), _fp_opt(b), _fp_opt(r), _fp(out))
    call = KernelCall("conv2d", args, "conv2d", keep=keep)
    if not runtime_wino:
        return call
    wargs = (_fp(w), _fp(keep[1]), w.shape[0], w.shape[1])

    def run():
        if algo == "winograd2":
            np.copyto(keep[1], winograd_weights(keep[0], algo))
        else:
            check(lib.ex_winograd_weights(*wargs), "conv2d")
        call()
    return run


def _conv_overwrites(ins, stride, pads, groups, has_bias, has_res, wlayout="oihw", **_):
    """A 1x1 convolution's output takes over its residual's buffer: the GEMM's tiles add their
    products onto the residual where it lies, which spares the stores fetching fresh lines
    (ResNet-50's and MobileNetV2's 1x1 layers with a residual at 56x56 and 28x28: 7-15% faster
    at two threads).  Not for planes of 256 positions or fewer, which run transposed and gained
    nothing, nor Winograd, whose output transforms lost 3-8% on two threads."""
    x, w = ins[0], ins[1]
    one = (wlayout == "oihw" and w.shape[2:] == (1, 1) and tuple(stride) == (1, 1) and not any(pads)
           and groups == 1 and x.shape[2] * x.shape[3] > 256)
    return 2 + has_bias if has_res and one else None


CONV2D = defop("conv2d", "kernel", _conv_infer, _conv_ref, prepare=_keeps(_conv_prepare), contiguous=(0, 1, 2, 3),
               overwrites=_conv_overwrites)


# ---------------------------------------------------------------- conv_pwdw
# A 1x1 convolution (stride 1, unpadded, one group; `act1`, bias if has_b1) and the depthwise
# convolution that reads it (`stride`, `pads`, `act`, bias if has_b2, residual if has_res) as one
# kernel, which never stores the expanded tensor whole (fusion.py forms it). Inputs: x, w1, [b1],
# w2, [b2], [res].
def _pwdw_split(ins, has_b1, has_b2, has_res):
    it = iter(ins)
    x, w1 = next(it), next(it)
    b1 = next(it) if has_b1 else None
    w2 = next(it)
    b2 = next(it) if has_b2 else None
    return x, w1, b1, w2, b2, next(it) if has_res else None


def _pwdw_infer(*ins, act1, has_b1, prepack, stride, pads, act, has_b2, has_res):
    x, w1, b1, w2, b2, r = _pwdw_split(ins, has_b1, has_b2, has_res)
    _need_f32("conv_pwdw", *ins)
    e = w1.shape[0]
    if x.ndim != 4 or w1.shape != (e, x.shape[1], 1, 1) or w2.ndim != 4 or w2.shape[:2] != (e, 1):
        raise ShapeError(f"conv_pwdw: input {x.shape} with weights {w1.shape}, {w2.shape}")
    n, _, h, w = x.shape
    kh, kw = w2.shape[2:]
    out = (n, e, conv_out(h, kh, stride[0], pads[0], pads[2], 1), conv_out(w, kw, stride[1], pads[1], pads[3], 1))
    for t, want in ((b1, (e,)), (b2, (e,)), (r, out)):
        if t is not None and t.shape != want:
            raise ShapeError(f"conv_pwdw: {t.shape} where {want} was expected")
    return out, dt.float32


def _pwdw_ref(*ins, act1, has_b1, prepack, stride, pads, act, has_b2, has_res):
    x, w1, b1, w2, b2, r = _pwdw_split(ins, has_b1, has_b2, has_res)
    e = _act_ref(conv2d_ref(x, w1, b1), act1)
    y = conv2d_ref(e, w2, b2, stride, pads, (1, 1), w2.shape[0])
    return _act_ref(y if r is None else y + r, act)


def _pwdw_prepare(out, ins, act1, has_b1, prepack, stride, pads, act, has_b2, has_res):
    x, w1, b1, w2, b2, r = _pwdw_split(ins, has_b1, has_b2, has_res)
    mid = (x.shape[0], w1.shape[0]) + x.shape[2:]
    p1 = conv_params(x.shape, mid, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, act1, "gemm")
    p2 = conv_params(mid, out.shape, w2.shape[2:], stride, pads, (1, 1), w2.shape[0], act, "depthwise")
    keep = [p1, p2]
    if prepack:  # constant expansion weights: packed once for the GEMM micro-kernel
        packed = _weight_buffer(lib.ex_conv_packed_size(p1))
        check(lib.ex_conv_pack_weights(p1, _fp(w1), _fp(packed)), "conv_pwdw")
        keep.append(packed)
        p1.wpack = _fp(packed)
    args = (p1, _fp(w1), _fp_opt(b1), p2, _fp(w2), _fp_opt(b2), _fp(x), _fp_opt(r), _fp(out))
    return KernelCall("conv_pwdw", args, "conv_pwdw", keep=keep)


CONV_PWDW = defop("conv_pwdw", "kernel", _pwdw_infer, _pwdw_ref, prepare=_keeps(_pwdw_prepare),
                  contiguous=(0, 1, 2, 3, 4, 5))


def pwdw_fusable(pw_x_shape, pw_attrs, dw_w_shape, dw_attrs, e):
    """Whether a 1x1 convolution (input shape, attrs) and the depthwise one after it (weight shape,
    attrs, e channels) run as conv_pwdw: the kernel's shapes, and an expanded tensor of at least
    1 MB, whose trip through memory the fusion saves (smaller ones stay in L2 anyway)."""
    n, _, h, w = pw_x_shape
    a, d = pw_attrs, dw_attrs
    return (a["stride"] == (1, 1) and a["pads"] == (0, 0, 0, 0) and a["dilation"] == (1, 1) and a["groups"] == 1
            and a.get("wlayout", "oihw") == "oihw" and not a["has_res"] and a["act"] in ("none", "relu", "relu6")
            and d["groups"] == e and d.get("wlayout", "oihw") == "oihw" and d.get("algo", "auto") in ("auto", "depthwise")
            and dw_w_shape[2] == dw_w_shape[3] in (3, 5)
            and d["stride"][0] == d["stride"][1] in (1, 2) and d["dilation"] == (1, 1)
            and n * e * h * w * 4 >= 1 << 20 and w > 8)


# ---------------------------------------------------------------- conv_transpose2d
def _convt_infer(x, w, *rest, stride, padding, output_padding, dilation, groups, act, has_bias):
    _need_f32("conv_transpose2d", x, w, *rest)
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"conv_transpose2d: input {x.shape} and weight {w.shape} must be 4-D "
                         f"(NCHW and (in, out/groups, kh, kw))")
    n, c, h, wd = x.shape
    if w.shape[0] != c or groups < 1 or c % groups:
        raise ShapeError(f"conv_transpose2d: input {x.shape} does not match weight {w.shape} with groups={groups}")
    oc = w.shape[1] * groups
    oh = (h - 1) * stride[0] - 2 * padding[0] + dilation[0] * (w.shape[2] - 1) + output_padding[0] + 1
    ow = (wd - 1) * stride[1] - 2 * padding[1] + dilation[1] * (w.shape[3] - 1) + output_padding[1] + 1
    if oh < 1 or ow < 1:
        raise ShapeError(f"conv_transpose2d: output size {(oh, ow)} for input {x.shape} is not positive")
    if has_bias and rest[0].shape != (oc,):
        raise ShapeError(f"conv_transpose2d: bias {rest[0].shape} does not match {oc} output channels")
    return (n, oc, oh, ow), dt.float32


def _convt_ref(x, w, *rest, stride, padding, output_padding, dilation, groups, act, has_bias):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, c, h, wd = x.shape
    _, ocg, kh, kw = w.shape
    oh = (h - 1) * stride[0] - 2 * padding[0] + dilation[0] * (kh - 1) + output_padding[0] + 1
    ow = (wd - 1) * stride[1] - 2 * padding[1] + dilation[1] * (kw - 1) + output_padding[1] + 1
    full = np.zeros((n, ocg * groups, oh + 2 * padding[0] + kh * dilation[0], ow + 2 * padding[1] + kw * dilation[1]))
    icg = c // groups
    for g in range(groups):
        xg, wg = x[:, g * icg:(g + 1) * icg], w[g * icg:(g + 1) * icg]
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", xg, wg[:, :, i, j])
                full[:, g * ocg:(g + 1) * ocg, i * dilation[0]: i * dilation[0] + stride[0] * (h - 1) + 1: stride[0],
                     j * dilation[1]: j * dilation[1] + stride[1] * (wd - 1) + 1: stride[1]] += contrib
    y = full[:, :, padding[0]:padding[0] + oh, padding[1]:padding[1] + ow]
    if has_bias:
        y = y + np.asarray(rest[0], np.float64)[None, :, None, None]
    return _act_ref(y, act)


def _convt_prepare(out, ins, stride, padding, output_padding, dilation, groups, act, has_bias):
    x, w = ins[:2]
    b = ins[2] if has_bias else None
    p = conv_params(x.shape, out.shape, w.shape[2:], stride, (padding[0], padding[1]), dilation, groups, act, "auto")
    args = (p, _fp(x), _fp(w), _fp_opt(b), _fp(out))
    return KernelCall("conv_transpose2d", args, "conv_transpose2d")


CONV_T2D = defop("conv_transpose2d", "kernel", _convt_infer, _convt_ref, prepare=_keeps(_convt_prepare),
                 contiguous=(0, 1, 2))


# ---------------------------------------------------------------- pooling
def pool_out(size, k, s, p, d, ceil_mode):
    num = size + 2 * p - d * (k - 1) - 1
    o = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    return o


def _pool_infer(x, kind, kernel, stride, padding, dilation, ceil_mode, count_include_pad):
    _need_f32(f"{kind}_pool2d", x)
    if x.ndim != 4:
        raise ShapeError(f"{kind}_pool2d: input must be NCHW (4-D), got shape {x.shape}")
    for k, p in zip(kernel, padding):
        if p * 2 > k:
            raise ShapeError(f"{kind}_pool2d: padding {padding} must be at most half the kernel {kernel}")
    oh = pool_out(x.shape[2], kernel[0], stride[0], padding[0], dilation[0], ceil_mode)
    ow = pool_out(x.shape[3], kernel[1], stride[1], padding[1], dilation[1], ceil_mode)
    if oh < 1 or ow < 1:
        raise ShapeError(f"{kind}_pool2d: input {x.shape} is too small for kernel {kernel}")
    return (x.shape[0], x.shape[1], oh, ow), dt.float32


def _pool_ref(x, kind, kernel, stride, padding, dilation, ceil_mode, count_include_pad):
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    oh = pool_out(h, kernel[0], stride[0], padding[0], dilation[0], ceil_mode)
    ow = pool_out(w, kernel[1], stride[1], padding[1], dilation[1], ceil_mode)
    y = np.empty((n, c, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * stride[0] - padding[0], ox * stride[1] - padding[1]
            if kind == "max":
                ys = [y0 + i * dilation[0] for i in range(kernel[0]) if 0 <= y0 + i * dilation[0] < h]
                xs = [x0 + j * dilation[1] for j in range(kernel[1]) if 0 <= x0 + j * dilation[1] < w]
                y[:, :, oy, ox] = x[:, :, ys][:, :, :, xs].max(axis=(2, 3))
            else:
                ye, xe = min(y0 + kernel[0], h + padding[0]), min(x0 + kernel[1], w + padding[1])
                pool = (ye - y0) * (xe - x0)
                ys, xs, ye, xe = max(y0, 0), max(x0, 0), min(ye, h), min(xe, w)
                s = x[:, :, ys:ye, xs:xe].sum(axis=(2, 3))
                y[:, :, oy, ox] = s / (pool if count_include_pad else (ye - ys) * (xe - xs))
    return y


def _pool_prepare(out, ins, kind, kernel, stride, padding, dilation, ceil_mode, count_include_pad):
    x = ins[0]
    code = lib.EX_POOL_MAX if kind == "max" else lib.EX_POOL_AVG if count_include_pad else lib.EX_POOL_AVG_EXCL
    n, c, h, w = x.shape
    args = (code, _fp(x), _fp(out), n * c, h, w, out.shape[2], out.shape[3], *kernel, *stride, *padding, *dilation)
    return KernelCall("pool2d", args, f"{kind}_pool2d")


POOL2D = defop("pool2d", "kernel", _pool_infer, _pool_ref, prepare=_keeps(_pool_prepare), contiguous=(0,))


def _apool_infer(x, kind, output_size):
    _need_f32(f"adaptive_{kind}_pool2d", x)
    if x.ndim != 4 or min(x.shape[2:]) < 1 or min(output_size) < 1:
        raise ShapeError(f"adaptive_{kind}_pool2d: input {x.shape} (NCHW, non-empty) to output size {output_size}")
    return (x.shape[0], x.shape[1]) + tuple(output_size), dt.float32


def _apool_ref(x, kind, output_size):
    x = np.asarray(x, np.float64)
    h, w = x.shape[2:]
    oh, ow = output_size
    y = np.empty(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = x[:, :, i * h // oh: -(-(i + 1) * h // oh), j * w // ow: -(-(j + 1) * w // ow)]
            y[:, :, i, j] = win.max(axis=(2, 3)) if kind == "max" else win.mean(axis=(2, 3))
    return y


def _apool_prepare(out, ins, kind, output_size):
    x = ins[0]
    n, c, h, w = x.shape
    args = (lib.EX_POOL_MAX if kind == "max" else lib.EX_POOL_AVG, _fp(x), _fp(out), n * c, h, w, *output_size)
    return KernelCall("adaptive_pool2d", args, f"adaptive_{kind}_pool2d")


ADAPTIVE_POOL2D = defop("adaptive_pool2d", "kernel", _apool_infer, _apool_ref, prepare=_keeps(_apool_prepare),
                        contiguous=(0,))


# ---------------------------------------------------------------- interpolate
def _resize_infer(x, mode, size, scales, align_corners):
    _need_f32("interpolate", x)
    if x.ndim != 4:
        raise ShapeError(f"interpolate: input must be NCHW (4-D), got shape {x.shape}")
    if min(size) < 1:
        raise ShapeError(f"interpolate: output size {size} must be positive")
    return x.shape[:2] + tuple(size), dt.float32


def _resize_ref(x, mode, size, scales, align_corners):
    x = np.asarray(x, np.float64)
    (h, w), (oh, ow) = x.shape[2:], size

    def coords(o, n, s):
        d = np.arange(o, dtype=np.float64)
        if mode == "nearest":
            i = np.minimum(np.floor(d * s).astype(np.int64), n - 1)
            return i, i, np.zeros(o)
        src = d * (n - 1) / (o - 1) if align_corners and o > 1 else (np.zeros(o) if align_corners else
                                                                       np.maximum((d + 0.5) * s - 0.5, 0))
        i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
        return i0, np.minimum(i0 + 1, n - 1), src - i0
    y0, y1, fy = coords(oh, h, scales[0])
    x0, x1, fx = coords(ow, w, scales[1])
    fy, fx = fy[:, None], fx[None, :]
    g = lambda a, b: x[:, :, a][:, :, :, b]  # noqa: E731
    return (1 - fy) * ((1 - fx) * g(y0, x0) + fx * g(y0, x1)) + fy * ((1 - fx) * g(y1, x0) + fx * g(y1, x1))


def _resize_prepare(out, ins, mode, size, scales, align_corners):
    x = ins[0]
    n, c, h, w = x.shape
    args = (lib.EX_RESIZE_NEAREST if mode == "nearest" else lib.EX_RESIZE_BILINEAR, int(bool(align_corners)),
            _fp(x), _fp(out), n * c, h, w, size[0], size[1], float(scales[0]), float(scales[1]))
    return KernelCall("resize2d", args, "interpolate")


RESIZE2D = defop("interpolate", "kernel", _resize_infer, _resize_ref, prepare=_keeps(_resize_prepare),
                 contiguous=(0,))


# ---------------------------------------------------------------- pad
_PAD_MODES = {"constant": lib.EX_PAD_CONSTANT, "reflect": lib.EX_PAD_REFLECT, "replicate": lib.EX_PAD_REPLICATE}


def _pad_infer(x, pads, mode, value):
    """pads: ((before, after), ...) for every dim of x."""
    if len(pads) != x.ndim:
        raise ShapeError(f"pad: {len(pads)} pad pairs for input {x.shape}")
    if any(b < 0 or a < 0 for b, a in pads):
        raise ShapeError(f"pad: negative padding {pads} is not supported")
    padded = [d for d, p in enumerate(pads) if p != (0, 0)]
    if padded and padded[0] < x.ndim - 3:
        raise ShapeError(f"pad: only the last 3 dimensions can be padded, got pads {pads} for input {x.shape}")
    for d in padded:
        n = x.shape[d]
        if mode == "reflect" and max(pads[d]) >= n:
            raise ShapeError(f"pad: reflect padding {pads[d]} must be smaller than dimension {d} of input {x.shape}")
        if mode == "replicate" and n == 0:
            raise ShapeError(f"pad: cannot replicate-pad empty dimension {d} of input {x.shape}")
    return tuple(s + b + a for s, (b, a) in zip(x.shape, pads)), x.dtype


def _pad_ref(x, pads, mode, value):
    mode_np = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}[mode]
    kw = {"constant_values": value} if mode == "constant" else {}
    return np.pad(np.asarray(x), pads, mode=mode_np, **kw)


def _pad_prepare(out, ins, pads, mode, value):
    x = ins[0]
    shape = (1,) * max(0, 3 - x.ndim) + x.shape
    pp = ((0, 0),) * max(0, 3 - x.ndim) + tuple(pads)
    keep = (ffi.new("int64_t[3]", list(shape[-3:])), ffi.new("int64_t[3]", [b for b, _ in pp[-3:]]),
            ffi.new("int64_t[3]", [a for _, a in pp[-3:]]))
    v = np.array(value if mode == "constant" else 0, dtype=x.dtype)
    outer = int(np.prod(shape[:-3], dtype=np.int64))
    args = (x.itemsize, _PAD_MODES[mode], ffi.cast("void *", ptr(x)), ffi.cast("void *", ptr(out)), outer, *keep,
            ffi.cast("void *", ptr(v)))
    return KernelCall("pad", args, "pad", keep=v)


PAD = defop("pad", "kernel", _pad_infer, _pad_ref, prepare=_keeps(_pad_prepare), contiguous=(0,))


# ---------------------------------------------------------------- norms
def _norm_parts(ins, has_w, has_b):
    it = iter(ins[1:])
    return ins[0], next(it) if has_w else None, next(it) if has_b else None


def _ln_infer(x, *wb, n, eps, has_w, has_b, rms):
    name = "rms_norm" if rms else "layer_norm"
    _need_f32(name, x, *wb)
    if x.ndim < 1 or (n and x.size % n) or (x.ndim and n > x.size):
        raise ShapeError(f"{name}: input {x.shape} does not end with {n} normalized elements")
    for t in wb:
        if t.size != n:
            raise ShapeError(f"{name}: weight/bias {t.shape} does not match {n} normalized elements")
    return x.shape, dt.float32


def _ln_ref(x, *wb, n, eps, has_w, has_b, rms):
    x64 = np.asarray(x, np.float64).reshape(-1, n)
    _, w, b = _norm_parts((x,) + wb, has_w, has_b)
    if rms:
        y = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps)
    else:
        mu = x64.mean(-1, keepdims=True)
        y = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + eps)
    if w is not None:
        y = y * np.asarray(w, np.float64).reshape(-1)
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape(-1)
    return y.reshape(np.shape(x))


def _ln_prepare(out, ins, n, eps, has_w, has_b, rms):
    x, w, b = _norm_parts(ins, has_w, has_b)
    rows = x.size // n if n else 0
    if rms:
        args = (_fp(x), _fp_opt(w), _fp(out), rows, n, eps)
        return KernelCall("rms_norm", args, "rms_norm")
    args = (_fp(x), _fp_opt(w), _fp_opt(b), _fp(out), rows, n, eps)
    return KernelCall("layer_norm", args, "layer_norm")


LAYER_NORM = defop("layer_norm", "kernel", _ln_infer, _ln_ref, prepare=_keeps(_ln_prepare),
                   contiguous=(0, 1, 2))


def _gn_infer(x, *wb, groups, eps, has_w, has_b, act):
    _need_f32("group_norm", x, *wb)
    if x.ndim < 2 or groups < 1 or x.shape[1] % groups:
        raise ShapeError(f"group_norm: {x.shape[1] if x.ndim > 1 else '?'} channels of input {x.shape} "
                         f"do not split into {groups} groups")
    for t in wb:
        if t.shape != (x.shape[1],):
            raise ShapeError(f"group_norm: weight/bias {t.shape} does not match {x.shape[1]} channels")
    return x.shape, dt.float32


def _gn_ref(x, *wb, groups, eps, has_w, has_b, act):
    _, w, b = _norm_parts((x,) + wb, has_w, has_b)
    x64 = np.asarray(x, np.float64)
    g = x64.reshape(x64.shape[0], groups, -1)
    mu = g.mean(-1, keepdims=True)
    y = ((g - mu) / np.sqrt(((g - mu) ** 2).mean(-1, keepdims=True) + eps)).reshape(x64.shape)
    cs = (1, x64.shape[1]) + (1,) * (x64.ndim - 2)
    if w is not None:
        y = y * np.asarray(w, np.float64).reshape(cs)
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape(cs)
    return _act_ref(y, act)


def _gn_prepare(out, ins, groups, eps, has_w, has_b, act):
    x, w, b = _norm_parts(ins, has_w, has_b)
    inner = int(np.prod(x.shape[2:], dtype=np.int64))
    args = (_fp(x), _fp_opt(w), _fp_opt(b), _fp(out), x.shape[0], x.shape[1], inner, groups, eps, ACTS[act])
    return KernelCall("group_norm", args, "group_norm")


GROUP_NORM = defop("group_norm", "kernel", _gn_infer, _gn_ref, prepare=_keeps(_gn_prepare),
                   contiguous=(0, 1, 2))


def _bn_infer(x, mean, var, *wb, eps, has_w, has_b, act):
    _need_f32("batch_norm", x, mean, var, *wb)
    if x.ndim < 2:
        raise ShapeError(f"batch_norm: input must be (N, C, ...), got shape {x.shape}")
    for t in (mean, var) + wb:
        if t.shape != (x.shape[1],):
            raise ShapeError(f"batch_norm: statistics/affine {t.shape} do not match {x.shape[1]} channels of "
                             f"input {x.shape}")
    return x.shape, dt.float32


def _bn_parts(ins, has_w, has_b):
    it = iter(ins[3:])
    return ins[0], ins[1], ins[2], next(it) if has_w else None, next(it) if has_b else None


def _bn_ref(x, mean, var, *wb, eps, has_w, has_b, act):
    _, _, _, w, b = _bn_parts((x, mean, var) + wb, has_w, has_b)
    cs = (1, np.shape(x)[1]) + (1,) * (np.ndim(x) - 2)
    f = lambda a: np.asarray(a, np.float64).reshape(cs)  # noqa: E731
    y = (np.asarray(x, np.float64) - f(mean)) / np.sqrt(f(var) + eps)
    if w is not None:
        y = y * f(w)
    if b is not None:
        y = y + f(b)
    return _act_ref(y, act)


def _bn_prepare(out, ins, eps, has_w, has_b, act):
    x, mean, var, w, b = _bn_parts(ins, has_w, has_b)
    inner = int(np.prod(x.shape[2:], dtype=np.int64))
    args = (_fp(x), _fp(mean), _fp(var), _fp_opt(w), _fp_opt(b), _fp(out), x.shape[0], x.shape[1], inner, eps,
            ACTS[act])
    return KernelCall("batch_norm", args, "batch_norm")


BATCH_NORM = defop("batch_norm", "kernel", _bn_infer, _bn_ref, prepare=_keeps(_bn_prepare),
                   contiguous=(0, 1, 2, 3, 4))


# ---------------------------------------------------------------- attention
def _attn_infer(q, k, v, *mask, scale, causal, has_mask):
    _need_f32("scaled_dot_product_attention", q, k, v, *mask)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ShapeError(f"scaled_dot_product_attention: q {q.shape}, k {k.shape}, v {v.shape} must be "
                         f"(batch, heads, length, dim)")
    b, hq, lq, d = q.shape
    if k.shape[0] != b or v.shape[0] != b or k.shape[3] != d or k.shape[:3] != v.shape[:3] or hq % k.shape[1]:
        raise ShapeError(f"scaled_dot_product_attention: q {q.shape}, k {k.shape}, v {v.shape} do not match "
                         f"(k/v heads must divide q heads)")
    out = (b, hq, lq, v.shape[3])
    if mask:
        from .elementwise import broadcast_shapes
        full = (b, hq, lq, k.shape[2])
        if broadcast_shapes("scaled_dot_product_attention", mask[0].shape, full) != full:
            raise ShapeError(f"scaled_dot_product_attention: mask {mask[0].shape} does not broadcast to {full}")
    return out, dt.float32


def _attn_ref(q, k, v, *mask, scale, causal, has_mask):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask:
        s = s + np.asarray(mask[0], np.float64)
    if causal:
        lq, lk = s.shape[-2:]
        s = np.where(np.tril(np.ones((lq, lk), bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def _attn_prepare(out, ins, scale, causal, has_mask):
    b, hq, lq, dv = out.shape
    arrs, strides = [], []
    for a in ins[:3]:
        if a.strides[3] != a.itemsize or any(s % a.itemsize for s in a.strides):
            a = np.ascontiguousarray(a)  # a view with a strided last dim: copied at prepare, refreshed per run
        arrs.append(a)
        strides.append(ffi.new("int64_t[3]", [s // a.itemsize for s in a.strides[:3]]))
    copies = [(src, dst) for src, dst in zip(ins[:3], arrs) if src is not dst]
    m, ms = ffi.NULL, ffi.NULL
    if has_mask:
        mk = np.broadcast_to(ins[3], (b, hq, lq, ins[1].shape[2]))
        ms = ffi.new("int64_t[4]", [s // 4 for s in mk.strides])
        m = _fp(ins[3])
    q, k, v = arrs
    args = (_fp(q), strides[0], _fp(k), strides[1], _fp(v), strides[2], m, ms, _fp(out), b, hq, k.shape[1], lq,
            k.shape[2], q.shape[3], dv, float(scale), int(bool(causal)))

    call = KernelCall("attention", args, "scaled_dot_product_attention")
    if not copies:
        return call

    def run():
        for src, dst in copies:
            np.copyto(dst, src)
        call()
    return run


ATTENTION = defop("scaled_dot_product_attention", "kernel", _attn_infer, _attn_ref,
                  prepare=_keeps(_attn_prepare))


def attention_scale(d, scale):
    return 1.0 / math.sqrt(d) if scale is None else float(scale)
