"""The CLIP text encoder (transformers' CLIPTextModel): SD 1.x uses OpenAI ViT-L/14's
(768 wide, 12 layers, quick_gelu), SD 2.x OpenCLIP ViT-H/14's (1024 wide, 23 layers kept, gelu)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

import express as ex
import express.nn as nn
import express.nn.functional as F
from express import ModelError

from .attention import attention
from .layers import Embedding, Linear


@dataclass
class CLIPTextConfig:
    vocab_size: int = 49408
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    eos_token_id: int = 49407

    @classmethod
    def from_dict(cls, d: dict) -> "CLIPTextConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _act(name):
    if name == "quick_gelu":
        return lambda x: x * F.sigmoid(x * 1.702)
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    raise ModelError(f"CLIPTextModel: hidden_act {name!r} is not supported (quick_gelu, gelu, gelu_new)")


class _Attention(nn.Module):
    def __init__(self, c: CLIPTextConfig):
        w = c.hidden_size
        self.heads = c.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (Linear(w, w) for _ in range(4))

    def forward(self, x):
        return self.out_proj(attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.heads, causal=True))


class _MLP(nn.Module):
    def __init__(self, c: CLIPTextConfig):
        self.fc1 = Linear(c.hidden_size, c.intermediate_size)
        self.fc2 = Linear(c.intermediate_size, c.hidden_size)
        self.act = _act(c.hidden_act)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _Layer(nn.Module):
    def __init__(self, c: CLIPTextConfig):
        self.self_attn, self.mlp = _Attention(c), _MLP(c)
        self.layer_norm1 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.layer_norm2 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x):
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class _Embeddings(nn.Module):
    def __init__(self, c: CLIPTextConfig):
        self.token_embedding = Embedding(c.vocab_size, c.hidden_size)
        self.position_embedding = Embedding(c.max_position_embeddings, c.hidden_size)

    def forward(self, ids):
        n = ids.shape[1]
        return self.token_embedding(ids) + self.position_embedding.weight[:n]


class _Encoder(nn.Module):
    def __init__(self, c: CLIPTextConfig):
        self.layers = [_Layer(c) for _ in range(c.num_hidden_layers)]


class _TextTransformer(nn.Module):
    def __init__(self, c: CLIPTextConfig):
        self.embeddings, self.encoder = _Embeddings(c), _Encoder(c)
        self.final_layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)


class CLIPTextModel(nn.Module):
    """Token ids [batch, tokens] -> hidden states [batch, tokens, hidden_size].

    `clip_skip=k` takes the output of the k-th layer from the end (then the final layer norm), as
    diffusers' pipelines do; `clip_skip=None` is the last layer.

    >>> import numpy as np
    >>> m = CLIPTextModel(CLIPTextConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
    ...                                  num_hidden_layers=2, num_attention_heads=4))
    >>> m(np.zeros((1, 77), np.int64)).shape
    (1, 77, 32)
    """

    def __init__(self, config: CLIPTextConfig | dict | None = None):
        c = config if isinstance(config, CLIPTextConfig) else CLIPTextConfig.from_dict(config or {})
        self.config = c
        self.text_model = _TextTransformer(c)

    def forward(self, input_ids, clip_skip: int | None = None, pooled: bool = False):
        ids = np.asarray(input_ids, np.int64) if not isinstance(input_ids, ex.Tensor) else input_ids
        c, tm = self.config, self.text_model
        if ids.ndim != 2 or ids.shape[1] > c.max_position_embeddings:
            raise ModelError(f"CLIPTextModel: input ids must be [batch, <= {c.max_position_embeddings}], "
                             f"got shape {tuple(ids.shape)}")
        layers = tm.encoder.layers
        if clip_skip is not None and not 0 <= clip_skip < len(layers):
            raise ModelError(f"CLIPTextModel: clip_skip {clip_skip} is out of range for {len(layers)} layers")
        keep = len(layers) - (clip_skip or 0)
        x = tm.embeddings(ex.asarray(ids))
        for layer in layers[:keep]:
            x = layer(x)
        x = tm.final_layer_norm(x)
        if not pooled:
            return x
        ids_np = np.asarray(ids)
        eos = (ids_np == c.eos_token_id).argmax(-1) if c.eos_token_id != 2 else ids_np.argmax(-1)
        return x, x[np.arange(ids_np.shape[0]), eos]

    def sanitize(self, weights: dict) -> dict:
        """Drop buffers that are not parameters (position_ids); accept names with or without the
        "text_model." prefix (older and newer transformers write either)."""
        return {(k if k.startswith("text_model.") else "text_model." + k): v for k, v in weights.items()
                if not k.endswith("position_ids") and not k.startswith("text_projection")}
