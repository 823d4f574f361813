"""Building blocks shared by the UNet and the VAE: convolution, resnet blocks, up/down sampling,
the transformer block (self-attention, cross-attention, GEGLU feed-forward)."""
from __future__ import annotations

import numpy as np

import express as ex
import express.nn as nn
import express.nn.functional as F

from .attention import attention


def placeholder(shape):
    """A parameter that holds no memory until evaluated (a lazy zeros node): models are built
    empty and filled by `load_weights`, so building SD's UNet costs neither time nor RAM."""
    return ex.zeros(shape)


class Linear(nn.Linear):
    """express.nn.Linear with placeholder parameters (no random init)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        self.weight = placeholder((out_features, in_features))
        self.bias = placeholder((out_features,)) if bias else None


class Embedding(nn.Embedding):
    """express.nn.Embedding with a placeholder table."""

    def __init__(self, num_embeddings: int, dim: int):
        self.weight = placeholder((num_embeddings, dim))


def conv2d(x, weight, bias=None, stride=1, padding=0):
    """NCHW convolution with a PyTorch-layout weight [out, in, kh, kw]."""
    conv = getattr(F, "conv2d", None)
    if conv is not None:
        return conv(x, weight, bias, stride=stride, padding=padding)
    return _conv2d_im2col(x, weight, bias, stride, padding)


def _conv2d_im2col(x, w, b, stride, padding):
    """A composed fallback (pad by concatenation, shifted slices, one matmul)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    p = padding
    if p:
        zr = ex.zeros((n, c, p, wd), x.dtype)
        x = ex.concat([zr, x, zr], axis=2)
        zc = ex.zeros((n, c, h + 2 * p, p), x.dtype)
        x = ex.concat([zc, x, zc], axis=3)
    oh, ow = (h + 2 * p - kh) // stride + 1, (wd + 2 * p - kw) // stride + 1
    cols = [x[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            for i in range(kh) for j in range(kw)]
    cols = ex.stack(cols, axis=2) if len(cols) > 1 else ex.expand_dims(cols[0], 2)  # n, c, k, oh, ow
    y = ex.matmul(ex.reshape(w, (o, c * kh * kw)), ex.reshape(cols, (n, c * kh * kw, oh * ow)))
    y = ex.reshape(y, (n, o, oh, ow))
    return y if b is None else y + ex.reshape(b, (1, o, 1, 1))


class Conv2d(nn.Module):
    """weight [out, in, k, k] (PyTorch layout), bias [out]; placeholders until loaded."""

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int = 1, padding: int = 0):
        self.weight = placeholder((cout, cin, kernel_size, kernel_size))
        self.bias = placeholder((cout,))
        self.stride, self.padding = stride, padding

    def forward(self, x):
        return conv2d(x, self.weight, self.bias, self.stride, self.padding)


class Identity(nn.Module):
    """A parameterless slot (keeps PyTorch's indices, e.g. the dropout in ff.net.1)."""

    def forward(self, x):
        return x


def upsample_nearest2x(x):
    n, c, h, w = x.shape
    interp = getattr(F, "interpolate", None)
    if interp is not None:
        return interp(x, scale_factor=2, mode="nearest")
    y = ex.broadcast_to(ex.reshape(x, (n, c, h, 1, w, 1)), (n, c, h, 2, w, 2))
    return ex.reshape(y, (n, c, 2 * h, 2 * w))


class ResnetBlock2D(nn.Module):
    """GroupNorm-SiLU-conv twice, the time embedding added in between, a 1x1 shortcut when the
    channel count changes."""

    def __init__(self, cin: int, cout: int, temb: int | None, groups: int, eps: float, scale: float = 1.0):
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps)
        self.conv1 = Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = Linear(temb, cout) if temb else None
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
        self.conv2 = Conv2d(cout, cout, 3, padding=1)
        self.conv_shortcut = Conv2d(cin, cout, 1) if cin != cout else None
        self.scale = scale

    def forward(self, x, temb=None):
        h = self.conv1(F.silu(self.norm1(x)))
        if temb is not None and self.time_emb_proj is not None:
            t = self.time_emb_proj(F.silu(temb))
            h = h + ex.reshape(t, t.shape + (1, 1))
        h = self.conv2(F.silu(self.norm2(h)))
        s = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        y = s + h
        return y if self.scale == 1.0 else y * (1.0 / self.scale)


