"""Per-op dispatch overhead: building and evaluating a tiny op, and replaying a compiled plan,
side by side with NumPy doing the same work. Medians over several runs.

    python benchmarks/overhead.py [--threads 1 2]

Targets: a tiny op under 20 us eager (build + eval), under 3 us per op in a compiled plan."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import express as ex


def timeit(fn, number, repeat=7):
    """Median seconds per call over `repeat` runs of `number` calls."""
    fn()
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t) / number)
    return statistics.median(runs)


def chain(x, w, n):
    for _ in range(n):
        x = x @ w  # matmul steps do not fuse: one kernel call each
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    a = np.ones((4,), np.float32)
    w4 = np.eye(4, dtype=np.float32)
    n = 100
    rows = []
    for th in args.threads:
        ex.set_num_threads(th)
        xa = ex.asarray(a)
        eager = timeit(lambda: (xa + 1.0).numpy(), 2000)
        eager3 = timeit(lambda: ex.exp(xa * 2.0 + 1.0).numpy(), 2000)
        np1 = timeit(lambda: a + np.float32(1.0), 20000)
        ew = ex.compile(lambda x: chain_ew(x, n))
        mm = ex.compile(lambda x: chain(x, ex.asarray(w4), n))
        ew_t = timeit(lambda: ew(a), 500) / n
        mm_t = timeit(lambda: mm(a[None]), 500) / n
        np_ew = timeit(lambda: chain_ew_np(a, n), 500) / n
        np_mm = timeit(lambda: chain(a[None], w4, n), 500) / n
        rows += [(th, "tiny op, eager build+eval (x + 1)", eager, np1),
                 (th, "3 tiny ops, eager build+eval", eager3, None),
                 (th, f"compiled: {n} elementwise ops (fused), per op", ew_t, np_ew),
                 (th, f"compiled: {n} matmul 1x4 @ 4x4 (unfused), per op", mm_t, np_mm)]
    print("| threads | case | express (us) | numpy (us) |")
    print("|---|---|---|---|")
    for th, case, t, tn in rows:
        print(f"| {th} | {case} | {t * 1e6:.2f} | {'' if tn is None else f'{tn * 1e6:.2f}'} |")


def chain_ew(x, n):
    for i in range(n):
        x = x * 1.0001 if i % 2 else x + 0.5
    return x


def chain_ew_np(x, n):
    for i in range(n):
        x = x * np.float32(1.0001) if i % 2 else x + np.float32(0.5)
    return x


if __name__ == "__main__":
    main()
