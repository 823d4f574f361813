"""Functional neural-network ops on Tensors (the layers in express.nn are built from these).

>>> import express as ex, express.nn.functional as F
>>> F.relu(ex.asarray([-1.0, 2.0])).numpy()
array([0., 2.], dtype=float32)
"""
from __future__ import annotations

import math

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError
from ..ops import elementwise as _ew
from ..ops import nn as _nn
from ..ops.elementwise import astype, clip, erf, reciprocal, relu, rsqrt, sigmoid, silu, where  # noqa: F401
from ..ops.reduce import softmax as _softmax
from ..ops.shape import expand_dims, reshape, squeeze, take
from ..tensor import as_tensor, node


def gelu(x, approximate: str = "none"):
    """GELU: `x * Phi(x)` with the exact erf form, or the tanh approximation (`approximate="tanh"`)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _ew.gelu(x) if approximate == "none" else _ew.gelu_tanh(x)


def gelu_tanh(x):
    return _ew.gelu_tanh(x)


def softmax(x, axis: int = -1):
    """Softmax along `axis` (numerically stable)."""
    return _softmax(as_tensor(x), axis)


def log_softmax(x, axis: int = -1):
    """Log-softmax along `axis`."""
    return _softmax(as_tensor(x), axis, log=True)


def _f32(t):
    return None if t is None else astype(as_tensor(t), dt.float32)


def _out_dtype(*ts):
    d = ts[0].dtype
    for t in ts[1:]:
        if t is not None:
            d = dt.promote(d, t.dtype)
    return d if d.is_float else dt.float32


def relu6(x):
    """`min(max(x, 0), 6)`."""
    return clip(as_tensor(x), 0.0, 6.0)


def linear(x, weight, bias=None):
    """`x @ weight.T + bias` with `weight` of shape (out, in), read in place (never transposed or
    copied); float16/bfloat16 weights are widened inside the kernel.

    >>> import express as ex, express.nn.functional as F
    >>> F.linear(ex.ones((2, 3)), ex.ones((4, 3)), ex.zeros((4,))).shape
    (2, 4)
    """
    x, weight = as_tensor(x), as_tensor(weight)
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1:] != weight.shape[1:]:
        raise ShapeError(f"linear: input {x.shape} does not match weight {weight.shape} (out, in)")
    if x.dtype.is_bool or weight.dtype.is_bool:
        raise DTypeError(f"linear: bool operands ({x.dtype.name}, {weight.dtype.name}) are not supported")
    out = _out_dtype(x, weight)
    w = weight if weight.dtype in (dt.float32, dt.float16, dt.bfloat16) else astype(weight, dt.float32)
    b = None if bias is None else as_tensor(bias)
    if b is not None and b.ndim != 1:  # a broadcast bias: add it outside the kernel
        return astype(_nn.linear(_f32(x), w), out) + b
    return astype(_nn.linear(_f32(x), w, _f32(b)), out)


def embedding(ids, weight):
    """Rows of `weight` at integer `ids` (any shape): result shape ids.shape + (dim,)."""
    return take(as_tensor(weight), ids, axis=0)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalize over the trailing `normalized_shape` axes, then scale and shift (one fused kernel).

    >>> import express as ex, express.nn.functional as F
    >>> F.layer_norm(ex.asarray([[1.0, 3.0]]), 2).numpy().round(3)
    array([[-1.,  1.]], dtype=float32)
    """
    x = as_tensor(x)
    n = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[len(x.shape) - len(n):] != n or len(n) > x.ndim:
        raise ShapeError(f"layer_norm: input {x.shape} does not end with normalized shape {n}")
    ins = [_f32(x)] + [_f32(t) for t in (weight, bias) if t is not None]
    y = node(_nn.LAYER_NORM, ins, n=math.prod(n), eps=float(eps), has_w=weight is not None,
             has_b=bias is not None, rms=False)
    return astype(y, _out_dtype(x))


def rms_norm(x, weight=None, eps: float = 1e-6):
    """`x / sqrt(mean(x^2) + eps) * weight` over the last axis (one fused kernel)."""
    x = as_tensor(x)
    ins = [_f32(x)] + ([_f32(weight)] if weight is not None else [])
    y = node(_nn.LAYER_NORM, ins, n=x.shape[-1] if x.ndim else 1, eps=float(eps), has_w=weight is not None,
             has_b=False, rms=True)
    return astype(y, _out_dtype(x))


