"""The one decoder every family shares: pre-norm blocks of (GQA attention with RoPE, optional
q/k norm and biases) and a gated MLP, with the per-family switches of `ModelConfig`.

Parameter names are the Hugging Face ones ("model.layers.0.self_attn.q_proj.weight"), so a
checkpoint loads by name. A step runs `T` new tokens at a runtime position `pos` (a 0-d int64
tensor) against the preallocated KV cache, over the first `L` cache slots (a static bucket), so
`ex.compile` caches one plan per (T, L) and a decode step replays it."""
from __future__ import annotations

import dataclasses

import numpy as np

import express as ex
import express.nn as nn
import express.nn.functional as F

from . import rope
from .config import ModelConfig

def _linear(n_in, n_out, bias):
    """A Linear of the right shapes whose weights are lazy placeholders (no memory, no random
    init): loading sets the real ones."""
    lin = nn.Linear.__new__(nn.Linear)
    lin.weight = ex.zeros((n_out, n_in))
    lin.bias = ex.zeros((n_out,)) if bias else None
    return lin


def project(x, *layers):
    """[layer(x) for layer in layers]; packed layers of one kind and `fuse_key` (q/k/v, gate/up)
    run as one kernel call (`many`), so a decode step quantizes x once and syncs the threads once."""
    groups: dict = {}
    for i, m in enumerate(layers):
        key = (type(m), m.fuse_key()) if hasattr(m, "fuse_key") else i
        groups.setdefault(key, []).append(i)
    out = [None] * len(layers)
    for idx in groups.values():
        ys = type(layers[idx[0]]).many(x, [layers[i] for i in idx]) if len(idx) > 1 else [layers[idx[0]](x)]
        for i, y in zip(idx, ys):
            out[i] = y
    return out


_ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, "tanh")}


