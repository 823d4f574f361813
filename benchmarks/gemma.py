"""The real Gemma 3 270M (GGUF Q4_K_M from the `models` extra) against llama-cpp-python on the same
file: prefill (128-token prompt) and decode (64 tokens) tokens/s, peak RSS, 1 and 2 threads.
Each engine runs in its own process (so peak RSS is its own); medians over --repeat runs, and with
--rounds N the engines alternate N times and the table shows the medians of the rounds.

    pip install -e ".[models,bench]" && python benchmarks/gemma.py
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# this folder holds llm.py (the other LLM benchmark): the `llm` package must win the import
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

PROMPT_TOKENS, DECODE_TOKENS = 128, 64


def run_express(threads, repeat):
    import resource

    import express as ex
    import llm
    ex.set_num_threads(threads)
    m = llm.load("gemma-3-270m", max_context=512)
    prompt = list(range(1000, 1000 + PROMPT_TOKENS - 1))
    prompt = [2] + prompt
    pre, dec = [], []
    for i in range(repeat + 1):
        m.reset()
        t = time.perf_counter()
        next(iter(m.generate_ids(prompt, max_new_tokens=1)))
        t1 = time.perf_counter()
        m.reset()
        t2 = time.perf_counter()
        n = len(list(m.generate_ids(prompt, max_new_tokens=DECODE_TOKENS + 1, stop_on_eos=False)))
        t3 = time.perf_counter()
        if i:  # the first round traces the plans
            pre.append(PROMPT_TOKENS / (t1 - t))
            dec.append((n - 1) / max(t3 - t2 - (t1 - t), 1e-9))
    return dict(prefill=statistics.median(pre), decode=statistics.median(dec),
                rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def run_llama(threads, repeat):
    import resource

    from llama_cpp import Llama

    from llm.gguf import default_model_path
    m = Llama(model_path=default_model_path(), n_ctx=512, n_threads=threads, n_threads_batch=threads,
              n_batch=512, n_ubatch=512, verbose=False)
    prompt = [2] + list(range(1000, 1000 + PROMPT_TOKENS - 1))
    pre, dec = [], []
    for i in range(repeat + 1):
        m.reset()
        t = time.perf_counter()
        m.eval(prompt)
        t1 = time.perf_counter()
        tok = int(m.scores[m.n_tokens - 1].argmax())
        for _ in range(DECODE_TOKENS):
            m.eval([tok])
            tok = int(m.scores[m.n_tokens - 1].argmax())
        t2 = time.perf_counter()
        if i:
            pre.append(PROMPT_TOKENS / (t1 - t))
            dec.append(DECODE_TOKENS / (t2 - t1))
    return dict(prefill=statistics.median(pre), decode=statistics.median(dec),
                rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the engines this many times, alternating, and report the medians of the rounds")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        engine, th = a.worker
        print(json.dumps((run_express if engine == "express" else run_llama)(int(th), a.repeat)))
        return
    engines = ("express", "llama.cpp")
    runs = {(e, th): [] for th in a.threads for e in engines}
    for r in range(a.rounds):
        for th in a.threads:
            for engine in engines if r % 2 == 0 else engines[::-1]:
                out = subprocess.run([sys.executable, __file__, "--worker", engine, str(th), "--repeat", str(a.repeat)],
                                     capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
                runs[engine, th].append(json.loads(out))
    med = {key: {m: statistics.median(r[m] for r in rs) for m in ("prefill", "decode", "rss")} for key, rs in runs.items()}
    print("| engine | threads | prefill tok/s (128) | decode tok/s (64) | peak RSS MB |")
    print("|---|---|---|---|---|")
    for th in a.threads:
        for engine in engines:
            r = med[engine, th]
            print(f"| {engine} | {th} | {r['prefill']:.1f} | {r['decode']:.1f} | {r['rss']:.0f} |")
    for th in a.threads:
        e, l = med["express", th], med["llama.cpp", th]
        print(f"threads {th}: Express / llama.cpp  prefill {e['prefill'] / l['prefill']:.2f}x  "
              f"decode {e['decode'] / l['decode']:.2f}x  (medians of {a.rounds} round(s))")


if __name__ == "__main__":
    main()