def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
    """Normalize (N, C, ...) over groups of C // num_groups channels, then a per-channel affine."""
    x = as_tensor(x)
    ins = [_f32(x)] + [_f32(t) for t in (weight, bias) if t is not None]
    y = node(_nn.GROUP_NORM, ins, groups=int(num_groups), eps=float(eps), has_w=weight is not None,
             has_b=bias is not None, act="none")
    return astype(y, _out_dtype(x))


def batch_norm(x, mean, var, weight=None, bias=None, eps: float = 1e-5):
    """Inference batch norm over channel axis 1 with running statistics `mean`, `var`. Right after a
    convolution with constant weights it is folded into the convolution's weights and bias."""
    x = as_tensor(x)
    ins = [_f32(x), _f32(mean), _f32(var)] + [_f32(t) for t in (weight, bias) if t is not None]
    y = node(_nn.BATCH_NORM, ins, eps=float(eps), has_w=weight is not None, has_b=bias is not None, act="none")
    return astype(y, _out_dtype(x))


def _pair(name, v, n=2):
    t = (v,) * n if isinstance(v, int) else tuple(int(i) for i in v)
    if len(t) != n:
        raise ShapeError(f"{name}: expected an int or {n} ints, got {v!r}")
    return t


def _conv_pads(padding, kernel, dilation, stride):
    """(top, left, bottom, right) from an int, a pair, a 4-tuple or 'same'/'valid'."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        if stride != (1, 1):
            raise ShapeError(f"conv2d: padding='same' needs stride 1, got {stride}")
        tot = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return (tot[0] // 2, tot[1] // 2, tot[0] - tot[0] // 2, tot[1] - tot[1] // 2)
    if isinstance(padding, int):
        return (padding,) * 4
    p = tuple(int(i) for i in padding)
    if len(p) == 2:
        return p + p
    if len(p) == 4:
        return p
    raise ShapeError(f"conv2d: padding must be an int, 2 or 4 ints, 'same' or 'valid', got {padding!r}")


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """2-D convolution over NCHW input with weight (out, in / groups, kh, kw), as PyTorch's.
    `padding` may also be (top, left, bottom, right). The planner picks the algorithm (1x1 and
    im2col GEMM, depthwise direct, Winograd F(4x4, 3x3) or F(2x2, 3x3)); bias, a following
    activation, residual add or batch norm fuse into the kernel.

    >>> import express as ex, express.nn.functional as F
    >>> F.conv2d(ex.ones((1, 3, 8, 8)), ex.ones((4, 3, 3, 3)), padding=1).shape
    (1, 4, 8, 8)
    """
    x, weight = as_tensor(x), as_tensor(weight)
    if weight.ndim != 4:
        raise ShapeError(f"conv2d: weight must be (out, in/groups, kh, kw), got shape {weight.shape}")
    stride, dilation = _pair("conv2d stride", stride), _pair("conv2d dilation", dilation)
    pads = _conv_pads(padding, weight.shape[2:], dilation, stride)
    ins = [_f32(x), _f32(weight)] + ([_f32(bias)] if bias is not None else [])
    y = node(_nn.CONV2D, ins, stride=stride, pads=pads, dilation=dilation, groups=int(groups), act="none",
             has_bias=bias is not None, has_res=False)
    return astype(y, _out_dtype(x))


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1):
    """Transposed 2-D convolution (the gradient of conv2d), weight (in, out / groups, kh, kw), as PyTorch's."""
    x, weight = as_tensor(x), as_tensor(weight)
    ins = [_f32(x), _f32(weight)] + ([_f32(bias)] if bias is not None else [])
    y = node(_nn.CONV_T2D, ins, stride=_pair("conv_transpose2d stride", stride),
             padding=_pair("conv_transpose2d padding", padding),
             output_padding=_pair("conv_transpose2d output_padding", output_padding),
             dilation=_pair("conv_transpose2d dilation", dilation), groups=int(groups), act="none",
             has_bias=bias is not None)
    return astype(y, _out_dtype(x))


