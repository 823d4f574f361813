"""LLM benchmark: a Qwen2.5-0.5B-shaped model (random weights, the real dimensions) in Express
(int4 / int8, group size 32) against llama.cpp (llama-cpp-python, the same weights as GGUF Q4_0 /
Q8_0, whose blocks are also 32 values) and transformers + torch fp32.

Prefill tokens/s (a 128-token prompt), decode tokens/s (64 tokens), 1 and 2 threads, the peak
RSS of each run (every engine runs in its own process; best of --repeat runs), and the decode
bound that memory bandwidth sets (measured read bandwidth / bytes read per token).

    python benchmarks/llm.py [--workdir DIR] [--threads 1 2] [--engines express llama.cpp torch]
    python benchmarks/llm.py --kernel [--threads 1 2]   # ex_qgemm alone on the model's shapes, GOP/s
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

QWEN05 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, hidden_size=896,
              intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
              hidden_act="silu", bos_token_id=151643, eos_token_id=151643, torch_dtype="bfloat16",
              use_sliding_window=False)
PROMPT, GEN, CTX = 128, 64, 512


# ---- model files ----
def make_hf(folder):
    """A Hugging Face folder with random bf16 weights (std 0.02) of Qwen2.5-0.5B's shapes."""
    import ml_dtypes
    from llm.weights import write_safetensors
    if os.path.isfile(os.path.join(folder, "model.safetensors")):
        return
    os.makedirs(folder, exist_ok=True)
    c = QWEN05
    d, f, hd = c["hidden_size"], c["intermediate_size"], d_head()
    rng = np.random.default_rng(0)
    bf = lambda *s: (rng.standard_normal(s, np.float32) * 0.02).astype(ml_dtypes.bfloat16)  # noqa: E731
    w = {"model.embed_tokens.weight": bf(c["vocab_size"], d), "model.norm.weight": np.ones(d, ml_dtypes.bfloat16)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        nq, nkv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        w.update({p + "self_attn.q_proj.weight": bf(nq, d), p + "self_attn.q_proj.bias": bf(nq),
                  p + "self_attn.k_proj.weight": bf(nkv, d), p + "self_attn.k_proj.bias": bf(nkv),
                  p + "self_attn.v_proj.weight": bf(nkv, d), p + "self_attn.v_proj.bias": bf(nkv),
                  p + "self_attn.o_proj.weight": bf(d, nq), p + "mlp.gate_proj.weight": bf(f, d),
                  p + "mlp.up_proj.weight": bf(f, d), p + "mlp.down_proj.weight": bf(d, f),
                  p + "input_layernorm.weight": np.ones(d, ml_dtypes.bfloat16),
                  p + "post_attention_layernorm.weight": np.ones(d, ml_dtypes.bfloat16)})
    write_safetensors(os.path.join(folder, "model.safetensors"), w, {"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(c, fh, indent=1)


def d_head():
    return QWEN05["hidden_size"] // QWEN05["num_attention_heads"]


def make_gguf(hf, path, qname):
    """The same weights as GGUF (llama.cpp's qwen2 graph), linear weights and the tied embedding in
    Q4_0 / Q8_0, norms and biases in f32, a placeholder vocabulary (token ids are fed directly)."""
    import gguf
    from llm.weights import read_safetensors
    if os.path.isfile(path):
        return
    c = QWEN05
    qt = getattr(gguf.GGMLQuantizationType, qname)
    w = read_safetensors(os.path.join(hf, "model.safetensors"))
    wr = gguf.GGUFWriter(path, "qwen2")
    wr.add_name("qwen2.5-0.5b-random")
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_embedding_length(c["hidden_size"])
    wr.add_block_count(c["num_hidden_layers"])
    wr.add_feed_forward_length(c["intermediate_size"])
    wr.add_head_count(c["num_attention_heads"])
    wr.add_head_count_kv(c["num_key_value_heads"])
    wr.add_rope_freq_base(c["rope_theta"])
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if qname == "Q4_0" else gguf.LlamaFileType.MOSTLY_Q8_0)
    n = c["vocab_size"]
    wr.add_tokenizer_model("llama")
    wr.add_token_list([f"<t{i}>".encode() for i in range(n)])
    wr.add_token_scores([0.0] * n)
    wr.add_token_types([1] * n)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}

    def put(name, a):
        a = a.astype(np.float32)
        if a.ndim == 2:
            wr.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)
        else:
            wr.add_tensor(name, a)
    put("token_embd.weight", w["model.embed_tokens.weight"])
    put("output_norm.weight", w["model.norm.weight"])
    for k, a in w.items():
        if k.startswith("model.layers."):
            i, rest = k[len("model.layers."):].split(".", 1)
            mod, kind = rest.rsplit(".", 1)
            put(f"blk.{i}.{names[mod]}.{kind}", a)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


