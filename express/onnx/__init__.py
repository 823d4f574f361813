"""ONNX import: `ex.onnx.load(path_or_bytes)` gives a `Model` with `.inputs`, `.outputs`,
`.run(feeds)`, lazy `__call__` on Tensors and `.save(path.exm, quant_bits=None)`.

Every ONNX op type maps to a composition of Express ops in one table (express/onnx/ops.py); graph
passes on import (express/onnx/passes.py) fold constants and recognize fused patterns.
"""
from __future__ import annotations

from .ir import ValueInfo  # noqa: F401
from .model import Model
from .ops import OPS  # noqa: F401


def load(src, optimize: bool = True) -> Model:
    """Import an ONNX model from a path, bytes, or an `onnx.ModelProto`.

    Raises `ex.ModelError` for a file that is not a valid ONNX model (truncated, not a protobuf,
    external data outside the model's folder) or that uses an op Express does not support.
    """
    from .proto import read_model
    return Model(read_model(src), optimize=optimize)
