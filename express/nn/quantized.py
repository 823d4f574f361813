"""Quantized layers (low-memory mode): `QuantizedLinear` keeps int8/int4 group-quantized weights
packed and multiplies through `qlinear`; `quantize(module, bits, group_size)` swaps a module's
`Linear` layers for it."""
from __future__ import annotations

import numpy as np

from ..ops.quant import dequantize_weight, qlinear, qlinear_many, quantize_weight
from ..tensor import as_tensor
from .layers import Linear
from .module import Module


class QuantizedLinear(Module):
    """y = x @ dequant(qweight, scales).T + bias, the weights packed (see express.ops.quant).

    >>> import express as ex, express.nn as nn
    >>> lin = nn.Linear(64, 8)
    >>> q = QuantizedLinear.from_linear(lin, bits=8, group_size=32)
    >>> q(ex.ones((2, 64))).shape
    (2, 8)
    """

    def __init__(self, qweight, scales, bias, bits: int, group_size: int, out_features: int):
        self.qweight, self.scales = as_tensor(qweight), as_tensor(scales)
        self.bias = None if bias is None else as_tensor(bias)
        self.bits, self.group_size = int(bits), int(group_size)
        self.in_features = self.scales.shape[1] * self.group_size
        self.out_features = int(out_features)

    @classmethod
    def from_linear(cls, linear: Linear, bits: int = 4, group_size: int = 64) -> "QuantizedLinear":
        q, s = quantize_weight(linear.weight.numpy(), bits, group_size)
        return cls(q, s, linear.bias, bits, group_size, linear.weight.shape[0])

    def dequantized_weight(self) -> np.ndarray:
        return dequantize_weight(self.qweight.numpy(), self.scales.numpy(), self.bits, self.group_size,
                                 self.out_features)

    def forward(self, x):
        return qlinear(x, self.qweight, self.scales, self.bias, bits=self.bits, group_size=self.group_size,
                       out_features=self.out_features)

    def fuse_key(self):
        """Layers of one key that read the same x can run as one kernel call (`many`)."""
        return self.bits, self.group_size, self.in_features

    @staticmethod
    def many(x, layers):
        """[layer(x) for layer in layers] (at most 8, of one `fuse_key`) as one kernel call
        (`qlinear_many`: x quantized once, one pass over the threads)."""
        a = layers[0]
        return qlinear_many(x, [(m.qweight, m.scales, m.bias, m.out_features) for m in layers], bits=a.bits,
                            group_size=a.group_size)


def replace_linears(module: Module, fn, prefix: str = "") -> Module:
    """Replace every `Linear` below `module` by `fn(name, linear)` (in place; None keeps it)."""
    for k, v in list(vars(module).items()):
        if isinstance(v, Linear):
            new = fn(prefix + k, v)
            if new is not None:
                setattr(module, k, new)
        elif isinstance(v, Module):
            replace_linears(v, fn, f"{prefix}{k}.")
        elif isinstance(v, list) and v and all(isinstance(m, Module) for m in v):
            for i, m in enumerate(v):
                if isinstance(m, Linear):
                    new = fn(f"{prefix}{k}.{i}", m)
                    if new is not None:
                        v[i] = new
                else:
                    replace_linears(m, fn, f"{prefix}{k}.{i}.")
    return module


def quantize(module: Module, bits: int = 4, group_size: int = 64, predicate=None) -> Module:
    """Swap the `Linear` layers of `module` (those whose input size `group_size` divides, and for
    which `predicate(name, linear)` is true when given) for `QuantizedLinear`, in place.

    >>> import express.nn as nn
    >>> m = quantize(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 10)), bits=4, group_size=32)
    >>> type(m[0]).__name__
    'QuantizedLinear'
    """
    def swap(name, lin):
        if lin.weight.shape[1] % group_size or (predicate is not None and not predicate(name, lin)):
            return None
        return QuantizedLinear.from_linear(lin, bits, group_size)
    return replace_linears(module, swap)