def _pool(kind, x, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad):
    x = as_tensor(x)
    k = _pair(f"{kind}_pool2d kernel_size", kernel_size)
    s = k if stride is None or stride == () else _pair(f"{kind}_pool2d stride", stride)
    y = node(_nn.POOL2D, [_f32(x)], kind=kind, kernel=k, stride=s, padding=_pair(f"{kind}_pool2d padding", padding),
             dilation=_pair(f"{kind}_pool2d dilation", dilation), ceil_mode=bool(ceil_mode),
             count_include_pad=bool(count_include_pad))
    return astype(y, _out_dtype(x))


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
    """Max pooling over NCHW input (padding counts as -inf); `stride` defaults to the kernel size."""
    return _pool("max", x, kernel_size, stride, padding, dilation, ceil_mode, True)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True):
    """Average pooling over NCHW input; `stride` defaults to the kernel size."""
    return _pool("avg", x, kernel_size, stride, padding, 1, ceil_mode, count_include_pad)


def _adaptive(kind, x, output_size):
    x = as_tensor(x)
    if x.ndim != 4:
        raise ShapeError(f"adaptive_{kind}_pool2d: input must be NCHW (4-D), got shape {x.shape}")
    o = (output_size,) * 2 if isinstance(output_size, int) or output_size is None else tuple(output_size)
    o = tuple(x.shape[2 + i] if v is None else int(v) for i, v in enumerate(o))
    y = node(_nn.ADAPTIVE_POOL2D, [_f32(x)], kind=kind, output_size=o)
    return astype(y, _out_dtype(x))


def adaptive_avg_pool2d(x, output_size):
    """Average pooling to a fixed `output_size` (int or pair; None keeps that dim)."""
    return _adaptive("avg", x, output_size)


def adaptive_max_pool2d(x, output_size):
    """Max pooling to a fixed `output_size` (int or pair; None keeps that dim)."""
    return _adaptive("max", x, output_size)


def interpolate(x, size=None, scale_factor=None, mode: str = "nearest", align_corners=None):
    """Resize NCHW input to `size` or by `scale_factor`, mode 'nearest' or 'bilinear', as PyTorch's."""
    x = as_tensor(x)
    if mode not in ("nearest", "bilinear"):
        raise ShapeError(f"interpolate: mode must be 'nearest' or 'bilinear', got {mode!r}")
    if x.ndim != 4:
        raise ShapeError(f"interpolate: input must be NCHW (4-D), got shape {x.shape}")
    if (size is None) == (scale_factor is None):
        raise ShapeError("interpolate: give exactly one of size and scale_factor")
    h, w = x.shape[2:]
    if size is not None:
        size = _pair("interpolate size", size)
        scales = (h / size[0], w / size[1])
    else:
        sf = (float(scale_factor),) * 2 if isinstance(scale_factor, (int, float)) else tuple(map(float, scale_factor))
        size = (int(math.floor(h * sf[0])), int(math.floor(w * sf[1])))
        scales = (1.0 / sf[0], 1.0 / sf[1])
    y = node(_nn.RESIZE2D, [_f32(x)], mode=mode, size=size, scales=scales,
             align_corners=bool(align_corners) and mode == "bilinear")
    return astype(y, _out_dtype(x))


