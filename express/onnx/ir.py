"""The importer's graph: plain Python objects (no protobuf), shared by the ONNX reader, the graph
passes, the interpreter and the .exm format (which loads without the `onnx` package)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError

# ONNX TensorProto.DataType -> the name of the NumPy dtype of its values (None: no NumPy/Express
# counterpart); express.dtypes.np_dtype gives the dtype
ONNX_NP = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: None,
           9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: None, 15: None, 16: "bfloat16"}
ONNX_NAMES = {0: "undefined", 1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
              7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
              14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz",
              19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1"}


def express_dtype(code: int, what: str = "") -> dt.DType:
    """The Express dtype an ONNX element type computes in (float64 narrows to float32, int16 widens)."""
    npd = ONNX_NP.get(code)
    if npd is None:
        raise DTypeError(f"{what}: ONNX element type {ONNX_NAMES.get(code, code)} is not supported")
    return dt.from_numpy(dt.np_dtype(npd))


@dataclass
class ValueInfo:
    """A graph input or output: `shape` holds ints for fixed dims and names (str) or None for dynamic
    ones; `dtype` is the Express dtype (None where the model does not say)."""
    name: str
    shape: tuple | None
    dtype: dt.DType | None

    def __repr__(self):
        return f"ValueInfo({self.name!r}, shape={self.shape}, dtype={self.dtype.name if self.dtype else None})"


@dataclass
class Node:
    op_type: str
    inputs: list            # value names; "" for an omitted optional input
    outputs: list
    attrs: dict             # name -> int | float | str | bytes | np.ndarray | Graph | list of those
    name: str = ""
    domain: str = ""

    def describe(self) -> str:
        return f"{self.op_type} node {self.name!r}" if self.name else f"{self.op_type} node (outputs {self.outputs})"


@dataclass
class Graph:
    nodes: list
    inputs: list            # ValueInfo (initializers excluded)
    outputs: list           # ValueInfo
    initializers: dict = field(default_factory=dict)   # name -> np.ndarray
    name: str = "graph"


@dataclass
class ModelIR:
    graph: Graph
    opsets: dict            # domain -> version ("" is the default ONNX domain)
    producer: str = ""
    metadata: dict = field(default_factory=dict)

    @property
    def opset(self) -> int:
        return self.opsets.get("", self.opsets.get("ai.onnx", 21))
