"""`python -m llm export HF_DIR OUT_DIR --quant-bits 4|8 --group-size N [--lora PEFT_DIR]`: a
folder `llm.load` opens by memory-mapping one safetensors file whose linear layers are already
packed for ex_qgemm (plus config, tokenizer and generation config copied over)."""
from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np

from express import ModelError

from .loader import EXPORT_VERSION, load_hf
from .weights import write_safetensors

COPY = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "chat_template.jinja")


def export(hf_dir, out_dir, quant_bits=None, group_size=64, lora=None) -> dict:
    """Write the export folder; returns {"seconds", "bytes", "quant_bits", "group_size"}."""
    t0 = time.perf_counter()
    hf_dir, out_dir = os.fspath(hf_dir), os.fspath(out_dir)
    if os.path.abspath(hf_dir) == os.path.abspath(out_dir):
        raise ModelError("export: the output folder must differ from the input folder")
    model, _, _, _ = load_hf(hf_dir, quant_bits, group_size, lora)
    tensors = {}
    for k, v in model.named_parameters().items():
        a = v.numpy()
        if a.size == 0:  # the tied embedding, held by the quantized head
            continue
        if quant_bits and k == "model.embed_tokens.weight":
            a = a.astype(np.float16)  # looked up row by row; half the memory
        tensors[k] = np.ascontiguousarray(a)
    if quant_bits and model.config.tie_word_embeddings:
        head = model._tied["head"]
        tensors["model.embed_tokens.qweight"] = head.qweight.numpy()
        tensors["model.embed_tokens.scales"] = head.scales.numpy()
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    for f in COPY:
        if os.path.isfile(os.path.join(hf_dir, f)):
            shutil.copy(os.path.join(hf_dir, f), os.path.join(out_dir, f))
    meta = {"format": "express-llm", "version": EXPORT_VERSION, "quant_bits": quant_bits,
            "group_size": group_size if quant_bits else None, "lora_merged": os.fspath(lora) if lora else None}
    with open(os.path.join(out_dir, "express_llm.json"), "w") as f:
        json.dump(meta, f, indent=1)
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    return {"seconds": time.perf_counter() - t0, "bytes": size, "quant_bits": quant_bits, "group_size": group_size}
