"""Layers: thin Modules over express.nn.functional (weights in PyTorch's layouts, so state dicts
load as they are)."""
from __future__ import annotations

from ..ops.creation import ones, zeros
from . import functional as F
from .module import Module, init_uniform


class Linear(Module):
    """y = x @ weight.T + bias, weight of shape (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        self.weight = init_uniform((out_features, in_features), in_features)
        self.bias = init_uniform((out_features,), in_features) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Embedding(Module):
    """Rows of `weight` (num_embeddings, dim) at integer ids."""

    def __init__(self, num_embeddings: int, dim: int):
        from .. import random
        self.weight = random.normal((num_embeddings, dim))

    def forward(self, ids):
        return F.embedding(ids, self.weight)


class LayerNorm(Module):
    def __init__(self, dims, eps: float = 1e-5, affine: bool = True):
        self.dims = (dims,) if isinstance(dims, int) else tuple(dims)
        self.eps = eps
        self.weight = ones(self.dims) if affine else None
        self.bias = zeros(self.dims) if affine else None

    def forward(self, x):
        return F.layer_norm(x, self.dims, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, dims: int, eps: float = 1e-6):
        self.eps = eps
        self.weight = ones((dims,))

    def forward(self, x):
        return F.rms_norm(x, self.weight, self.eps)


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        self.num_groups, self.eps = num_groups, eps
        self.weight = ones((num_channels,)) if affine else None
        self.bias = zeros((num_channels,)) if affine else None

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class ModuleList(Module):
    """A list of modules; parameters are named "0.weight", "1.bias", ... as in PyTorch."""

    def __init__(self, modules=()):
        self.layers = list(modules)

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def append(self, m):
        self.layers.append(m)

    def named_parameters(self, prefix: str = "") -> dict:
        out = {}
        for i, m in enumerate(self.layers):
            out.update(m.named_parameters(f"{prefix}{i}."))
        return out

    def parameters(self) -> list:
        return [m.parameters() for m in self.layers]


class Sequential(ModuleList):
    """Modules applied in order."""

    def __init__(self, *layers):
        super().__init__(layers)

    def forward(self, x):
        for m in self.layers:
            x = m(x)
        return x


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class SiLU(Module):
    def forward(self, x):
        return F.silu(x)


