"""UNet2DConditionModel (diffusers) for SD 1.x / 2.x configs: cross-attention down/up blocks,
attention heads from the config, 1x1-conv or linear projections, optional LCM guidance
embedding (`time_cond_proj_dim`)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

import express as ex
import express.nn as nn
import express.nn.functional as F
from express import ModelError

from .layers import (Conv2d, Downsample2D, Linear, ResnetBlock2D, Transformer2DModel, Upsample2D,
                     timestep_embedding)


@dataclass
class UNetConfig:
    sample_size: int = 64
    in_channels: int = 4
    out_channels: int = 4
    flip_sin_to_cos: bool = True
    freq_shift: int = 0
    down_block_types: tuple = ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",)
    mid_block_type: str = "UNetMidBlock2DCrossAttn"
    up_block_types: tuple = ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3
    block_out_channels: tuple = (320, 640, 1280, 1280)
    layers_per_block: int = 2
    norm_num_groups: int = 32
    norm_eps: float = 1e-5
    cross_attention_dim: int = 768
    transformer_layers_per_block: object = 1
    attention_head_dim: object = 8
    num_attention_heads: object = None
    use_linear_projection: bool = False
    time_cond_proj_dim: int | None = None
    resnet_time_scale_shift: str = "default"
    class_embed_type: str | None = None
    addition_embed_type: str | None = None
    only_cross_attention: object = False
    upcast_attention: bool = False
    time_embedding_type: str = "positional"

    @classmethod
    def from_dict(cls, d: dict) -> "UNetConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _per_block(v, n, name):
    v = list(v) if isinstance(v, (list, tuple)) else [v] * n
    if len(v) != n:
        raise ModelError(f"UNet2DConditionModel: {name} has {len(v)} entries for {n} blocks")
    return v


class _Block(nn.Module):
    """A down or up block: resnets, optional cross-attention transformers, optional resampler."""

    def __init__(self, kind, cins, cout, temb, c: UNetConfig, heads, tlayers, resample):
        self.resnets = [ResnetBlock2D(ci, cout, temb, c.norm_num_groups, c.norm_eps) for ci in cins]
        if kind.startswith("CrossAttn"):
            self.attentions = [Transformer2DModel(cout, heads, cout // heads, c.cross_attention_dim,
                                                  c.norm_num_groups, tlayers, c.use_linear_projection)
                               for _ in cins]
        else:
            self.attentions = None
        if resample == "down":
            self.downsamplers = [Downsample2D(cout)]
        elif resample == "up":
            self.upsamplers = [Upsample2D(cout)]

    def _layers(self):
        atts = self.attentions or [None] * len(self.resnets)
        return zip(self.resnets, atts)

    def down(self, x, temb, ctx):
        outs = []
        for r, a in self._layers():
            x = r(x, temb)
            if a is not None:
                x = a(x, ctx)
            outs.append(x)
        if hasattr(self, "downsamplers"):
            x = self.downsamplers[0](x)
            outs.append(x)
        return x, outs

    def up(self, x, skips, temb, ctx):
        for r, a in self._layers():
            x = r(ex.concat([x, skips.pop()], axis=1), temb)
            if a is not None:
                x = a(x, ctx)
        if hasattr(self, "upsamplers"):
            x = self.upsamplers[0](x)
        return x


class _MidBlock(nn.Module):
    def __init__(self, ch, temb, c: UNetConfig, heads, tlayers):
        self.resnets = [ResnetBlock2D(ch, ch, temb, c.norm_num_groups, c.norm_eps) for _ in range(2)]
        self.attentions = [Transformer2DModel(ch, heads, ch // heads, c.cross_attention_dim, c.norm_num_groups,
                                              tlayers, c.use_linear_projection)]

    def forward(self, x, temb, ctx):
        x = self.resnets[0](x, temb)
        return self.resnets[1](self.attentions[0](x, ctx), temb)


class _TimestepEmbedding(nn.Module):
    def __init__(self, cin, dim, cond_dim=None):
        self.linear_1 = Linear(cin, dim)
        self.linear_2 = Linear(dim, dim)
        self.cond_proj = Linear(cond_dim, cin, bias=False) if cond_dim else None

    def forward(self, x, cond=None):
        if cond is not None and self.cond_proj is not None:
            x = x + self.cond_proj(cond)
        return self.linear_2(F.silu(self.linear_1(x)))


class UNet2DConditionModel(nn.Module):
    """Noise prediction eps(x_t, t, text): sample [B, 4, h, w], timestep (scalar or [B]),
    encoder_hidden_states [B, tokens, cross_attention_dim] -> [B, out_channels, h, w].

    >>> import numpy as np
    >>> cfg = dict(block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=32,
    ...            attention_head_dim=(2, 4), norm_num_groups=8,
    ...            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    ...            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"))
    >>> unet = UNet2DConditionModel(cfg)
    >>> unet(np.zeros((1, 4, 16, 16), np.float32), 10, np.zeros((1, 77, 32), np.float32)).shape
    (1, 4, 16, 16)
    """

    def __init__(self, config: UNetConfig | dict | None = None):
        c = config if isinstance(config, UNetConfig) else UNetConfig.from_dict(config or {})
        self.config = c
        for k, ok in (("mid_block_type", "UNetMidBlock2DCrossAttn"), ("resnet_time_scale_shift", "default"),
                      ("class_embed_type", None), ("addition_embed_type", None),
                      ("time_embedding_type", "positional")):
            if getattr(c, k) != ok:
                raise ModelError(f"UNet2DConditionModel: {k}={getattr(c, k)!r} is not supported")
        if any(c.only_cross_attention) if isinstance(c.only_cross_attention, (list, tuple)) else c.only_cross_attention:
            raise ModelError("UNet2DConditionModel: only_cross_attention is not supported")
        ch, n = list(c.block_out_channels), len(c.block_out_channels)
        heads = _per_block(c.num_attention_heads or c.attention_head_dim, n, "attention heads")
        tl = _per_block(c.transformer_layers_per_block, n, "transformer_layers_per_block")
        temb = ch[0] * 4
        self.time_embedding = _TimestepEmbedding(ch[0], temb, c.time_cond_proj_dim)
        self.conv_in = Conv2d(c.in_channels, ch[0], 3, padding=1)
        self.down_blocks = []
        cout = ch[0]
        for i, kind in enumerate(c.down_block_types):
            cin, cout = cout, ch[i]
            self._check_kind(kind, "Down")
            cins = [cin] + [cout] * (c.layers_per_block - 1)
            self.down_blocks.append(_Block(kind, cins, cout, temb, c, heads[i], tl[i], "down" if i < n - 1 else None))
        self.mid_block = _MidBlock(ch[-1], temb, c, heads[-1], tl[-1])
        self.up_blocks = []
        rch, rheads, rtl = ch[::-1], heads[::-1], tl[::-1]
        cout = rch[0]
        for i, kind in enumerate(c.up_block_types):
            self._check_kind(kind, "Up")
            prev, cout, cin = cout, rch[i], rch[min(i + 1, n - 1)]
            m = c.layers_per_block + 1
            cins = [(prev if j == 0 else cout) + (cin if j == m - 1 else cout) for j in range(m)]
            self.up_blocks.append(_Block(kind, cins, cout, temb, c, rheads[i], rtl[i], "up" if i < n - 1 else None))
        self.conv_norm_out = nn.GroupNorm(c.norm_num_groups, ch[0], eps=c.norm_eps)
        self.conv_out = Conv2d(ch[0], c.out_channels, 3, padding=1)

    @staticmethod
    def _check_kind(kind, where):
        if kind not in (f"CrossAttn{where}Block2D", f"{where}Block2D"):
            raise ModelError(f"UNet2DConditionModel: block type {kind!r} is not supported")

    def time_features(self, timestep, batch: int) -> np.ndarray:
        """The sinusoidal features of the timestep, [batch, block_out_channels[0]] (host side)."""
        t = np.broadcast_to(np.asarray(timestep, np.float32).reshape(-1), (batch,))
        return timestep_embedding(t, self.config.block_out_channels[0], self.config.flip_sin_to_cos,
                                  self.config.freq_shift)

    def forward(self, sample, timestep, encoder_hidden_states, timestep_cond=None, t_features=None,
                low_memory: bool = False):
        """`low_memory` evaluates block by block, so only one block's temporaries (e.g. float32
        copies of float16 conv weights) exist at a time."""
        x = ex.asarray(sample) if not isinstance(sample, ex.Tensor) else sample
        ctx = ex.asarray(encoder_hidden_states) if not isinstance(encoder_hidden_states, ex.Tensor) \
            else encoder_hidden_states
        c = self.config
        if x.ndim != 4 or x.shape[1] != c.in_channels:
            raise ModelError(f"UNet2DConditionModel: sample must be [batch, {c.in_channels}, h, w], got {x.shape}")
        f = 2 ** (len(c.block_out_channels) - 1)
        if x.shape[2] % f or x.shape[3] % f:
            raise ModelError(f"UNet2DConditionModel: latent size {x.shape[2:]} must be a multiple of {f}")
        if ctx.ndim != 3 or ctx.shape[-1] != c.cross_attention_dim or ctx.shape[0] != x.shape[0]:
            raise ModelError(f"UNet2DConditionModel: encoder_hidden_states must be [{x.shape[0]}, tokens, "
                             f"{c.cross_attention_dim}], got {ctx.shape}")
        tf = t_features if t_features is not None else ex.asarray(self.time_features(timestep, x.shape[0]))
        cond = None if timestep_cond is None else ex.asarray(timestep_cond) \
            if not isinstance(timestep_cond, ex.Tensor) else timestep_cond
        temb = self.time_embedding(tf, cond)
        done = (lambda *ts: ex.eval(*ts)) if low_memory else (lambda *ts: None)
        x = self.conv_in(x)
        skips = [x]
        done(temb, x)
        for blk in self.down_blocks:
            x, outs = blk.down(x, temb, ctx)
            skips += outs
            done(*outs)
        x = self.mid_block(x, temb, ctx)
        done(x)
        for blk in self.up_blocks:
            x = blk.up(x, skips, temb, ctx)
            done(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))
