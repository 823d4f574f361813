"""SGEMM against NumPy (OpenBLAS): square 512..4096, skinny LLM-style products, small matrices.

    python benchmarks/gemm.py [--threads 1,2] [--quick]

Each thread count runs in its own process so OpenBLAS can be pinned (OPENBLAS_NUM_THREADS).
NumPy is measured with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset (OpenBLAS picks its kernels
for this CPU, AVX-512 where it has it) and, for context, with OPENBLAS_CORETYPE=Haswell (its
AVX2 kernels). Express runs its best kernel variant for the CPU (`ex.isa()`), and AVX2 for
context. Skinny products are x[M, K] @ W[N, K]^T (nn.Linear), with f32 and f16 weights on our
side. Medians (and best) of repeated runs; GFLOP/s = 2*M*N*K / time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SQUARE = [512, 1024, 2048, 4096]
SKINNY = [(1, 4096, 4096), (4, 4096, 4096), (16, 4096, 4096), (8, 11008, 4096)]
SMALL = [(32, 32, 32), (64, 64, 64), (128, 128, 128), (256, 256, 256)]
RUNS = {"square": 60, "small": 3000}


def _median(f, budget=1.0, max_runs=60):
    """(median, best) seconds of repeated calls.  Small products get up to 3000 calls (still
    within the budget): 60 of them last under a millisecond, too short for either library's
    worker threads to be awake and running at full speed."""
    f()
    ts = []
    t_end = time.perf_counter() + budget
    while len(ts) < 5 or (time.perf_counter() < t_end and len(ts) < max_runs):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), float(np.min(ts))


def worker(threads, which, quick):
    """Runs in a subprocess: prints a JSON dict of {label: seconds}."""
    out = {}
    rng = np.random.default_rng(0)
    square = SQUARE[:2] if quick else SQUARE
    shapes = [("square", n, n, n) for n in square] + [("skinny", m, n, k) for m, n, k in SKINNY] + \
             [("small", m, n, k) for m, n, k in SMALL]
    if which == "numpy":
        for kind, m, n, k in shapes:
            a = rng.standard_normal((m, k)).astype(np.float32)
            if kind == "skinny":
                w = rng.standard_normal((n, k)).astype(np.float32)
                out[f"{kind} {m}x{n}x{k}"] = _median(lambda: a @ w.T)
            else:
                b = rng.standard_normal((k, n)).astype(np.float32)
                out[f"{kind} {m}x{n}x{k}"] = _median(lambda: a @ b, max_runs=RUNS[kind])
    else:
        import express as ex
        from express._lib import ffi, lib
        ex.set_num_threads(threads)
        ex.set_isa(which)
        vp = lambda x: ffi.cast("void *", x.__array_interface__["data"][0])  # noqa: E731
        fp = lambda x: ffi.cast("float *", x.__array_interface__["data"][0])  # noqa: E731
        for kind, m, n, k in shapes:
            a = rng.standard_normal((m, k)).astype(np.float32)
            c = np.empty((m, n), np.float32)
            pa, pc = fp(a), fp(c)  # pointers cast once: time the kernel call, not the casts
            if kind == "skinny":
                w = rng.standard_normal((n, k)).astype(np.float32)
                w16 = w.astype(np.float16)
                pw, pw16 = vp(w), vp(w16)
                out[f"{kind} {m}x{n}x{k}"] = _median(
                    lambda: lib.ex_linear(pa, pw, lib.EX_F32, ffi.NULL, ffi.NULL, pc, m, n, k, 0))
                out[f"{kind} {m}x{n}x{k} f16w"] = _median(
                    lambda: lib.ex_linear(pa, pw16, lib.EX_F16, ffi.NULL, ffi.NULL, pc, m, n, k, 0))
            else:
                b = rng.standard_normal((k, n)).astype(np.float32)
                va, vb, vc = vp(a), vp(b), vp(c)
                out[f"{kind} {m}x{n}x{k}"] = _median(
                    lambda: lib.ex_matmul(lib.EX_F32, va, k, 1, vb, n, 1, vc, m, n, k, 0, ffi.NULL, ffi.NULL, ffi.NULL),
                    max_runs=RUNS[kind])
    print(json.dumps(out))


def run(threads, which, coretype, quick):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), EXPRESS_NUM_THREADS=str(threads))
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    args = [sys.executable, os.path.abspath(__file__), "--worker", which, "--threads", str(threads)]
    r = subprocess.run(args + (["--quick"] if quick else []), env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--quick", action="store_true", help="square sizes up to 1024 only")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(int(a.threads), a.worker, a.quick)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import express as ex
    best = ex.isa()
    print(f"Express kernels: {best} (and avx2 for context); NumPy {np.__version__} / OpenBLAS with "
          "OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (its own choice for this CPU), and with "
          "OPENBLAS_CORETYPE=Haswell (AVX2) for context. Medians; GFLOP/s.\n")
    print("Cells: median GFLOP/s (best run in parentheses); ratios of medians (of best runs).\n")
    print(f"| shape (MxNxK) | threads | Express {best} | NumPy | Express / NumPy | Express avx2 | NumPy Haswell |"
          " avx2 / Haswell |")
    print("|---|---|---|---|---|---|---|---|")
    for nt in [int(t) for t in a.threads.split(",")]:
        e, n = run(nt, best, None, a.quick), run(nt, "numpy", None, a.quick)
        e2, nh = run(nt, "avx2", None, a.quick), run(nt, "numpy", "Haswell", a.quick)
        for key in e:
            base = key.replace(" f16w", "")
            m, nn, k = (int(v) for v in base.split()[1].split("x"))
            g = lambda t: f"{2 * m * nn * k / t[0] / 1e9:.1f} ({2 * m * nn * k / t[1] / 1e9:.1f})"  # noqa: E731
            r = lambda a, b: f"{a[0] / b[0]:.2f} ({a[1] / b[1]:.2f})"  # noqa: E731
            print(f"| {key} | {nt} | {g(e[key])} | {g(n[base])} | {r(n[base], e[key])} | {g(e2[key])} | "
                  f"{g(nh[base])} | {r(nh[base], e2[key])} |", flush=True)


if __name__ == "__main__":
    main()
