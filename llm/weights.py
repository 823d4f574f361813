"""Weights from a Hugging Face folder: safetensors files (one, several, or a sharded index),
memory-mapped by express.io.read_safetensors; and a safetensors writer with 64-byte aligned
tensors (so exported weights map straight into the kernels)."""
from __future__ import annotations

import glob
import json
import os
import struct

import numpy as np

from express import ModelError
from express.io import read_safetensors  # noqa: F401  (mmap'ed reader, used by loader/lora)

# NumPy dtype names -> safetensors codes (names: bfloat16's NumPy type needs ml_dtypes)
_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int8": "I8", "uint8": "U8", "int32": "I32",
          "int64": "I64", "float64": "F64", "bool": "BOOL"}


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
    """Write arrays as safetensors, each tensor's data 64-byte aligned (alignment padding goes into
    the header's trailing spaces and between tensors as unnamed gaps are not allowed, so tensors are
    ordered by decreasing alignment need and padded in the header)."""
    names = sorted(tensors, key=lambda k: (-tensors[k].dtype.itemsize, k))
    header, off = {}, 0
    for k in names:
        a = tensors[k]
        header[k] = {"dtype": _NAMES[a.dtype.name], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-(8 + len(h))) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for k in names:
            f.write(np.ascontiguousarray(tensors[k]).tobytes())


def load_folder(folder: str) -> dict[str, np.ndarray]:
    """Every tensor of a Hugging Face folder: a sharded index (model.safetensors.index.json, each
    listed shard must exist) or the *.safetensors files in it."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            wmap = json.load(f).get("weight_map", {})
        shards = sorted(set(wmap.values()))
        missing = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
        if missing:
            raise ModelError(f"{folder!r}: shard(s) {', '.join(missing)} listed in model.safetensors.index.json "
                             f"are missing")
        files = [os.path.join(folder, s) for s in shards]
    else:
        files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
        files = [f for f in files if not os.path.basename(f).startswith("adapter_")]
        if not files:
            raise ModelError(f"{folder!r}: no *.safetensors weights (only safetensors is supported)")
    out = {}
    for p in files:
        out.update(read_safetensors(p))
    if os.path.isfile(index):
        lost = sorted(set(wmap) - set(out))
        if lost:
            raise ModelError(f"{folder!r}: tensors {lost[:3]} listed in the index are not in their shard")
    return out