def pad(x, pad, mode: str = "constant", value: float = 0.0):
    """Pad the last len(pad) // 2 dims, `pad` = (left, right, top, bottom, ...) from the last dim, as
    PyTorch's; mode 'constant', 'reflect' or 'replicate'."""
    x = as_tensor(x)
    if mode not in ("constant", "reflect", "replicate"):
        raise ShapeError(f"pad: mode must be 'constant', 'reflect' or 'replicate', got {mode!r}")
    p = tuple(int(v) for v in pad)
    if len(p) % 2 or len(p) // 2 > x.ndim:
        raise ShapeError(f"pad: {len(p)} values for input {x.shape} (need pairs, at most one per dim)")
    pairs = [(0, 0)] * x.ndim
    for i in range(len(p) // 2):
        pairs[x.ndim - 1 - i] = (p[2 * i], p[2 * i + 1])
    return node(_nn.PAD, [x], pads=tuple(pairs), mode=mode, value=float(value))


def scaled_dot_product_attention(q, k, v, mask=None, is_causal: bool = False, scale=None):
    """`softmax(q @ k^T * scale + mask) @ v` in one streaming kernel (no L x S matrix), as PyTorch's:
    q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev), also without the batch dim; Hk may divide H
    (grouped-query attention). `mask`: additive float, or bool (True takes part), broadcast to
    (B, H, L, S). `is_causal`: query i sees keys j <= i (top-left aligned, as PyTorch).
    `scale` defaults to 1 / sqrt(E).

    >>> import express as ex, express.nn.functional as F
    >>> q = ex.ones((1, 2, 3, 4))
    >>> F.scaled_dot_product_attention(q, q, q, is_causal=True).shape
    (1, 2, 3, 4)
    """
    q, k, v = as_tensor(q), as_tensor(k), as_tensor(v)
    three = q.ndim == 3
    if three:
        q, k, v = expand_dims(q, 0), expand_dims(k, 0), expand_dims(v, 0)
    ins = [_f32(q), _f32(k), _f32(v)]
    if mask is not None:
        m = as_tensor(mask)
        if m.dtype.is_bool:
            m = where(m, 0.0, float("-inf"))
        ins.append(_f32(m))
    y = node(_nn.ATTENTION, ins, scale=_nn.attention_scale(q.shape[-1], scale), causal=bool(is_causal),
             has_mask=mask is not None)
    y = astype(y, _out_dtype(q))
    return squeeze(y, 0) if three else y


def apply_rotary(x, cos, sin, traditional: bool = False):
    """Rotate the first d = 2 * cos.shape[-1] features of x (..., D) by angles whose cos/sin are
    given (broadcastable against x[..., :d // 2]): the two halves rotate together (Llama / Hugging
    Face layout), or adjacent pairs with `traditional=True`. The rest of x passes through.

    One elementwise kernel: x viewed as its two halves (or its pairs) times cos, plus the same view
    with the halves swapped (a flip: a view, no copy) times (-sin, sin).

    >>> import numpy as np, express as ex, express.nn.functional as F
    >>> F.apply_rotary(ex.asarray([[1.0, 0.0]]), ex.asarray([[0.0]]), ex.asarray([[1.0]])).numpy()
    array([[0., 1.]], dtype=float32)
    """
    from ..ops.shape import concat, flip, stack
    x, cos, sin = as_tensor(x), as_tensor(cos), as_tensor(sin)
    D, half = x.shape[-1], cos.shape[-1]
    if sin.shape != cos.shape or 2 * half > D:
        raise ShapeError(f"apply_rotary: cos {cos.shape} and sin {sin.shape} must match, rotating at most the "
                         f"last axis of x {x.shape} (2 * {half} features)")
    rot = x if 2 * half == D else x[..., :2 * half]
    ax = -1 if traditional else -2  # the axis of a pair: (half, 2) or (2, half)
    r = reshape(rot, rot.shape[:-1] + ((half, 2) if traditional else (2, half)))
    out = r * expand_dims(cos, ax) + flip(r, axis=ax) * stack([-sin, sin], axis=ax)
    out = reshape(out, rot.shape)
    return out if 2 * half == D else concat([out, x[..., 2 * half:]], axis=-1)


def rope(x, offset=0, base: float = 10000.0, dims: int | None = None, traditional: bool = False, max_positions: int = 8192):
    """Rotary position embedding over the last axis of x (..., T, D): position `offset + t` rotates
    the first `dims` (default D) features by angles p * base^(-2i/dims). The two halves rotate
    together (Llama / Hugging Face layout), or adjacent pairs with `traditional=True`. `offset`
    may be a 0-d int64 tensor (a compiled decode step's position).

    >>> import numpy as np, express as ex, express.nn.functional as F
    >>> F.rope(ex.ones((1, 2, 4))).shape
    (1, 2, 4)
    """
    import numpy as np

    from .. import dtypes as dt
    from ..ops.elementwise import astype
    from ..ops.shape import take
    from ..ops.creation import arange
    from ..tensor import Tensor
    x = as_tensor(x)
    T, D = x.shape[-2], x.shape[-1]
    d = D if dims is None else int(dims)
    if d % 2 or d > D or x.ndim < 2:
        raise ShapeError(f"rope: rotated dims {d} must be even and at most the last axis of {x.shape}")
    if isinstance(offset, Tensor):
        n = max_positions
        pos = astype(offset, dt.int64) + arange(T)
    else:
        n = int(offset) + T
        pos = arange(int(offset), int(offset) + T)
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(np.arange(n, dtype=np.float64), inv)
    cos = take(as_tensor(np.cos(ang).astype(np.float32)), pos, axis=0)  # (T, d/2)
    sin = take(as_tensor(np.sin(ang).astype(np.float32)), pos, axis=0)
    return apply_rotary(x, cos, sin, traditional)
