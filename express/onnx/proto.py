"""Reading an ONNX ModelProto (through the `onnx` package) into the importer's graph (ir.py).

External data is read from files next to the model, memory-mapped; a location that leaves the
model's folder (an absolute path, `..`, a symlink out) is refused."""
from __future__ import annotations

import os

import numpy as np

from ..dtypes import np_dtype
from ..errors import ModelError
from .ir import ONNX_NAMES, ONNX_NP, Graph, ModelIR, Node, ValueInfo, express_dtype


def read_model(src) -> ModelIR:
    """Parse `src` (a path, bytes, or an onnx.ModelProto) into a ModelIR."""
    try:
        import onnx
        from google.protobuf.message import DecodeError
    except ImportError:  # pragma: no cover - onnx is a dependency
        raise ModelError("reading .onnx files needs the `onnx` package (pip install onnx)") from None
    base, what = None, "<bytes>"
    if isinstance(src, onnx.ModelProto):
        proto, what = src, "<ModelProto>"
    else:
        if isinstance(src, (bytes, bytearray, memoryview)):
            data = bytes(src)
        else:
            what = os.fspath(src)
            if not os.path.isfile(what):
                raise ModelError(f"onnx.load: no such file {what!r}")
            base = os.path.dirname(os.path.abspath(what))
            with open(what, "rb") as f:
                data = f.read()
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ModelError(f"onnx.load: {what} is not a valid ONNX model (truncated or not a protobuf): {e}") from None
    if not proto.HasField("graph") or not proto.graph.output:
        raise ModelError(f"onnx.load: {what} is not an ONNX model (no graph with outputs)")
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): int(o.version) for o in proto.opset_import}
    if not opsets:
        raise ModelError(f"onnx.load: {what} declares no opset (opset_import is empty)")
    reader = _Reader(base, what)
    try:
        g = reader.graph(proto.graph)
    except ModelError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OSError, AttributeError) as e:
        raise ModelError(f"onnx.load: {what} is malformed: {type(e).__name__}: {e}") from None
    meta = {p.key: p.value for p in proto.metadata_props}
    return ModelIR(g, opsets, proto.producer_name, meta)


class _Reader:
    def __init__(self, base, what):
        self.base, self.what = base, what

    def graph(self, gp) -> Graph:
        inits = {t.name: self.tensor(t) for t in gp.initializer}
        for sp in gp.sparse_initializer:
            inits[sp.values.name] = self.sparse(sp)
        nodes = [Node(n.op_type, list(n.input), list(n.output), {a.name: self.attr(a) for a in n.attribute},
                      n.name, n.domain if n.domain != "ai.onnx" else "") for n in gp.node]
        inputs = [self.value_info(v) for v in gp.input if v.name not in inits]
        outputs = [self.value_info(v) for v in gp.output]
        return Graph(nodes, inputs, outputs, inits, gp.name or "graph")

    def value_info(self, v) -> ValueInfo:
        t = v.type
        if t.HasField("tensor_type"):
            tt = t.tensor_type
            shape = None
            if tt.HasField("shape"):
                shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
            try:
                dtype = express_dtype(tt.elem_type, v.name) if tt.elem_type else None
            except Exception:
                dtype = None
            return ValueInfo(v.name, shape, dtype)
        return ValueInfo(v.name, None, None)

    def attr(self, a):
        from onnx import AttributeProto as A
        if a.type == A.FLOAT:
            return float(a.f)
        if a.type == A.INT:
            return int(a.i)
        if a.type == A.STRING:
            return a.s.decode("utf-8", "replace")
        if a.type == A.TENSOR:
            return self.tensor(a.t)
        if a.type == A.GRAPH:
            return self.graph(a.g)
        if a.type == A.SPARSE_TENSOR:
            return self.sparse(a.sparse_tensor)
        if a.type == A.FLOATS:
            return [float(x) for x in a.floats]
        if a.type == A.INTS:
            return [int(x) for x in a.ints]
        if a.type == A.STRINGS:
            return [s.decode("utf-8", "replace") for s in a.strings]
        if a.type == A.TENSORS:
            return [self.tensor(t) for t in a.tensors]
        if a.type == A.GRAPHS:
            return [self.graph(g) for g in a.graphs]
        if a.type == A.TYPE_PROTO:
            return a.tp
        raise ModelError(f"onnx.load: {self.what}: attribute {a.name!r} has an unknown type {a.type}")

    def tensor(self, t) -> np.ndarray:
        from onnx import numpy_helper
        if t.data_location == 1:  # EXTERNAL
            return self.external(t)
        if t.data_type == 8:
            return np.array([s.decode("utf-8", "replace") for s in t.string_data], dtype=object).reshape(tuple(t.dims))
        return numpy_helper.to_array(t)

    def sparse(self, sp) -> np.ndarray:
        values, idx = self.tensor(sp.values), self.tensor(sp.indices)
        dense = np.zeros(tuple(sp.dims), values.dtype)
        if idx.ndim == 1:
            dense.reshape(-1)[idx] = values
        else:
            dense[tuple(idx.T)] = values
        return dense

    def external(self, t) -> np.ndarray:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if self.base is None:
            raise ModelError(f"onnx.load: tensor {t.name!r} keeps its data in external file {loc!r}; load the "
                             "model from its path (not from bytes) so the file can be found")
        parts = loc.replace("\\", "/").split("/")
        if not loc or os.path.isabs(loc) or loc.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
            raise ModelError(f"onnx.load: tensor {t.name!r}: external data location {loc!r} must be a relative "
                             "path inside the model's folder")
        path = os.path.realpath(os.path.join(self.base, loc))
        if os.path.commonpath([path, os.path.realpath(self.base)]) != os.path.realpath(self.base):
            raise ModelError(f"onnx.load: tensor {t.name!r}: external data {loc!r} resolves outside the model's folder")
        if not os.path.isfile(path):
            raise ModelError(f"onnx.load: tensor {t.name!r}: external data file {loc!r} not found next to the model")
        npd = ONNX_NP.get(t.data_type)
        if npd is None:
            raise ModelError(f"onnx.load: tensor {t.name!r}: external data of type "
                             f"{ONNX_NAMES.get(t.data_type, t.data_type)} is not supported")
        npd = np_dtype(npd)
        shape = tuple(int(d) for d in t.dims)
        offset = int(info.get("offset", 0))
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * np.dtype(npd).itemsize
        if "length" in info and int(info["length"]) < nbytes:
            raise ModelError(f"onnx.load: tensor {t.name!r}: external data length {info['length']} is smaller "
                             f"than its shape {shape} needs ({nbytes} bytes)")
        if offset + nbytes > os.path.getsize(path):
            raise ModelError(f"onnx.load: tensor {t.name!r}: external file {loc!r} is too short "
                             f"(needs {offset + nbytes} bytes)")
        if count == 0:
            return np.zeros(shape, npd)
        return np.memmap(path, dtype=npd, mode="r", offset=offset, shape=shape)
