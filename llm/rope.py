"""Rotary position embeddings: inverse frequencies per rope type (default, linear, dynamic-free
llama3), cos/sin tables, and the rotation in both layouts (two halves, or GLM's (even, odd) pairs)."""
from __future__ import annotations

import math

import numpy as np

import express.nn.functional as F
from express import ModelError

from .config import ModelConfig


def inv_freq(cfg: ModelConfig) -> np.ndarray:
    dim = cfg.rotary_dim
    f = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type", "default")
    if kind == "default":
        return f
    if kind == "linear":
        return f / sc["factor"]
    if kind == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        out = np.where(wl > lo_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        return np.where(medium, smoothed, out).astype(np.float32)
    raise ModelError(f"rope type {kind!r} is not supported (default, linear, llama3)")


def tables(cfg: ModelConfig, n: int):
    """cos, sin of shape (n, rotary_dim // 2) as float32 (computed in float32 as transformers does)."""
    t = np.arange(n, dtype=np.int64).astype(np.float32)
    freqs = np.outer(t, inv_freq(cfg)).astype(np.float32)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def apply(x, cos, sin, rotary_dim: int, interleaved: bool):
    """Rotate x (T, heads, head_dim) by cos/sin (T, 1, rotary_dim // 2) (`F.apply_rotary`: one
    kernel per rotation)."""
    return F.apply_rotary(x, cos, sin, traditional=interleaved)
