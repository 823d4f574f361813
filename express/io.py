"""Saving and loading tensors: safetensors files (memory-mapped on load)."""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from .dtypes import np_dtype
from .errors import ModelError
from .tensor import Tensor, as_numpy, constant


def save(path, tensors) -> None:
    """Save a dict of tensors (or one tensor, as "tensor") to a safetensors file."""
    from safetensors.numpy import save_file
    if isinstance(tensors, Tensor) or isinstance(tensors, np.ndarray):
        tensors = {"tensor": tensors}
    if not isinstance(tensors, dict) or not all(isinstance(k, str) for k in tensors):
        raise ModelError("save: expected a dict of name -> tensor")
    arrays = {k: np.ascontiguousarray(v.numpy() if isinstance(v, Tensor) else as_numpy(v)) for k, v in tensors.items()}
    save_file(arrays, os.fspath(path))


_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I8": "int8", "U8": "uint8",
              "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32", "I64": "int64", "BOOL": "bool"}


def read_safetensors(path) -> dict:
    """name -> read-only NumPy view into the memory-mapped safetensors file `path` (nothing is
    read until used; a tensor whose offset is not aligned to its item size is copied)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > os.path.getsize(path) - 8:
                raise ValueError(f"header of {n} bytes is longer than the file")
            header = json.loads(f.read(n))
        buf = np.memmap(path, np.uint8, mode="r") if os.path.getsize(path) > 8 + n else np.zeros(0, np.uint8)
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info.get("dtype") not in _ST_DTYPES:
                raise ModelError(f"{path!r}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
            dtype = np_dtype(_ST_DTYPES[info["dtype"]])
            a, b = info["data_offsets"]
            if not 0 <= a <= b <= len(buf) - 8 - n or (b - a) != dtype.itemsize * int(np.prod(info["shape"])):
                raise ModelError(f"{path!r}: tensor {name!r} lies outside the file or does not match its shape")
            raw = buf[8 + n + a:8 + n + b]
            out[name] = (raw.view(dtype) if (8 + n + a) % dtype.itemsize == 0 else raw.copy().view(dtype)).reshape(info["shape"])
        return out
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise ModelError(f"{path!r} is not a valid safetensors file: {e}") from None


def load(path) -> dict:
    """Load a safetensors file as a dict of name -> Tensor (weights memory-mapped, not copied), or an
    Express model file (`.exm`) as a model with `.run`/`__call__` (see express.exm)."""
    path = os.fspath(path)
    if path.endswith(".exm"):
        from .exm import load_model
        return load_model(path)
    if not os.path.isfile(path):
        raise ModelError(f"load: no such file {path!r}")
    return {k: constant(as_numpy(v)) for k, v in read_safetensors(path).items()}
