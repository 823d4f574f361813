"""Reading a diffusers folder: model_index.json, each component's config.json and its
safetensors weights (single or sharded, with the "fp16" variant names)."""
from __future__ import annotations

import json
import os

import express as ex
from express import ModelError

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
    in `<name>[.variant].safetensors.index.json`. With a variant that is absent, the plain files."""
    folder = os.fspath(folder)
    for v in ([variant, None] if variant else [None]):
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


def read_weights(files, dtype=None) -> dict:
    """name -> Tensor from safetensors files, read one tensor at a time; floating-point tensors
    are converted to `dtype` as they are read (so fp32 files load into fp16 without a full fp32
    copy in memory)."""
    from safetensors import SafetensorError, safe_open
    target = None if dtype is None else ex.dtypes.as_dtype(dtype).np
    out = {}
    for f in files:
        try:
            with safe_open(f, framework="np") as st:
                for k in st.keys():
                    a = st.get_tensor(k)
                    if target is not None and a.dtype.kind == "f" and a.dtype != target:
                        a = a.astype(target)
                    out[k] = ex.asarray(a)
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelError(f"{f!r} is not a readable safetensors file: {e}") from None
    return out


def load_component(module, folder, variant: str | None = None, dtype=None):
    """Load a component's weights into `module` (strict), converting floats to `dtype`."""
    weights = read_weights(weight_files(folder, variant), dtype)
    if hasattr(module, "sanitize"):
        weights = module.sanitize(weights)
    try:
        module.load_weights(weights)
    except ModelError as e:
        raise ModelError(f"{os.fspath(folder)!r}: {e}") from None
    return module
