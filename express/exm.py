"""Express's own model format (.exm): the imported graph as JSON plus its weights, in one file laid
out like safetensors (8-byte header length, JSON header, aligned raw tensors), so the weights are
memory-mapped on load and the file opens without the `onnx` package.

Weights may be stored int8 (one scale per row) or int4 (one scale per group of `group_size`
values along the last axis, two values a byte); they are dequantized to float32 on load.

    import express as ex, express.onnx
    ex.onnx.load("model.onnx").save("model.exm", quant_bits=8)
    m = ex.load("model.exm")          # no onnx needed; weights memory-mapped
    m.run({"x": x})
"""
from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np

from .errors import ModelError

MAGIC = "express.exm"
VERSION = 1
_ST = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16",
       np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
       np.dtype(np.bool_): "BOOL", np.dtype(np.float64): "F64", np.dtype(np.int16): "I16",
       np.dtype(np.uint16): "U16", np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64"}
_NP = {v: k for k, v in _ST.items()}
_MIN_QUANT = 1024   # float tensors smaller than this stay float


# ---- quantization ----
def quantize(w: np.ndarray, bits: int, group_size: int):
    """Symmetric int8 (per row) or int4 (per group along the last axis) of a float array."""
    rows = w.reshape(-1, w.shape[-1]).astype(np.float32)
    g = w.shape[-1] if bits == 8 or w.shape[-1] % group_size else group_size
    grouped = rows.reshape(rows.shape[0], -1, g)
    qmax = 127 if bits == 8 else 7
    scale = np.abs(grouped).max(axis=2, keepdims=True) / qmax
    scale[scale == 0] = 1.0
    q = np.clip(np.round(grouped / scale), -qmax - (bits == 4), qmax).astype(np.int8)
    if bits == 4:
        u = (q.reshape(-1) + 8).astype(np.uint8)
        if u.size % 2:
            u = np.concatenate([u, np.zeros(1, np.uint8)])
        q = (u[0::2] | (u[1::2] << 4)).astype(np.uint8)
    return q, scale.reshape(rows.shape[0], -1).astype(np.float32), g


def dequantize(q, scale, shape, bits, g):
    n = int(np.prod(shape))
    if bits == 4:
        u = np.empty(q.size * 2, np.int8)
        u[0::2] = (q & 0xF).astype(np.int8) - 8
        u[1::2] = (q >> 4).astype(np.int8) - 8
        q = u[:n]
    vals = q.reshape(scale.shape[0], -1, g).astype(np.float32) * scale[:, :, None]
    return vals.reshape(shape)


# ---- graph <-> JSON ----
class _Writer:
    def __init__(self, bits, group_size):
        self.tensors, self.bits, self.group_size = {}, bits, group_size
        self.stats = {"quantized": 0, "float_bytes": 0, "max_rel_error": 0.0}

    def add(self, a: np.ndarray, weight=False) -> dict:
        key = f"t{len(self.tensors)}"
        a = np.asarray(a)
        if a.dtype.kind in "OUS":
            return {"strings": a.reshape(-1).tolist(), "shape": list(a.shape)}
        if (weight and self.bits and a.dtype in (np.float32, np.float16) and a.ndim >= 2
                and a.size >= _MIN_QUANT):
            q, scale, g = quantize(a, self.bits, self.group_size)
            back = dequantize(q, scale, a.shape, self.bits, g)
            err = float(np.abs(back - a).max() / max(float(np.abs(a).max()), 1e-12))
            self.stats["max_rel_error"] = max(self.stats["max_rel_error"], err)
            self.stats["quantized"] += 1
            self.stats["float_bytes"] += a.nbytes
            self.tensors[key + ".q"], self.tensors[key + ".s"] = q, scale
            return {"q": key, "bits": self.bits, "group": g, "shape": list(a.shape), "dtype": _ST[a.dtype]}
        self.tensors[key] = np.ascontiguousarray(a)
        return {"t": key}

    def attr(self, v):
        from .onnx.ir import Graph
        if isinstance(v, bool) or isinstance(v, (int, np.integer)):
            return {"i": int(v)}
        if isinstance(v, float):
            return {"f": v}
        if isinstance(v, str):
            return {"s": v}
        if isinstance(v, np.ndarray):
            return {"tensor": self.add(v)}
        if isinstance(v, Graph):
            return {"g": self.graph(v)}
        if isinstance(v, list):
            return {"list": [self.attr(x) for x in v]}
        raise ModelError(f"exm: cannot store an attribute of type {type(v).__name__}")

    def graph(self, g) -> dict:
        return {"name": g.name,
                "inputs": [_vi(v) for v in g.inputs], "outputs": [_vi(v) for v in g.outputs],
                "initializers": {k: self.add(a, weight=True) for k, a in g.initializers.items()},
                "nodes": [{"op": n.op_type, "domain": n.domain, "name": n.name, "in": n.inputs, "out": n.outputs,
                           "attrs": {k: self.attr(v) for k, v in n.attrs.items()}} for n in g.nodes]}


def _vi(v):
    return {"name": v.name, "shape": None if v.shape is None else list(v.shape),
            "dtype": v.dtype.name if v.dtype is not None else None}


