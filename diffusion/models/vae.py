"""AutoencoderKL (diffusers): the encoder (image -> latent distribution) and the decoder
(latent -> image); `scaling_factor` from the config."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

import express as ex
import express.nn as nn
import express.nn.functional as F
from express import ModelError

from .attention import attention
from .layers import Conv2d, Downsample2D, Linear, ResnetBlock2D, Upsample2D


@dataclass
class VAEConfig:
    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple = ("UpDecoderBlock2D",) * 4
    block_out_channels: tuple = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 4
    norm_num_groups: int = 32
    sample_size: int = 512
    scaling_factor: float = 0.18215
    shift_factor: float | None = None
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True
    force_upcast: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> "VAEConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class _SpatialAttention(nn.Module):
    """Single-head self-attention over H*W with a GroupNorm in front and a residual."""

    def __init__(self, ch, groups):
        self.group_norm = nn.GroupNorm(groups, ch, eps=1e-6)
        self.to_q, self.to_k, self.to_v = Linear(ch, ch), Linear(ch, ch), Linear(ch, ch)
        self.to_out = [Linear(ch, ch)]

    def forward(self, x):
        n, c, h, w = x.shape
        t = ex.permute_dims(ex.reshape(self.group_norm(x), (n, c, h * w)), (0, 2, 1))
        y = self.to_out[0](attention(self.to_q(t), self.to_k(t), self.to_v(t), 1))
        return ex.reshape(ex.permute_dims(y, (0, 2, 1)), (n, c, h, w)) + x


class _Mid(nn.Module):
    def __init__(self, ch, groups, attn=True):
        self.resnets = [ResnetBlock2D(ch, ch, None, groups, 1e-6) for _ in range(2)]
        self.attentions = [_SpatialAttention(ch, groups)] if attn else None

    def forward(self, x):
        x = self.resnets[0](x)
        if self.attentions:
            x = self.attentions[0](x)
        return self.resnets[1](x)


class _Block(nn.Module):
    def __init__(self, cin, cout, layers, groups, resample):
        self.resnets = [ResnetBlock2D(cin if i == 0 else cout, cout, None, groups, 1e-6) for i in range(layers)]
        if resample == "down":
            self.downsamplers = [Downsample2D(cout, padding=0)]
        elif resample == "up":
            self.upsamplers = [Upsample2D(cout)]

    def forward(self, x):
        for r in self.resnets:
            x = r(x)
        for s in getattr(self, "downsamplers", []) + getattr(self, "upsamplers", []):
            x = s(x)
        return x


class Encoder(nn.Module):
    def __init__(self, c: VAEConfig):
        ch, g = list(c.block_out_channels), c.norm_num_groups
        self.conv_in = Conv2d(c.in_channels, ch[0], 3, padding=1)
        self.down_blocks, cout = [], ch[0]
        for i in range(len(ch)):
            cin, cout = cout, ch[i]
            self.down_blocks.append(_Block(cin, cout, c.layers_per_block, g, "down" if i < len(ch) - 1 else None))
        self.mid_block = _Mid(ch[-1], g, c.mid_block_add_attention)
        self.conv_norm_out = nn.GroupNorm(g, ch[-1], eps=1e-6)
        self.conv_out = Conv2d(ch[-1], 2 * c.latent_channels, 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for b in self.down_blocks:
            x = b(x)
        return self.conv_out(F.silu(self.conv_norm_out(self.mid_block(x))))


class Decoder(nn.Module):
    def __init__(self, c: VAEConfig):
        ch, g = list(c.block_out_channels)[::-1], c.norm_num_groups
        self.conv_in = Conv2d(c.latent_channels, ch[0], 3, padding=1)
        self.mid_block = _Mid(ch[0], g, c.mid_block_add_attention)
        self.up_blocks, cout = [], ch[0]
        for i in range(len(ch)):
            cin, cout = cout, ch[i]
            self.up_blocks.append(_Block(cin, cout, c.layers_per_block + 1, g, "up" if i < len(ch) - 1 else None))
        self.conv_norm_out = nn.GroupNorm(g, ch[-1], eps=1e-6)
        self.conv_out = Conv2d(ch[-1], c.out_channels, 3, padding=1)

    def forward(self, z):
        x = self.mid_block(self.conv_in(z))
        for b in self.up_blocks:
            x = b(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class AutoencoderKL(nn.Module):
    """`encode(images in [-1, 1]) -> (mean, logvar)` of the latent; `decode(latents) -> images`
    (unscaled latents: divide by `config.scaling_factor` first, as the pipeline does).

    >>> import numpy as np
    >>> vae = AutoencoderKL(dict(block_out_channels=(32, 64), norm_num_groups=8, layers_per_block=1,
    ...                          down_block_types=("DownEncoderBlock2D",) * 2,
    ...                          up_block_types=("UpDecoderBlock2D",) * 2))
    >>> vae.decode(np.zeros((1, 4, 8, 8), np.float32)).shape
    (1, 3, 16, 16)
    """

    def __init__(self, config: VAEConfig | dict | None = None):
        c = config if isinstance(config, VAEConfig) else VAEConfig.from_dict(config or {})
        for kinds, ok in ((c.down_block_types, "DownEncoderBlock2D"), (c.up_block_types, "UpDecoderBlock2D")):
            if any(k != ok for k in kinds):
                raise ModelError(f"AutoencoderKL: block types {list(kinds)} are not supported (only {ok})")
        self.config = c
        self.encoder, self.decoder = Encoder(c), Decoder(c)
        lc = c.latent_channels
        self.quant_conv = Conv2d(2 * lc, 2 * lc, 1) if c.use_quant_conv else None
        self.post_quant_conv = Conv2d(lc, lc, 1) if c.use_post_quant_conv else None

    @property
    def scale_factor(self) -> int:
        """Pixels per latent along each side (8 for SD)."""
        return 2 ** (len(self.config.block_out_channels) - 1)

    def encode(self, x):
        x = ex.asarray(x) if not isinstance(x, ex.Tensor) else x
        if x.ndim != 4 or x.shape[1] != self.config.in_channels:
            raise ModelError(f"AutoencoderKL.encode: images must be [batch, {self.config.in_channels}, h, w], "
                             f"got {x.shape}")
        m = self.encoder(x)
        if self.quant_conv is not None:
            m = self.quant_conv(m)
        lc = self.config.latent_channels
        return m[:, :lc], ex.clip(m[:, lc:], -30.0, 20.0)

    def decode(self, z):
        z = ex.asarray(z) if not isinstance(z, ex.Tensor) else z
        if z.ndim != 4 or z.shape[1] != self.config.latent_channels:
            raise ModelError(f"AutoencoderKL.decode: latents must be [batch, {self.config.latent_channels}, h, w], "
                             f"got {z.shape}")
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)

    # ---- tiles: large images decode tile by tile, with blended overlaps (diffusers' scheme) ----
    @property
    def tile_sample_size(self) -> int:
        s = self.config.sample_size
        return int(s[0] if isinstance(s, (list, tuple)) else s)

    @property
    def tile_latent_size(self) -> int:
        return self.tile_sample_size // self.scale_factor

    def tiled_decode(self, z, overlap: float = 0.25) -> np.ndarray:
        """Decode [B, C, h, w] latents in tiles of `config.sample_size // scale_factor` latents
        that overlap by `overlap`, blending seams linearly; memory stays that of one tile."""
        z = np.asarray(z, np.float32)
        tl, ts = self.tile_latent_size, self.tile_sample_size
        step, blend = int(tl * (1 - overlap)), int(ts * overlap)
        keep = ts - blend
        rows = [[self.decode(np.ascontiguousarray(z[:, :, i:i + tl, j:j + tl])).numpy().copy()
                 for j in range(0, z.shape[3], step)] for i in range(0, z.shape[2], step)]
        out_rows = []
        for i, row in enumerate(rows):
            out = []
            for j, tile in enumerate(row):
                if i > 0:
                    tile = _blend(rows[i - 1][j], tile, blend, axis=2)
                if j > 0:
                    tile = _blend(row[j - 1], tile, blend, axis=3)
                out.append(tile[:, :, :keep, :keep])
            out_rows.append(np.concatenate(out, axis=3))
        return np.concatenate(out_rows, axis=2)


def _blend(a, b, extent, axis):
    """Fade the start of tile `b` in from the end of its neighbour `a` along `axis` (in place on b)."""
    extent = min(a.shape[axis], b.shape[axis], extent)
    w = (np.arange(extent, dtype=np.float64) / extent).reshape((-1, 1) if axis == 2 else (1, -1))
    sa = [slice(None)] * 4
    sb = [slice(None)] * 4
    sa[axis], sb[axis] = slice(a.shape[axis] - extent, None), slice(0, extent)
    b[tuple(sb)] = a[tuple(sa)] * (1 - w) + b[tuple(sb)] * w
    return b