# ---- workers (one process each) ----
def _rss_mb():
    """Peak resident set of this process (VmHWM: unlike ru_maxrss it does not carry over the
    parent's peak across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def work_express(path, threads):
    import express as ex
    import llm
    ex.set_num_threads(threads)
    m = llm.load(path, max_context=CTX)
    prompt = np.random.default_rng(1).integers(0, QWEN05["vocab_size"], PROMPT).tolist()
    m._run(prompt)  # trace the prefill and decode plans once
    m._run([1])
    m.reset()
    t = time.perf_counter()
    lg = m._run(prompt)
    prefill = PROMPT / (time.perf_counter() - t)
    tok = int(np.argmax(lg[0]))
    t = time.perf_counter()
    for _ in range(GEN):
        tok = int(np.argmax(m._decode(tok)))  # generate_ids' step: logits read in place
    return dict(prefill=prefill, decode=GEN / (time.perf_counter() - t), rss=_rss_mb())


def work_llamacpp(path, threads):
    from llama_cpp import Llama
    m = Llama(model_path=path, n_ctx=CTX, n_batch=PROMPT, n_ubatch=PROMPT, n_threads=threads,
              n_threads_batch=threads, verbose=False)
    prompt = np.random.default_rng(1).integers(3, QWEN05["vocab_size"], PROMPT).tolist()
    m.eval(prompt)  # warm up
    m.reset()
    t = time.perf_counter()
    m.eval(prompt)
    prefill = PROMPT / (time.perf_counter() - t)
    last = lambda: int(np.argmax(np.ctypeslib.as_array(m._ctx.get_logits(), shape=(m.n_vocab(),))))  # noqa: E731
    tok = last()
    t = time.perf_counter()
    for _ in range(GEN):
        m.eval([tok])
        tok = last()
    return dict(prefill=prefill, decode=GEN / (time.perf_counter() - t), rss=_rss_mb())


def work_torch(path, threads):
    import torch
    import transformers
    torch.set_num_threads(threads)
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = torch.tensor([np.random.default_rng(1).integers(0, QWEN05["vocab_size"], PROMPT).tolist()])
    with torch.no_grad():
        m(prompt[:, :16])
        t = time.perf_counter()
        out = m(prompt, use_cache=True)
        prefill = PROMPT / (time.perf_counter() - t)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t = time.perf_counter()
        for _ in range(GEN):
            out = m(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return dict(prefill=prefill, decode=GEN / (time.perf_counter() - t), rss=_rss_mb())


def work_bandwidth(_, threads):
    """Read bandwidth (GB/s) of `threads` threads: the best of ex_read_sum (Express's pool, each
    thread reading its part as several prefetched streams) and two NumPy loops over disjoint
    parts, one Python thread each (an int64 sum, and a BLAS float32 dot product of each part's
    halves: a single core's plain float sum is bound by its adds, not by memory); 5 rounds over
    buffers of 256 MiB and 1 GiB, both far above the last-level cache."""
    from concurrent.futures import ThreadPoolExecutor
    import express as ex
    from express._lib import ffi, lib
    ex.set_num_threads(threads)
    out = {"read_sum": 0.0, "numpy": 0.0}
    with ThreadPoolExecutor(threads) as pool:
        for mib in (256, 1024):
            a = np.ones(mib << 17, np.int64)  # written: untouched pages would all read the zero page
            f = a.view(np.float32)
            parts = [p.view(np.float32) for p in np.array_split(a, threads)]
            halves = [(p[: len(p) // 2], p[len(p) // 2:]) for p in parts]
            loops = [("read_sum", lambda: lib.ex_read_sum(ffi.cast("float *", f.ctypes.data), f.size)),
                     ("numpy", lambda: list(pool.map(lambda i: parts[i].view(np.int64).sum(), range(threads)))),
                     ("numpy", lambda: list(pool.map(lambda i: np.dot(*halves[i]), range(threads))))]
            for _ in range(5):
                for name, fn in loops:
                    t = time.perf_counter()
                    fn()
                    out[name] = max(out[name], a.nbytes / (time.perf_counter() - t) / 1e9)
            del a, f, parts, halves
    return dict(gbps=max(out.values()), **out, rss=_rss_mb())


def work_kernel(_, threads):
    """ex_qgemm alone on the model's linear shapes (random codes, group 32): GOP/s at m = 1 and
    m = PROMPT, and the weight read rate (GB/s) at m = 1.  Best of repeated calls for ~0.3 s; at
    m = 1 every call reads weights that were last touched one call earlier (the small matrices
    stay in cache, as they do not in a decode step: see the decode column of the main table)."""
    import express as ex
    from express._lib import ffi, lib
    from express.ops.quant import pack_weight
    ex.set_num_threads(threads)
    d, f, v = QWEN05["hidden_size"], QWEN05["intermediate_size"], QWEN05["vocab_size"]
    rng = np.random.default_rng(0)
    p = lambda a, t: ffi.cast(t, a.ctypes.data)  # noqa: E731
    out = {}
    for bits in (4, 8):
        for k, n in ((d, d), (d, 128), (d, f), (f, d), (d, v)):
            q, s = pack_weight(rng.integers(-8, 8, (n, k)), np.full((n, k // 32), 0.01, np.float32), bits, 32)
            for m in (1, PROMPT):
                x = rng.standard_normal((m, k)).astype(np.float32)
                y = np.empty((m, n), np.float32)
                args = (bits, m, n, k, 32, p(x, "float *"), p(q, "void *"), p(s, "void *"), ffi.NULL, p(y, "float *"))
                lib.ex_qgemm(*args)
                best, end = 1e9, time.perf_counter() + 0.3
                while time.perf_counter() < end:
                    t = time.perf_counter()
                    lib.ex_qgemm(*args)
                    best = min(best, time.perf_counter() - t)
                out[f"int{bits} k={k} n={n} m={m}"] = (2 * m * n * k / best / 1e9, (q.nbytes + s.nbytes) / best / 1e9)
    return out


def kernel_table(threads):
    for th in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(th), EXPRESS_NUM_THREADS=str(th))
        p = subprocess.run([sys.executable, __file__, "--worker", "kernel", "--path", "", "--nthreads", str(th)],
                           capture_output=True, text=True, env=env, check=True)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"\nex_qgemm, {th} thread(s), GOP/s (m = 1: also GB/s of weights read)")
        for key, (gops, gbps) in r.items():
            print(f"{key:<28}{gops:>9.1f}" + (f"{gbps:>9.1f}" if key.endswith(" m=1") else ""))


WORKERS = {"kernel": work_kernel, "express": work_express, "llama.cpp": work_llamacpp, "torch": work_torch, "bandwidth": work_bandwidth}


def run_worker(kind, path, threads, repeat=1):
    """Best of `repeat` fresh processes (the fastest run is the least disturbed one)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), EXPRESS_NUM_THREADS=str(threads))
    if kind == "bandwidth":  # one BLAS thread per reading thread
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    best = None
    for _ in range(repeat):
        p = subprocess.run([sys.executable, __file__, "--worker", kind, "--path", path, "--nthreads", str(threads)],
                           capture_output=True, text=True, env=env)
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        r = json.loads(p.stdout.strip().splitlines()[-1])
        best = r if best is None else {k: max(best[k], r[k]) for k in r}
    return best