class _Reader:
    def __init__(self, arrays, path):
        self.arrays, self.path = arrays, path

    def tensor(self, d):
        try:
            if "t" in d:
                return self.arrays[d["t"]]
            if "q" in d:
                a = dequantize(self.arrays[d["q"] + ".q"], self.arrays[d["q"] + ".s"], tuple(d["shape"]),
                               d["bits"], d["group"])
                return a.astype(_NP[d["dtype"]])
            if "strings" in d:
                return np.array(d["strings"], dtype=object).reshape(d["shape"])
        except (KeyError, ValueError, TypeError) as e:
            raise ModelError(f"exm: {self.path!r}: a tensor entry is corrupt ({e})") from None
        raise ModelError(f"exm: {self.path!r}: unknown tensor entry {d}")

    def attr(self, d):
        (k, v), = d.items()
        if k in ("i", "f", "s"):
            return v
        if k == "tensor":
            return self.tensor(v)
        if k == "g":
            return self.graph(v)
        if k == "list":
            return [self.attr(x) for x in v]
        raise ModelError(f"exm: {self.path!r}: unknown attribute entry {k!r}")

    def graph(self, d):
        from . import dtypes as dt
        from .onnx.ir import Graph, Node, ValueInfo

        def vi(x):
            return ValueInfo(x["name"], None if x["shape"] is None else tuple(x["shape"]),
                             dt.as_dtype(x["dtype"]) if x["dtype"] else None)
        return Graph([Node(n["op"], n["in"], n["out"], {k: self.attr(v) for k, v in n["attrs"].items()}, n["name"],
                           n["domain"]) for n in d["nodes"]],
                     [vi(x) for x in d["inputs"]], [vi(x) for x in d["outputs"]],
                     {k: self.tensor(v) for k, v in d["initializers"].items()}, d["name"])


# ---- the file ----
def write(path, meta: dict, tensors: dict) -> int:
    header, offset, order = {}, 0, []
    for k, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype not in _ST:
            raise ModelError(f"exm: cannot store a tensor of dtype {a.dtype}")
        pad = (-offset) % 64
        offset += pad
        header[k] = {"dtype": _ST[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        order.append((pad, a))
        offset += a.nbytes
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h) - 8) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for pad, a in order:
            f.write(b"\0" * pad)
            f.write(a.tobytes())
    return os.path.getsize(path)


def read(path):
    """(metadata, {name: memory-mapped array}) of an .exm file; ModelError if it is not one."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelError(f"load: no such file {path!r}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"load: {path!r} is not an .exm file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 1 << 30:
            raise ModelError(f"load: {path!r} is not an .exm file or is truncated (header length {n})")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise ModelError(f"load: {path!r} is not an .exm file (corrupt header)") from None
    meta = header.pop("__metadata__", None) if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != MAGIC:
        raise ModelError(f"load: {path!r} is not an .exm file (no {MAGIC} metadata)")
    base = 8 + n
    arrays = {}
    for k, d in header.items():
        try:
            npd = _NP[d["dtype"]]
            start, stop = d["data_offsets"]
            shape = tuple(int(s) for s in d["shape"])
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"load: {path!r}: tensor {k!r} has a corrupt entry") from None
        count = int(np.prod(shape, dtype=np.int64))
        if stop - start != count * np.dtype(npd).itemsize or base + stop > size or start < 0:
            raise ModelError(f"load: {path!r} is truncated or corrupt (tensor {k!r})")
        arrays[k] = np.memmap(path, npd, "r", base + start, shape) if count else np.zeros(shape, npd)
    return meta, arrays


def save_model(model, path, quant_bits=None, group_size=64) -> dict:
    """Write an imported model (express.onnx.Model) as .exm; returns sizes and quantization stats."""
    if quant_bits not in (None, 4, 8):
        raise ModelError(f"save: quant_bits must be None, 8 or 4, got {quant_bits!r}")
    w = _Writer(quant_bits, group_size)
    g = w.graph(model.ir.graph)
    meta = {"format": MAGIC, "version": str(VERSION),
            "model": json.dumps({"graph": g, "opsets": model.ir.opsets, "producer": model.ir.producer,
                                 "metadata": model.ir.metadata}, separators=(",", ":"))}
    nbytes = write(os.fspath(path), meta, w.tensors)
    return {"path": os.fspath(path), "bytes": nbytes, **w.stats}


def load_model(path):
    """Load an .exm file as an express.onnx.Model (weights memory-mapped; `onnx` not needed)."""
    from .onnx.ir import ModelIR
    from .onnx.model import Model
    meta, arrays = read(path)
    if int(meta.get("version", 0)) > VERSION:
        raise ModelError(f"load: {path!r} is .exm version {meta['version']}; this Express reads up to {VERSION}")
    try:
        m = json.loads(meta["model"])
        r = _Reader(arrays, os.fspath(path))
        ir = ModelIR(r.graph(m["graph"]), {k: int(v) for k, v in m["opsets"].items()}, m.get("producer", ""),
                     m.get("metadata", {}))
    except ModelError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ModelError(f"load: {path!r}: corrupt model description ({type(e).__name__}: {e})") from None
    return Model(ir, optimize=False)
