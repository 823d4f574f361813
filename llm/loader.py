"""Building a `CausalLM` from a Hugging Face folder or an exported one: weights by name (the
decoder uses the Hugging Face names), tied heads, quantization, the embedding lookup."""
from __future__ import annotations

import json
import os

import numpy as np

import express as ex
import express.nn as nn
from express import ModelError

from .config import read_config
from .model import CausalLM
from .weights import load_folder, read_safetensors

_IGNORED = ("rotary_emb.inv_freq",)


def _f32(a: np.ndarray) -> np.ndarray:
    """Float weights (fp16, bf16, fp64) as float32; anything else as it is."""
    return a.astype(np.float32) if a.dtype.kind == "V" or a.dtype in (np.float16, np.float64) else a


def assign(model: CausalLM, weights: dict, where: str):
    """Set every parameter of `model` from `weights` (arrays by Hugging Face name); packed
    quantized layers (already set) are left as they are."""
    params = {k: v for k, v in model.named_parameters().items() if not k.endswith((".qweight", ".scales"))}
    missing = sorted(k for k in params if k not in weights)
    if missing:
        raise ModelError(f"{where}: weights lack {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    extra = sorted(k for k in weights if k not in params and not k.endswith(_IGNORED)
                   and not (k == "lm_head.weight" and model.config.tie_word_embeddings))
    if extra:
        raise ModelError(f"{where}: unexpected weights {extra[:4]}{' ...' if len(extra) > 4 else ''} "
                         f"for {model.config.architecture}")
    offset = model.config.norm_offset
    for k, p in params.items():
        a = weights[k]
        if tuple(a.shape) != p.shape:
            raise ModelError(f"{where}: weight {k!r} has shape {tuple(a.shape)}, the config implies {p.shape}")
        a = _f32(a)
        if offset and k.endswith("norm.weight"):  # Gemma's norms scale by (1 + w): fold the 1 in once
            a = a.astype(np.float32) + np.float32(offset)
        model._set(k, ex.asarray(a))


def tie(model: CausalLM):
    if model.config.tie_word_embeddings:
        head = nn.Linear.__new__(nn.Linear)
        head.weight, head.bias = model.model.embed_tokens.weight, None
        model._tied["head"] = head


def float_embed(model: CausalLM):
    w = model.model.embed_tokens.weight.numpy()
    return lambda ids: w[ids]


def quantized_embed(head):
    from express.ops.quant import RowTable
    return RowTable(head.qweight.numpy(), head.scales.numpy(), head.bits, head.group_size)


def read_generation_config(folder):
    p = os.path.join(folder, "generation_config.json")
    if os.path.isfile(p):
        with open(p) as f:
            return json.load(f)
    return {}


def read_tokenizer(folder):
    from .tokenizer import Tokenizer
    return Tokenizer(folder) if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None


def quantize_model(model: CausalLM, bits: int, group_size: int):
    """Quantize every linear layer (and the LM head, tied or not); the embedding lookup then reads
    the quantized head when tied."""
    from express.nn.quantized import QuantizedLinear, quantize
    if bits not in (4, 8):
        raise ModelError(f"quant_bits must be 4 or 8, got {bits}")
    k = model.config.hidden_size
    if k % group_size:
        raise ModelError(f"group_size {group_size} does not divide hidden size {k}")
    from tqdm.auto import tqdm  # a progress bar in terminals and notebooks alike
    for layer in tqdm(model.model.layers, desc=f"int{bits} quantization", unit="layer", leave=False):
        quantize(layer, bits, group_size)
    if hasattr(model, "lm_head"):
        quantize(model, bits, group_size)
    if model.config.tie_word_embeddings:
        model._tied["head"] = QuantizedLinear.from_linear(model._tied["head"], bits, group_size)
        model.model.embed_tokens.weight = ex.zeros((0, k))  # the head holds it now
        return quantized_embed(model._tied["head"])
    return None


def load_hf(folder, quant_bits=None, group_size=64, lora=None):
    cfg = read_config(folder)
    model = CausalLM(cfg)
    assign(model, load_folder(folder), folder)
    if lora is not None:
        from .lora import merge_into
        merge_into(model, lora)
    tie(model)
    embed = float_embed(model)
    if quant_bits is not None:
        embed = quantize_model(model, quant_bits, group_size) or embed
    return model, embed, read_tokenizer(folder), read_generation_config(folder)


# version 2: quantized weights interleaved by 16 rows (version 1: by 8)
EXPORT_VERSION = 2


def load_exported(folder):
    """A folder from `python -m llm export`: weights mmap'ed, linear layers already packed."""
    from express.nn.quantized import QuantizedLinear, replace_linears
    with open(os.path.join(folder, "express_llm.json")) as f:
        meta = json.load(f)
    if meta.get("quant_bits") and meta.get("version") != EXPORT_VERSION:
        raise ModelError(f"{folder}: exported in format version {meta.get('version')}, whose packed weights this "
                         f"Express (version {EXPORT_VERSION}) does not read; export it again")
    cfg = read_config(folder)
    model = CausalLM(cfg)
    # the packed weights, streamed every decode step, in huge pages (NumPy already asks for them
    # for its large arrays, so on-the-fly quantization has them); the rest stays mapped
    w = read_safetensors(os.path.join(folder, "model.safetensors"),
                         resident=lambda k: k.endswith((".qweight", ".scales")))
    bits, gs = meta.get("quant_bits"), meta.get("group_size")

    def packed(name, n):
        return QuantizedLinear(ex.asarray(w[name + ".qweight"]), ex.asarray(w[name + ".scales"]),
                               ex.asarray(_f32(w[name + ".bias"])) if name + ".bias" in w else None, bits, gs, n)
    if bits:
        replace_linears(model, lambda name, lin: packed(name, lin.weight.shape[0]) if name + ".qweight" in w else None)
    tied_q = bool(bits) and cfg.tie_word_embeddings
    if tied_q:
        model.model.embed_tokens.weight = ex.zeros((0, cfg.hidden_size))
    for k in model.named_parameters():
        if tied_q and k == "model.embed_tokens.weight":
            continue
        if k not in w:
            raise ModelError(f"{folder}: exported weights lack {k!r}")
        if not k.endswith((".qweight", ".scales")):
            model._set(k, ex.asarray(_f32(w[k])))
    if tied_q:
        model._tied["head"] = packed("model.embed_tokens", cfg.vocab_size)
        return model, quantized_embed(model._tied["head"]), read_tokenizer(folder), read_generation_config(folder)
    tie(model)
    e = w["model.embed_tokens.weight"]
    return model, (lambda ids: _f32(e[ids])), read_tokenizer(folder), read_generation_config(folder)