def attention(q, k, v, mask, scale):
    """q (T, H, hd), k/v (Hkv, L, hd), additive mask (T, L) -> (T, H * hd); GQA when Hkv < H."""
    T, H, hd = q.shape
    o = F.scaled_dot_product_attention(q.permute_dims((1, 0, 2)), k, v, mask=mask, scale=scale)
    return o.permute_dims((1, 0, 2)).reshape(T, H * hd)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        self.c = c
        d, hd = c.hidden_size, c.head_dim
        self.q_proj = _linear(d, c.num_heads * hd, c.qkv_bias)
        self.k_proj = _linear(d, c.num_kv_heads * hd, c.qkv_bias)
        self.v_proj = _linear(d, c.num_kv_heads * hd, c.qkv_bias)
        self.o_proj = _linear(c.num_heads * hd, d, c.o_bias)
        if c.qk_norm:
            self.q_norm = nn.RMSNorm(hd, c.rms_norm_eps)
            self.k_norm = nn.RMSNorm(hd, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache, pos, L):
        c = self.c
        T = x.shape[0]
        q, k, v = project(x, self.q_proj, self.k_proj, self.v_proj)
        q = q.reshape(T, c.num_heads, c.head_dim)
        k = k.reshape(T, c.num_kv_heads, c.head_dim)
        v = v.reshape(T, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rope.apply(q, cos, sin, c.rotary_dim, c.rope_interleaved)
        k = rope.apply(k, cos, sin, c.rotary_dim, c.rope_interleaved)
        kc, vc = cache
        kc = ex.slice_update(kc, k.permute_dims((1, 0, 2)), pos, axis=1)[:, :L]
        vc = ex.slice_update(vc, v.permute_dims((1, 0, 2)), pos, axis=1)[:, :L]
        return self.o_proj(attention(q, kc, vc, mask, c.attn_scale or c.head_dim ** -0.5))


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        self.act = _ACTS[c.hidden_act]
        d, f = c.hidden_size, c.intermediate_size
        if c.fused_gate_up:
            self.gate_up_proj = _linear(d, 2 * f, c.mlp_bias)
        else:
            self.gate_proj = _linear(d, f, c.mlp_bias)
            self.up_proj = _linear(d, f, c.mlp_bias)
        self.down_proj = _linear(f, d, c.mlp_bias)

    def forward(self, x):
        if hasattr(self, "gate_up_proj"):
            gu = self.gate_up_proj(x)
            f = gu.shape[-1] // 2
            g, u = gu[..., :f], gu[..., f:]
        else:
            g, u = project(x, self.gate_proj, self.up_proj)
        return self.down_proj(self.act(g) * u)


# the norms around attention and MLP: (after attention, before the MLP, after the MLP), by family
_NORMS = {"glm4": ("post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"),
          "gemma3": ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")}
_PLAIN = (None, "post_attention_layernorm", None)


class Block(nn.Module):
    def __init__(self, c: ModelConfig):
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = nn.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self._norms = _NORMS.get(c.family, _PLAIN) if c.sandwich_norm else _PLAIN
        for name in self._norms:
            if name:
                setattr(self, name, nn.RMSNorm(c.hidden_size, c.rms_norm_eps))

    def forward(self, h, cos, sin, mask, cache, pos, L):
        post_attn, pre_mlp, post_mlp = (getattr(self, n) if n else (lambda x: x) for n in self._norms)
        h = h + post_attn(self.self_attn(self.input_layernorm(h), cos, sin, mask, cache, pos, L))
        return h + post_mlp(self.mlp(pre_mlp(h)))


class Decoder(nn.Module):
    def __init__(self, c: ModelConfig):
        self.embed_tokens = nn.Embedding.__new__(nn.Embedding)
        self.embed_tokens.weight = ex.zeros((c.vocab_size, c.hidden_size))  # a placeholder until loaded
        self.layers = [Block(c) for _ in range(c.num_layers)]
        self.norm = nn.RMSNorm(c.hidden_size, c.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder + LM head. `step(h, pos, caches, L, last)` is the traced function."""

    def __init__(self, c: ModelConfig):
        self.config = c
        self.model = Decoder(c)
        if not c.tie_word_embeddings:
            self.lm_head = _linear(c.hidden_size, c.vocab_size, False)
        self._rope = None
        self._tied = {}  # the LM head over the embedding when tied (kept out of the parameter tree)

    def head(self):
        return self.lm_head if hasattr(self, "lm_head") else self._tied["head"]

    def rope_tables(self, n, local=False):
        """cos/sin tables for n positions (`local`: the sliding-window layers' own rope base)."""
        if self._rope is None or self._rope[0][0].shape[0] < n:
            c = self.config
            lc = dataclasses.replace(c, rope_theta=c.rope_theta_local, rope_scaling={}) if c.rope_theta_local else c
            self._rope = tuple(tuple(ex.asarray(t) for t in rope.tables(cfg, n)) for cfg in (c, lc))
        return self._rope[1 if local else 0]

    def step(self, h, pos, caches, L, last=None):
        c = self.config
        T = h.shape[0]
        if c.embed_scale != 1.0:
            h = h * c.embed_scale
        qpos = pos + ex.arange(T)

        def rotary(local):
            cos_t, sin_t = self.rope_tables(caches[0][0].shape[1], local)
            return (ex.take(cos_t, qpos, axis=0).reshape(T, 1, -1), ex.take(sin_t, qpos, axis=0).reshape(T, 1, -1))
        kpos = ex.asarray(np.arange(L, dtype=np.int64).reshape(1, L))
        qcol = qpos.reshape(T, 1)
        causal = kpos <= qcol
        zero, ninf = ex.asarray(np.float32(0)), ex.asarray(np.float32(-np.inf))
        mask = ex.where(causal, zero, ninf)
        local_mask, rot, local_rot = mask, rotary(False), None
        if c.sliding_window is not None and c.sliding_window < L:
            local_mask = ex.where(causal & (kpos > qcol - c.sliding_window), zero, ninf)
        sliding = c.layer_sliding or (True,) * c.num_layers
        if c.rope_theta_local:
            local_rot = rotary(True)
        for layer, cache, sw in zip(self.model.layers, caches, sliding):
            h = layer(h, *(local_rot or rot if sw else rot), local_mask if sw else mask, cache, pos, L)
        h = self.model.norm(h)
        if last is not None:  # only the rows at `last` (int64 indices, a runtime input)
            h = ex.take(h, last, axis=0)
        logits = self.head()(h)
        if c.final_logit_softcap:
            logits = ex.tanh(logits * (1.0 / c.final_logit_softcap)) * c.final_logit_softcap
        return logits