def decode_bytes(folder):
    """Bytes a decode step reads: the packed weights (all but the embedding lookup) + the KV cache
    at the benchmark's context (~PROMPT + GEN/2 positions)."""
    from llm.weights import read_safetensors
    w = read_safetensors(os.path.join(folder, "model.safetensors"))
    wb = sum(a.nbytes for k, a in w.items())
    c = QWEN05
    kv = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * 256 * d_head() * 4  # the 256-slot bucket
    return wb + kv


def export_version(folder):
    try:
        with open(os.path.join(folder, "express_llm.json")) as f:
            return json.load(f).get("version")
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default=os.path.join(os.path.expanduser("~"), ".cache", "express-bench-llm"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--engines", nargs="+", default=["express", "llama.cpp", "torch"])
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs per engine (shared machines are noisy)")
    ap.add_argument("--kernel", action="store_true", help="time ex_qgemm alone on the model's shapes")
    ap.add_argument("--worker")
    ap.add_argument("--path")
    ap.add_argument("--nthreads", type=int)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(WORKERS[a.worker](a.path, a.nthreads)))
        return
    if a.kernel:
        kernel_table(a.threads)
        return
    from llm.export import export
    from llm.loader import EXPORT_VERSION
    hf = os.path.join(a.workdir, "qwen2.5-0.5b-random")
    t = time.perf_counter()
    make_hf(hf)
    print(f"model: Qwen2.5-0.5B shapes, random bf16 weights ({time.perf_counter() - t:.1f} s to make)")
    rows = []
    for bits, qname in ((4, "Q4_0"), (8, "Q8_0")):
        ours = os.path.join(a.workdir, f"express-int{bits}-g32")
        if export_version(ours) != EXPORT_VERSION:  # none yet, or of an older packed layout
            r = export(hf, ours, bits, 32)
            print(f"export int{bits} g32: {r['seconds']:.1f} s, {r['bytes'] / 2**20:.0f} MiB")
        gg = os.path.join(a.workdir, f"model-{qname}.gguf")
        if "llama.cpp" in a.engines:
            make_gguf(hf, gg, qname)
        nbytes = decode_bytes(ours)
        for th in a.threads:
            # the engines and the bandwidth probe alternate run by run, so a burst of load
            # elsewhere hits them alike; each keeps its best run
            runs = [("bandwidth", "bandwidth", ""), (f"express int{bits}", "express", ours),
                    (f"llama.cpp {qname}", "llama.cpp", gg)]
            runs = [r for r in runs if r[1] in a.engines + ["bandwidth"]]
            best = {}
            for _ in range(a.repeat):
                for name, kind, path in runs:
                    r = run_worker(kind, path, th)
                    best[name] = r if name not in best or "error" in r else \
                        {k: max(best[name][k], r[k]) for k in r}
            bw = best.pop("bandwidth")
            if "error" in bw:
                raise SystemExit(f"bandwidth probe failed: {bw['error']}")
            bound = bw["gbps"] * 1e9 / nbytes
            print(f"int{bits}, {th} thread(s): read bandwidth {bw['gbps']:.1f} GB/s (ex_read_sum {bw['read_sum']:.1f}, "
                  f"NumPy {bw['numpy']:.1f}), {nbytes / 1e6:.0f} MB read a token, bound {bound:.1f} tok/s")
            rows += [(name, th, best[name], bound) for name, _, _ in runs[1:]]
    if "torch" in a.engines:
        for th in a.threads:
            rows.append(("torch fp32", th, run_worker("torch", hf, th), None))
    print(f"\nprefill: {PROMPT}-token prompt; decode: {GEN} tokens; bound = read bandwidth / bytes per token")
    print(f"{'engine':<18}{'threads':>8}{'prefill tok/s':>15}{'decode tok/s':>14}{'bound tok/s':>13}"
          f"{'of bound':>10}{'peak RSS MB':>13}")
    for name, th, r, bound in rows:
        if "error" in r:
            print(f"{name:<18}{th:>8}  error: {r['error']}")
            continue
        b = f"{bound:>13.1f}{r['decode'] / bound:>9.0%}" if bound else f"{'-':>13}{'-':>10}"
        print(f"{name:<18}{th:>8}{r['prefill']:>15.1f}{r['decode']:>14.1f}{b}{r['rss']:>13.0f}")
    by = {(n, t): r for n, t, r, _ in rows}
    for bits, q in ((4, "Q4_0"), (8, "Q8_0")):
        for th in a.threads:
            e, l = by.get((f"express int{bits}", th)), by.get((f"llama.cpp {q}", th))
            if e and l and "error" not in e and "error" not in l:
                print(f"int{bits} vs {q}, {th} thread(s): prefill {e['prefill'] / l['prefill']:.2f}x, "
                      f"decode {e['decode'] / l['decode']:.2f}x")


if __name__ == "__main__":
    main()
