"""LoRA adapters in PEFT's folder format (adapter_config.json + adapter_model.safetensors with
`...<module>.lora_A.weight` (r, in) and `...lora_B.weight` (out, r)): merged into the weights
(W += scale * B @ A), or attached at run time and switched without reloading the base."""
from __future__ import annotations

import json
import os

import numpy as np

import express as ex
import express.nn as nn
import express.nn.functional as F
from express import ModelError

from .weights import read_safetensors


def read_adapter(folder) -> dict:
    """{module name: (A (r, in), B (out, r), scale)} of a PEFT LoRA folder."""
    folder = os.fspath(folder)
    cfg_path = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(cfg_path):
        raise ModelError(f"{folder!r} is not a PEFT adapter folder: no adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ModelError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    files = [p for p in ("adapter_model.safetensors",) if os.path.isfile(os.path.join(folder, p))]
    if not files:
        raise ModelError(f"{folder!r}: no adapter_model.safetensors")
    w = read_safetensors(os.path.join(folder, files[0]))
    r = cfg["r"]
    alpha = cfg.get("lora_alpha", r)
    pattern_r, pattern_a = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    out = {}
    for k, a in w.items():
        if ".lora_A." not in k:
            continue
        name = k.split(".lora_A.")[0]
        b = w.get(k.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise ModelError(f"{folder!r}: {k} has no matching lora_B")
        name = name[len("base_model.model."):] if name.startswith("base_model.model.") else name
        short = name.split(".")[-1]
        rr, aa = pattern_r.get(short, r), pattern_a.get(short, alpha)
        scale = aa / (np.sqrt(rr) if cfg.get("use_rslora") else rr)
        out[name] = (a.astype(np.float32), b.astype(np.float32), float(scale))
    if not out:
        raise ModelError(f"{folder!r}: adapter_model.safetensors holds no lora_A/lora_B weights")
    return out


def _module(model, name):
    obj = model
    for p in name.split("."):
        obj = obj[int(p)] if p.isdigit() else getattr(obj, p, None)
        if obj is None:
            raise ModelError(f"LoRA: the model has no module {name!r}")
    return obj


def merge_into(model, folder):
    """W += scale * B @ A for every module of the adapter (float weights)."""
    for name, (a, b, scale) in read_adapter(folder).items():
        lin = _module(model, name)
        if not isinstance(lin, nn.Linear):
            raise ModelError(f"LoRA merge: {name!r} is not a float Linear (merge before quantizing)")
        w = lin.weight.numpy()
        if w.shape != (b.shape[0], a.shape[1]):
            raise ModelError(f"LoRA: {name!r} weight {w.shape} does not match A {a.shape} / B {b.shape}")
        lin.weight = ex.asarray((w + scale * (b @ a)).astype(np.float32))


class LoRALinear(nn.Module):
    """A base linear (float or quantized) plus switchable low-rank adapters."""

    def __init__(self, base):
        self.base = base
        self.adapters: dict = {}
        self.active = None

    def forward(self, x):
        y = self.base(x)
        ad = self.adapters.get(self.active)
        if ad is None:
            return y
        a, b, scale = ad
        return y + F.linear(F.linear(x, a), b) * scale


def add(llm, name: str, folder):
    """Attach adapter `name` from a PEFT folder (not active until `set_lora(name)`)."""
    for mod, (a, b, scale) in read_adapter(folder).items():
        target = _module(llm.model, mod)
        if not isinstance(target, LoRALinear):
            wrapped = LoRALinear(target)
            llm.model._set(mod, wrapped)
            target = wrapped
        n_out, n_in = (target.base.out_features, target.base.in_features) if hasattr(target.base, "out_features") \
            else target.base.weight.shape
        if (b.shape[0], a.shape[1]) != (n_out, n_in):
            raise ModelError(f"LoRA {name!r}: {mod} is ({n_out}, {n_in}), A {a.shape} / B {b.shape} do not match")
        target.adapters[name] = (ex.asarray(a), ex.asarray(b), scale)
    llm._loras.add(name)


def select(llm, name):
    """Make adapter `name` active (None: the base model alone); recompiles the step lazily."""
    if name is not None and name not in llm._loras:
        raise ModelError(f"set_lora: no adapter {name!r} (added: {sorted(llm._loras)})")
    _walk(llm.model, lambda m: setattr(m, "active", name))
    llm.lora = name
    llm.invalidate()
    llm.reset()


def _walk(m, fn):
    if isinstance(m, LoRALinear):
        fn(m)
    for c in m.children().values():
        for x in (c if isinstance(c, list) else [c]):
            _walk(x, fn)