class Downsample2D(nn.Module):
    """A stride-2 3x3 conv; `padding=0` pads right/bottom by one first (the VAE's form)."""

    def __init__(self, channels: int, padding: int = 1):
        self.conv = Conv2d(channels, channels, 3, stride=2, padding=padding)
        self.pad = padding

    def forward(self, x):
        if self.pad == 0:
            n, c, h, w = x.shape
            x = ex.concat([x, ex.zeros((n, c, h, 1), x.dtype)], axis=3)
            x = ex.concat([x, ex.zeros((n, c, 1, w + 1), x.dtype)], axis=2)
        return self.conv(x)


class Upsample2D(nn.Module):
    def __init__(self, channels: int):
        self.conv = Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(upsample_nearest2x(x))


class Attention(nn.Module):
    """diffusers' Attention: to_q/to_k/to_v (+ to_out.0), `context` for cross-attention."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int | None = None, bias: bool = False):
        inner, ctx = heads * head_dim, context_dim or dim
        self.heads = heads
        self.to_q = Linear(dim, inner, bias=bias)
        self.to_k = Linear(ctx, inner, bias=bias)
        self.to_v = Linear(ctx, inner, bias=bias)
        self.to_out = [Linear(inner, dim)]

    def forward(self, x, context=None):
        c = x if context is None else context
        return self.to_out[0](attention(self.to_q(x), self.to_k(c), self.to_v(c), self.heads))


class GEGLU(nn.Module):
    def __init__(self, dim: int, inner: int):
        self.proj = Linear(dim, inner * 2)

    def forward(self, x):
        h = self.proj(x)
        n = h.shape[-1] // 2
        return h[..., :n] * F.gelu(h[..., n:])


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        self.net = [GEGLU(dim, dim * mult), Identity(), Linear(dim * mult, dim)]

    def forward(self, x):
        return self.net[2](self.net[0](x))


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int):
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, heads, head_dim, context_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x, context):
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), context)
        return x + self.ff(self.norm3(x))


class Transformer2DModel(nn.Module):
    """GroupNorm, projection in (1x1 conv, or linear with `use_linear_projection`), transformer
    blocks over the H*W tokens, projection out, residual."""

    def __init__(self, channels: int, heads: int, head_dim: int, context_dim: int, groups: int,
                 layers: int = 1, linear_projection: bool = False):
        inner = heads * head_dim
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.linear = linear_projection
        self.proj_in = Linear(channels, inner) if linear_projection else Conv2d(channels, inner, 1)
        self.transformer_blocks = [BasicTransformerBlock(inner, heads, head_dim, context_dim) for _ in range(layers)]
        self.proj_out = Linear(inner, channels) if linear_projection else Conv2d(inner, channels, 1)

    def forward(self, x, context):
        n, c, h, w = x.shape
        y = self.norm(x)
        to_tokens = lambda t: ex.permute_dims(ex.reshape(t, (n, t.shape[1], h * w)), (0, 2, 1))  # noqa: E731
        from_tokens = lambda t: ex.reshape(ex.permute_dims(t, (0, 2, 1)), (n, t.shape[2], h, w))  # noqa: E731
        y = self.proj_in(to_tokens(y)) if self.linear else to_tokens(self.proj_in(y))
        for blk in self.transformer_blocks:
            y = blk(y, context)
        y = from_tokens(self.proj_out(y)) if self.linear else self.proj_out(from_tokens(y))
        return y + x


def timestep_embedding(timesteps, dim: int, flip_sin_to_cos: bool = True, shift: float = 1.0,
                       max_period: float = 10000.0) -> np.ndarray:
    """Sinusoidal embeddings [batch, dim] of (possibly fractional) timesteps, in float32 as diffusers."""
    t = np.asarray(timesteps, np.float32).reshape(-1)
    half = dim // 2
    freqs = np.exp(-np.log(max_period) * np.arange(half, dtype=np.float32) / np.float32(half - shift))
    arg = t[:, None] * freqs[None, :].astype(np.float32)
    emb = np.concatenate([np.sin(arg), np.cos(arg)], axis=-1)
    if flip_sin_to_cos:
        emb = np.concatenate([emb[:, half:], emb[:, :half]], axis=-1)
    if dim % 2:
        emb = np.pad(emb, ((0, 0), (0, 1)))
    return emb.astype(np.float32)
