"""CLI: python -m llm export|chat|generate|bench (run with -h for the options)."""
from __future__ import annotations

import argparse
import sys
import time


def _load(a):
    import llm
    return llm.load(a.path, quant_bits=a.quant_bits, group_size=a.group_size, max_context=a.max_context)


def _sampling(a):
    return dict(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                repetition_penalty=a.repetition_penalty, seed=a.seed)


def cmd_export(a):
    from .export import export
    r = export(a.hf_dir, a.out_dir, a.quant_bits, a.group_size, a.lora)
    print(f"exported {a.hf_dir} -> {a.out_dir}: {r['bytes'] / 2**20:.1f} MiB in {r['seconds']:.1f} s "
          f"({'int%d g%d' % (a.quant_bits, a.group_size) if a.quant_bits else 'float'})")


def cmd_generate(a):
    m = _load(a)
    for piece in m.generate(a.prompt, a.max_new_tokens, stream=True, **_sampling(a)):
        print(piece, end="", flush=True)
    print()


def cmd_chat(a):
    m = _load(a)
    messages = [{"role": "system", "content": a.system}] if a.system else []
    print("chat: /reset clears the history, /quit (or Ctrl-D) leaves")
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if line.strip() in ("/quit", "/exit"):
            return
        if line.strip() == "/reset":
            messages = messages[:1] if a.system else []
            m.reset()
            print("(history cleared)")
            continue
        messages.append({"role": "user", "content": line})
        # drop the oldest turns while the rendered history does not leave room to answer
        while len(m.tokenizer.apply_chat_template(messages, tokenize=True)) + a.max_new_tokens > m.max_context \
                and len(messages) > (2 if a.system else 1):
            del messages[1 if a.system else 0]
        reply = ""
        for piece in m.chat(messages, a.max_new_tokens, stream=True, **_sampling(a)):
            reply += piece
            print(piece, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": reply})


def cmd_bench(a):
    import numpy as np
    import psutil
    import express as ex
    ex.set_num_threads(a.threads)
    t0 = time.perf_counter()
    m = _load(a)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, m.config.vocab_size, a.prompt_tokens).tolist()
    m.reset()
    list(m.generate_ids(prompt, 2, stop_on_eos=False))  # warm up: trace the plans
    m.reset()
    t = time.perf_counter()
    m._run(prompt)
    prefill = a.prompt_tokens / (time.perf_counter() - t)
    tok = int(prompt[-1])
    t = time.perf_counter()
    for _ in range(a.gen_tokens):  # generate_ids' greedy step
        tok = int(np.argmax(m._decode(tok)))
    decode = a.gen_tokens / (time.perf_counter() - t)
    rss = psutil.Process().memory_info().rss
    print(f"load {load_s:.2f} s | prefill {prefill:.1f} tok/s ({a.prompt_tokens} tokens) | decode {decode:.1f} tok/s "
          f"({a.gen_tokens} tokens) | threads {a.threads} | RSS {rss / 2**20:.0f} MiB")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m llm", description="Express LLM runtime")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(s):
        s.add_argument("path", help="a Hugging Face folder or an exported one")
        s.add_argument("--quant-bits", type=int, choices=(4, 8), default=None)
        s.add_argument("--group-size", type=int, default=64)
        s.add_argument("--max-context", type=int, default=None)

    def sampling(s):
        s.add_argument("--max-new-tokens", type=int, default=256)
        s.add_argument("--temperature", type=float, default=0.0)
        s.add_argument("--top-k", type=int, default=0)
        s.add_argument("--top-p", type=float, default=1.0)
        s.add_argument("--min-p", type=float, default=0.0)
        s.add_argument("--repetition-penalty", type=float, default=1.0)
        s.add_argument("--seed", type=int, default=None)

    e = sub.add_parser("export", help="quantize/pack a Hugging Face folder for fast loading")
    e.add_argument("hf_dir")
    e.add_argument("out_dir")
    e.add_argument("--quant-bits", type=int, choices=(4, 8), default=None)
    e.add_argument("--group-size", type=int, choices=(32, 64, 128), default=64)
    e.add_argument("--lora", default=None, help="a PEFT LoRA folder to merge")
    e.set_defaults(fn=cmd_export)
    g = sub.add_parser("generate", help="continue a prompt (streamed)")
    common(g)
    sampling(g)
    g.add_argument("--prompt", required=True)
    g.set_defaults(fn=cmd_generate)
    c = sub.add_parser("chat", help="interactive chat (streamed; /reset, /quit)")
    common(c)
    sampling(c)
    c.add_argument("--system", default=None)
    c.set_defaults(fn=cmd_chat)
    b = sub.add_parser("bench", help="prefill and decode tokens/s, memory")
    common(b)
    b.add_argument("--prompt-tokens", type=int, default=128)
    b.add_argument("--gen-tokens", type=int, default=64)
    b.add_argument("--threads", type=int, default=2)
    b.set_defaults(fn=cmd_bench)
    a = p.parse_args(argv)
    from express import ExpressError
    try:
        a.fn(a)
    except ExpressError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
