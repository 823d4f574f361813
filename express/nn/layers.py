"""Layers: thin Modules over express.nn.functional (weights in PyTorch's layouts, so state dicts
load as they are)."""
from __future__ import annotations

import numpy as np

from ..ops.creation import ones, zeros
from ..ops.shape import reshape
from ..tensor import constant
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


class ReLU6(Module):
    def forward(self, x):
        return F.relu6(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class Identity(Module):
    """Returns its input (also stands in for layers that do nothing at inference)."""

    def __init__(self, *args, **kwargs):
        pass

    def forward(self, x):
        return x


class Dropout(Identity):
    """Inference: the identity."""


class Flatten(Module):
    def __init__(self, start_dim: int = 1):
        self.start_dim = start_dim

    def forward(self, x):
        return reshape(x, x.shape[:self.start_dim] + (-1,))


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class Conv2d(Module):
    """2-D convolution, weight (out, in / groups, kh, kw) and bias (out,) as PyTorch's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True):
        k = _pair(kernel_size)
        fan_in = in_channels // groups * k[0] * k[1]
        self.weight = init_uniform((out_channels, in_channels // groups) + k, fan_in)
        self.bias = init_uniform((out_channels,), fan_in) if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2d(Module):
    """Transposed 2-D convolution, weight (in, out / groups, kh, kw) as PyTorch's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1):
        k = _pair(kernel_size)
        fan_in = out_channels // groups * k[0] * k[1]
        self.weight = init_uniform((in_channels, out_channels // groups) + k, fan_in)
        self.bias = init_uniform((out_channels,), fan_in) if bias else None
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.groups, self.dilation = groups, dilation

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class BatchNorm2d(Module):
    """Inference batch norm with running statistics; parameter names as PyTorch's state dict."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        self.eps = eps
        self.weight = ones((num_features,)) if affine else None
        self.bias = zeros((num_features,)) if affine else None
        self.running_mean = zeros((num_features,))
        self.running_var = ones((num_features,))
        self.num_batches_tracked = constant(np.zeros((), np.int64))

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.eps)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)
