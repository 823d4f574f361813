"""Saving and loading tensors: safetensors files (memory-mapped on load)."""
from __future__ import annotations

import os

import numpy as np

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


def load(path) -> dict:
    """Load a safetensors file as a dict of name -> Tensor (weights memory-mapped, not copied), or an
    Express model file (`.exm`) as a model with `.run`/`__call__` (see express.exm)."""
    if os.fspath(path).endswith(".exm"):
        from .exm import load_model
        return load_model(path)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelError(f"load: no such file {path!r}")
    try:
        arrays = load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelError(f"load: {path!r} is not a valid safetensors file: {e}") from None
    return {k: constant(as_numpy(v)) for k, v in arrays.items()}
