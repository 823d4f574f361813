"""`python -m express demo`: a short tour that checks itself against NumPy."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def demo() -> int:
    import express as ex
    print(f"express {ex.__version__}: kernels={ex.isa()}, threads={ex.get_num_threads()}")
    x = ex.random.normal((256, 512), seed=0)
    w = ex.random.normal((512, 128), seed=1) * 0.05
    b = ex.linspace(-1, 1, 128)
    y = ex.maximum(x @ w + b, 0.0)                  # lazy: a graph of 4 nodes
    z = (y - y.mean(axis=1, keepdims=True)).sum(axis=0)
    print("built lazily:", repr(z))
    t = time.perf_counter()
    ex.eval(y, z)
    print(f"evaluated in {1e3 * (time.perf_counter() - t):.2f} ms:", repr(z))
    xn, wn, bn = x.numpy(), w.numpy(), b.numpy()
    yn = np.maximum(xn @ wn + bn, 0)
    err = float(np.abs(y.numpy() - yn).max())
    print(f"max |express - numpy| = {err:.2e}")
    step = ex.compile(lambda a: ex.tanh(a @ w) * 2 + 1)
    step(x)
    t = time.perf_counter()
    for _ in range(10):
        out = step(x)
    print(f"compiled replay: {1e6 * (time.perf_counter() - t) / 10:.0f} us per call, out {out.shape}")
    return 0 if err < 1e-3 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m express", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("demo", help="run a short self-checking demo")
    from .cli import add_subcommands, main_with
    handlers = add_subcommands(sub)
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        return demo()
    return main_with(args, handlers)


if __name__ == "__main__":
    sys.exit(main())
