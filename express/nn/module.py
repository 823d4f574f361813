"""`Module`: a tree of parameters (Tensors) and child modules, in the MLX style.

Attributes that are Tensors are parameters, attributes that are Modules (or lists of Modules)
are children; `parameters()` returns the nested dict, `named_parameters()` the flat
"a.b.weight" view that weight files use."""
from __future__ import annotations

import os

import numpy as np

from .. import dtypes as dt
from ..errors import ModelError, ShapeError
from ..ops.elementwise import astype as _astype
from ..tensor import Tensor, as_numpy, constant


class Module:
    """Base class of layers and models: subclasses set parameters/children in `__init__` and
    implement `forward`.

    >>> import express as ex, express.nn as nn
    >>> m = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    >>> sorted(m.named_parameters())
    ['0.bias', '0.weight', '1.bias', '1.weight']
    >>> m(ex.ones((3, 4))).shape
    (3, 2)
    """

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def children(self) -> dict:
        out = {}
        for k, v in vars(self).items():
            if isinstance(v, Module):
                out[k] = v
            elif isinstance(v, (list, tuple)) and v and all(isinstance(m, Module) for m in v):
                out[k] = list(v)
        return out

    def parameters(self) -> dict:
        """Nested dict of this module's parameters (lists of children become lists)."""
        out = {k: v for k, v in vars(self).items() if isinstance(v, Tensor)}
        for k, c in self.children().items():
            out[k] = [m.parameters() for m in c] if isinstance(c, list) else c.parameters()
        return out

    def named_parameters(self, prefix: str = "") -> dict:
        """Flat dict "child.name" -> Tensor."""
        out = {prefix + k: v for k, v in vars(self).items() if isinstance(v, Tensor)}
        for k, c in self.children().items():
            if isinstance(c, list):
                for i, m in enumerate(c):
                    out.update(m.named_parameters(f"{prefix}{k}.{i}."))
            else:
                out.update(c.named_parameters(f"{prefix}{k}."))
        return out

    def _set(self, name: str, value: Tensor):
        *path, leaf = name.split(".")
        obj = self
        for p in path:
            obj = obj[int(p)] if p.isdigit() else getattr(obj, p)  # ModuleList/list entries by index
        setattr(obj, leaf, value)

    def update(self, params: dict, strict: bool = True) -> "Module":
        """Replace parameters from a flat dict name -> Tensor/array (shapes must match)."""
        mine = self.named_parameters()
        unknown = sorted(set(params) - set(mine))
        if strict and unknown:
            raise ModelError(f"{type(self).__name__}: unexpected parameters {unknown[:5]}"
                             f"{' ...' if len(unknown) > 5 else ''}")
        for k, v in params.items():
            if k not in mine:
                continue
            t = v if isinstance(v, Tensor) else constant(as_numpy(v))
            if t.shape != mine[k].shape:
                raise ShapeError(f"{type(self).__name__}: parameter {k!r} has shape {mine[k].shape}, "
                                 f"the weights have {t.shape}")
            self._set(k, t)
        return self

    def load_weights(self, weights, strict: bool = True) -> "Module":
        """Load weights from a safetensors file (memory-mapped) or a dict name -> array/Tensor.

        With `strict`, every parameter must be present and no extra name may appear."""
        if isinstance(weights, (str, os.PathLike)):
            from ..io import load
            weights = load(weights)
        if strict:
            missing = sorted(set(self.named_parameters()) - set(weights))
            if missing:
                raise ModelError(f"{type(self).__name__}: weights lack {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        return self.update(weights, strict=strict)

    def astype(self, dtype) -> "Module":
        """Convert floating-point parameters to `dtype` (e.g. float16 to halve memory)."""
        d = dt.as_dtype(dtype)
        for k, v in self.named_parameters().items():
            if v.dtype.is_float and v.dtype is not d:
                y = _astype(v, d)
                y.numpy()
                self._set(k, y)
        return self

    def quantize(self, bits: int = 4, group_size: int = 64, predicate=None) -> "Module":
        """Swap the Linear layers for int8/int4 `QuantizedLinear` (weights stay packed, expanded
        inside the GEMM); see `express.nn.quantized.quantize`."""
        from .quantized import quantize
        return quantize(self, bits, group_size, predicate)

    def num_parameters(self) -> int:
        return int(sum(v.size for v in self.named_parameters().values()))

    def __repr__(self):
        kids = self.children()
        if not kids:
            return f"{type(self).__name__}({self._extra_repr()})"
        lines = []
        for k, c in kids.items():
            for i, m in enumerate(c if isinstance(c, list) else [c]):
                name = f"{k}.{i}" if isinstance(c, list) else k
                lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return f"{type(self).__name__}(\n" + "\n".join(lines) + "\n)"

    def _extra_repr(self) -> str:
        return ", ".join(f"{k}={tuple(v.shape)}" for k, v in vars(self).items() if isinstance(v, Tensor))


def init_uniform(shape, fan_in: int) -> Tensor:
    """PyTorch's default layer init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from ex.random."""
    from .. import random
    bound = 1.0 / np.sqrt(max(fan_in, 1))
    return random.uniform(shape, -bound, bound)
