"""Reading a diffusers folder: model_index.json, each component's config.json and its
safetensors weights (single or sharded, with the "fp16" variant names)."""
from __future__ import annotations

import json
import os

import numpy as np

import express as ex
from express import ModelError
from express.io import read_safetensors as mmap_safetensors

WEIGHT_NAMES = ("diffusion_pytorch_model", "model")


def read_json(path) -> dict:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelError(f"missing file {path!r}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelError(f"{path!r} is not valid JSON: {e}") from None


def component_dir(root, name: str) -> str:
    d = os.path.join(os.fspath(root), name)
    if not os.path.isdir(d):
        raise ModelError(f"{os.fspath(root)!r} has no {name}/ folder (a diffusers Stable Diffusion folder has "
                         "text_encoder/, tokenizer/, unet/, vae/ and scheduler/)")
    return d


def weight_files(folder, variant: str | None = None) -> list[str]:
    """The safetensors files of a component: `<name>[.variant].safetensors`, or the shards listed
    in `<name>[.variant].safetensors.index.json`. With a variant that is absent, the plain files;
    without plain files, the "fp16" ones."""
    folder = os.fspath(folder)
    for v in ([variant, None] if variant else [None, "fp16"]):
        for base in WEIGHT_NAMES:
            stem = f"{base}.{v}" if v else base
            single = os.path.join(folder, f"{stem}.safetensors")
            if os.path.isfile(single):
                return [single]
            index = os.path.join(folder, f"{stem}.safetensors.index.json")
            if os.path.isfile(index):
                shards = sorted(set(read_json(index)["weight_map"].values()))
                return [os.path.join(folder, s) for s in shards]
    have = sorted(os.listdir(folder))
    raise ModelError(f"{folder!r} has no safetensors weights (looked for {WEIGHT_NAMES[0]}.safetensors / "
                     f"model.safetensors{f', variant {variant!r}' if variant else ''}); it holds {have}")


def _mapping(a):
    while a is not None and not isinstance(a, np.memmap):
        a = a.base
    return a


def release_pages(module) -> None:
    """Drop the resident pages of a module's memory-mapped weight files (they are clean file
    pages: the next use reads them back from the page cache). Keeps the peak memory of a pipeline
    to one large model at a time, as on-device runtimes do."""
    import mmap
    for m in getattr(module, "_mapped", ()):
        raw = getattr(m, "_mmap", None)
        if raw is not None and hasattr(raw, "madvise"):
            raw.madvise(mmap.MADV_DONTNEED)


def read_weights(files, dtype=None, mapped: list | None = None) -> dict:
    """name -> Tensor from safetensors files, memory-mapped; floating-point tensors of another
    dtype are converted to `dtype` one at a time (so fp32 files load into fp16 without a full
    fp32 copy in memory)."""
    target = None if dtype is None else ex.dtypes.as_dtype(dtype).np
    out = {}
    for f in files:
        arrays = mmap_safetensors(f)
        if mapped is not None:
            mapped += [_mapping(a) for a in arrays.values()][:1]
        for k, a in arrays.items():
            if target is not None and a.dtype.kind == "f" and a.dtype != target:
                a = a.astype(target)
            out[k] = ex.asarray(a)
    return out


def load_component(module, folder, variant: str | None = None, dtype=None):
    """Load a component's weights into `module` (strict), converting floats to `dtype`."""
    mapped = []
    weights = read_weights(weight_files(folder, variant), dtype, mapped)
    if hasattr(module, "sanitize"):
        weights = module.sanitize(weights)
    try:
        module.load_weights(weights)
    except ModelError as e:
        raise ModelError(f"{os.fspath(folder)!r}: {e}") from None
    module._mapped = [m for m in mapped if isinstance(m, np.memmap)]
    return module
