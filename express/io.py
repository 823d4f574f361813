"""Saving and loading tensors: safetensors files (memory-mapped on load)."""
from __future__ import annotations

import json
import mmap
import os
import struct
import threading

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


_HUGE = 2 << 20


def hugepage_buffer(nbytes: int) -> np.ndarray:
    """A zeroed uint8 buffer of `nbytes` in private anonymous memory, 2 MB-aligned, that Linux is
    asked to back with transparent huge pages (elsewhere, or under 2 MB, a plain 64-byte aligned
    array). Weights streamed once a token (LLM decode) read 15-45% faster from 2 MB pages than from
    4 KB ones, at whose boundaries the hardware prefetcher stops (one Zen 4 core; decode of int4
    Qwen2.5-0.5B shapes 10-25% faster at 1 and 2 threads)."""
    if nbytes < _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        a = np.zeros(nbytes + 64, np.uint8)
        return a[-a.ctypes.data % 64:][:nbytes]
    mm = mmap.mmap(-1, nbytes + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = -np.frombuffer(mm, np.uint8, count=1).ctypes.data % _HUGE
    mm.madvise(mmap.MADV_HUGEPAGE, start, nbytes - nbytes % mmap.PAGESIZE)
    return np.frombuffer(mm, np.uint8, count=nbytes, offset=start)  # keeps `mm` alive


_SLAB = 8 << 20
_slab = {"chunk": None, "used": 0, "lock": threading.Lock()}


def packed_buffer(nbytes: int) -> np.ndarray:
    """A zeroed, 64-byte aligned uint8 buffer for data packed once and read on every run (a
    layer's packed weights). Under 2 MB, it is carved side by side with others out of shared 8 MB
    `hugepage_buffer` chunks, so a network's small layers also sit on huge pages rather than on
    4 KB pages scattered over the heap (ResNet-18 after an idle pause: fewer page walks that miss
    the cache); from 2 MB up, a `hugepage_buffer` of its own."""
    if nbytes >= _HUGE:
        return hugepage_buffer(nbytes)
    n = -(-max(nbytes, 1) // 64) * 64
    with _slab["lock"]:
        if _slab["chunk"] is None or _slab["used"] + n > _SLAB:
            _slab["chunk"], _slab["used"] = hugepage_buffer(_SLAB), 0
        start = _slab["used"]
        _slab["used"] += n
        return _slab["chunk"][start:start + nbytes]  # the view keeps its chunk alive


def read_resident(f, spans) -> list:
    """Byte ranges `spans` ((name, offset, nbytes), ...) of the open file `f`, read side by side
    (64-byte aligned) into one `hugepage_buffer`, as read-only uint8 arrays."""
    sizes = [-(-n // 64) * 64 for _, _, n in spans]
    mem, off, out = hugepage_buffer(sum(sizes)), 0, []
    for (name, start, n), size in zip(spans, sizes):
        f.seek(start)
        if f.readinto(memoryview(mem[off:off + n])) != n:
            raise ValueError(f"tensor {name!r} is cut short")
        v = mem[off:off + n]
        v.flags.writeable = False  # as a read-only map's
        out.append(v)
        off += size
    return out


def read_safetensors(path, resident=None) -> dict:
    """name -> read-only NumPy view into the memory-mapped safetensors file `path` (nothing is
    read until used; a tensor whose offset is not aligned to its item size is copied). Tensors
    whose names `resident(name)` accepts are read into one `hugepage_buffer` instead (weights
    every step streams: see there)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > os.path.getsize(path) - 8:
                raise ValueError(f"header of {n} bytes is longer than the file")
            header = json.loads(f.read(n))
            buf = np.memmap(path, np.uint8, mode="r") if os.path.getsize(path) > 8 + n else np.zeros(0, np.uint8)
            out, read = {}, []
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if info.get("dtype") not in _ST_DTYPES:
                    raise ModelError(f"{path!r}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
                dtype = np_dtype(_ST_DTYPES[info["dtype"]])
                a, b = info["data_offsets"]
                if not 0 <= a <= b <= len(buf) - 8 - n or (b - a) != dtype.itemsize * int(np.prod(info["shape"])):
                    raise ModelError(f"{path!r}: tensor {name!r} lies outside the file or does not match its shape")
                if resident is not None and resident(name):
                    read.append((name, dtype, info["shape"], 8 + n + a, b - a))
                    continue
                raw = buf[8 + n + a:8 + n + b]
                out[name] = (raw.view(dtype) if (8 + n + a) % dtype.itemsize == 0
                             else raw.copy().view(dtype)).reshape(info["shape"])
            mem = read_resident(f, [(name, start, size) for name, _, _, start, size in read])
            for (name, dtype, shape, _, _), raw in zip(read, mem):
                out[name] = raw.view(dtype).reshape(shape)
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
