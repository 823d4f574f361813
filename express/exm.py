"""Express's own model format (.exm): the imported graph as JSON plus its weights, in one file laid
out like safetensors (8-byte header length, JSON header, aligned raw tensors), so the weights are
memory-mapped on load and the file opens without the `onnx` package.

With `quant_bits=8` or `4`, weights are stored group-quantized (symmetric, one float32 scale per
`group_size` values, 32 or 64, along the input axis; int4 two values a byte):

- the weights of MatMul/Gemm (the `express:Linear` nodes of the imported graph) stay packed after
  loading and run through `express.ops.quant.qlinear`, which expands them inside its kernel
  (`express:QLinear` nodes); embedding tables read by Gather stay packed too, and only the rows
  looked up are expanded (`express:QGather`);
- other float weights of 1024 values or more (convolutions, ...) are stored int8 per row or int4
  per group and expanded to float32 when the file is loaded.

    import express as ex, express.onnx
    ex.onnx.load("model.onnx").save("model.exm", quant_bits=8)
    m = ex.load("model.exm")          # no onnx needed; weights memory-mapped
    m.run({"x": x})
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import replace

import numpy as np

from . import dtypes as dt
from .errors import ModelError

MAGIC = "express.exm"
VERSION = 1
# NumPy dtype names <-> safetensors codes (names: bfloat16's NumPy type needs ml_dtypes)
_ST = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int8": "I8", "uint8": "U8", "int32": "I32",
       "int64": "I64", "bool": "BOOL", "float64": "F64", "int16": "I16", "uint16": "U16", "uint32": "U32",
       "uint64": "U64"}
_NP = {v: k for k, v in _ST.items()}
_MIN_QUANT = 1024   # float tensors smaller than this stay float


# ---- quantization ----
def best_clip(rows: np.ndarray, bits: int, g: int) -> np.ndarray:
    """`rows` (n, k) clipped per group of `g` to the range whose symmetric rounding to `bits` has
    the least squared error (searched over 0.5..1 of each group's absolute maximum)."""
    qmax = 127 if bits == 8 else 7
    out = np.empty(rows.shape, np.float32)
    for r in range(0, rows.shape[0], 4096):
        grp = np.asarray(rows[r:r + 4096], np.float32).reshape(-1, rows.shape[1] // g, g)
        amax = np.abs(grp).max(axis=2, keepdims=True)
        best, best_err = amax, None
        for f in np.linspace(0.5, 1.0, 11):
            lim = amax * f
            s = np.where(lim > 0, lim / qmax, 1.0)
            err = np.square(np.clip(np.rint(grp / s), -qmax - (bits == 4), qmax) * s - grp).sum(axis=2, keepdims=True)
            if best_err is None:
                best_err = err
            else:
                better = err < best_err
                best, best_err = np.where(better, lim, best), np.where(better, err, best_err)
        out[r:r + 4096] = np.clip(grp, -best, best).reshape(-1, rows.shape[1])
    return out


def _divisor(k, group_size):
    """The largest group of at most `group_size` (and at least 8) values dividing `k`, else `k`."""
    return next((d for d in range(min(group_size, k), 7, -1) if k % d == 0), k)


def quantize(w: np.ndarray, bits: int, group_size: int, int8_per_row: bool = True):
    """Symmetric int8 (per output row, or per group) or int4 (per group, clipped by `best_clip`) of
    a float array flattened to (shape[0], -1): (values int8 (rows, k) or uint8 (rows * k / 2) two a
    byte, low nibble first; float32 scales (rows, k / g); g)."""
    rows = np.asarray(w, np.float32).reshape(w.shape[0] if w.ndim > 1 else 1, -1)
    k = rows.shape[1]
    g = k if bits == 8 and int8_per_row else _divisor(k, group_size)
    if bits == 4:
        rows = best_clip(rows, bits, g)
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
        q = np.asarray(q).reshape(-1)
        u = np.empty(q.size * 2, np.int8)
        u[0::2] = (q & 0xF).astype(np.int8) - 8
        u[1::2] = (q >> 4).astype(np.int8) - 8
        q = u[:n]
    vals = q.reshape(scale.shape[0], -1, g).astype(np.float32) * scale[:, :, None]
    return vals.reshape(shape)


# ---- packed weights (kept packed in memory after loading) ----
def _group(k, group_size):
    """The group size of a packed weight with `k` inputs: `group_size`, else 32, else None (not packable)."""
    return group_size if k % group_size == 0 else 32 if k % 32 == 0 else None


def qlinear_layout() -> str:
    """A tag of the packed layout express.ops.quant writes (files record it; a different one is refused)."""
    from .ops.quant import quantize_weight
    q, s = quantize_weight(np.zeros((8, 64), np.float32), 4, 32)
    return f"q{q.dtype}{list(q.shape)}s{s.dtype}{list(s.shape)}"


def pack_graph(g, bits: int, group_size: int, stats: dict):
    """A copy of graph `g` whose Linear weights and Gather tables are group-quantized, packed, and
    read by express:QLinear / express:QGather nodes; returns (graph, names of packed tensors)."""
    from .onnx.ir import Node
    from .onnx.passes import _uses
    from .ops.quant import dequantize_weight, quantize_weight
    uses = _uses(g)
    inits, nodes, packed = dict(g.initializers), [], set()

    def pack(name, w, table=False):   # w: (rows, k) float; a table: rows stay in order (see quantize)
        gs = _group(w.shape[1], group_size)
        if table:
            q, sc, _ = quantize(w, bits, gs, int8_per_row=False)
            q = q.reshape(w.shape[0], -1)
            back = dequantize(q, sc, w.shape, bits, gs)
        else:
            q, sc = quantize_weight(best_clip(w, bits, gs) if bits == 4 else w, bits, gs)
            back = dequantize_weight(q, sc, bits, gs)[:w.shape[0]]
        err = float(np.abs(back - w).max() / max(float(np.abs(w).max()), 1e-12))
        stats["max_rel_error"] = max(stats["max_rel_error"], err)
        stats["quantized"] += 1
        stats["packed"] += 1
        stats["float_bytes"] += w.nbytes
        inits.pop(name, None)
        inits[name + ".q"], inits[name + ".s"] = q, sc
        packed.update((name + ".q", name + ".s"))
        return gs

    gathers = {}
    for n in g.nodes:
        if n.op_type == "Gather" and not n.domain and n.inputs[0] in g.initializers and n.attrs.get("axis", 0) == 0:
            gathers[n.inputs[0]] = gathers.get(n.inputs[0], 0) + 1
    for n in g.nodes:
        w = g.initializers.get(n.inputs[1]) if len(n.inputs) > 1 else None
        if (n.domain == "express" and n.op_type == "Linear" and w is not None and w.ndim == 2
                and w.dtype in (np.float32, np.float16) and uses.get(n.inputs[1]) == 1 and w.size >= _MIN_QUANT):
            wt = np.asarray(w, np.float32) if n.attrs.get("wt", 0) else np.asarray(w, np.float32).T
            if _group(wt.shape[1], group_size):
                gs = pack(n.inputs[1], np.ascontiguousarray(wt))
                nodes.append(Node("QLinear", [n.inputs[0], n.inputs[1] + ".q", n.inputs[1] + ".s"] + n.inputs[2:3],
                                  list(n.outputs), {"bits": bits, "group_size": gs, "out_features": wt.shape[0],
                                                    "activation": n.attrs.get("activation", "")}, n.name, "express"))
                continue
        t = g.initializers.get(n.inputs[0]) if n.inputs else None
        if (n.op_type == "Gather" and not n.domain and t is not None and t.ndim == 2
                and t.dtype in (np.float32, np.float16) and t.size >= _MIN_QUANT
                and gathers.get(n.inputs[0]) == uses.get(n.inputs[0]) and _group(t.shape[1], group_size)):
            name = n.inputs[0]
            gs = pack(name, np.asarray(t, np.float32), table=True) if name + ".q" not in inits \
                else _group(t.shape[1], group_size)
            nodes.append(Node("QGather", [name + ".q", name + ".s", n.inputs[1]], list(n.outputs),
                              {"bits": bits, "group_size": gs, "dtype": dt.from_numpy(t.dtype).name}, n.name,
                              "express"))
            continue
        nodes.append(n)
    return replace(g, nodes=nodes, initializers=inits), packed


# ---- graph <-> JSON ----
class _Writer:
    def __init__(self, bits, group_size):
        self.tensors, self.bits, self.group_size = {}, bits, group_size
        self.stats = {"quantized": 0, "packed": 0, "float_bytes": 0, "max_rel_error": 0.0}

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
            return {"q": key, "bits": self.bits, "group": g, "shape": list(a.shape), "dtype": _ST[a.dtype.name]}
        self.tensors[key] = np.asarray(a, order="C")
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
        packed = set()
        if self.bits:
            g, packed = pack_graph(g, self.bits, self.group_size, self.stats)
        return {"name": g.name,
                "inputs": [_vi(v) for v in g.inputs], "outputs": [_vi(v) for v in g.outputs],
                "initializers": {k: self.add(a, weight=k not in packed) for k, a in g.initializers.items()},
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
                return a.astype(dt.np_dtype(_NP[d["dtype"]]))
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
        a = np.asarray(a, order="C")
        if a.dtype.name not in _ST or not a.dtype.isnative:
            raise ModelError(f"exm: cannot store a tensor of dtype {a.dtype}")
        pad = (-offset) % 64
        offset += pad
        header[k] = {"dtype": _ST[a.dtype.name], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
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
            npd = dt.np_dtype(_NP[d["dtype"]])
            start, stop = d["data_offsets"]
            shape = tuple(int(s) for s in d["shape"])
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"load: {path!r}: tensor {k!r} has a corrupt entry") from None
        count = int(np.prod(shape, dtype=np.int64))
        if stop - start != count * np.dtype(npd).itemsize or base + stop > size or start < 0:
            raise ModelError(f"load: {path!r} is truncated or corrupt (tensor {k!r})")
        arrays[k] = np.memmap(path, npd, "r", base + start, shape).reshape(shape) if count else np.zeros(shape, npd)
    return meta, arrays


def save_model(model, path, quant_bits=None, group_size=64) -> dict:
    """Write an imported model (express.onnx.Model) as .exm; returns sizes and quantization stats."""
    if quant_bits not in (None, 4, 8):
        raise ModelError(f"save: quant_bits must be None, 8 or 4, got {quant_bits!r}")
    if quant_bits and group_size not in (32, 64):
        raise ModelError(f"save: group_size must be 32 or 64, got {group_size!r}")
    w = _Writer(quant_bits, group_size)
    g = w.graph(model.ir.graph)
    meta = {"format": MAGIC, "version": str(VERSION), **({"qlinear_layout": qlinear_layout()} if quant_bits else {}),
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
    if "qlinear_layout" in meta and meta["qlinear_layout"] != qlinear_layout():
        raise ModelError(f"load: {path!r} holds quantized weights in a packed layout this Express does not read "
                         f"({meta['qlinear_layout']}); convert the model again")
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
