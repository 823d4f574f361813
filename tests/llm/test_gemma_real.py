"""The real Gemma 3 270M of the `models` extra (GGUF Q4_K_M), against transformers running the
same file's weights dequantized to float32."""
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import llm
from llm.gguf import default_model_path

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "developed a system of movable metal type in Mainz. His invention made books cheaper and faster "
        "to produce, and within a few decades printing shops had spread across Europe.")


@pytest.fixture(scope="module")
def real():
    path = default_model_path()
    folder, name = path.rsplit("/", 1)
    return llm.load("gemma-3-270m", max_context=512), folder, name


def _logsoftmax(x):
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.slow
def test_real_gemma_matches_transformers(real):
    m, folder, name = real
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = tok(TEXT)["input_ids"]
    assert m.tokenizer.encode(TEXT) == ids  # the tokenizer built from the GGUF vocabulary
    ref = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    with torch.no_grad():
        want = _logsoftmax(ref(torch.tensor([ids])).logits[0].numpy())
    got = _logsoftmax(m.forward(ids))
    kl = (np.exp(want) * (want - got)).sum(-1).mean()
    top1 = (got.argmax(-1) == want.argmax(-1)).mean()
    print(f"top-1 agreement {top1:.3f}, mean KL {kl:.4f}")
    assert top1 >= 0.9 and kl < 0.01  # llama.cpp-style int8 activations; the engines differ in attention and float order
    out = m.generate("The capital of France is", max_new_tokens=8)
    assert "France" in out or "Paris" in out
