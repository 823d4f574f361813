"""Hand-run performance sanity check for the C kernels (not a test).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python cext/perf.py

Measures elementwise add of 4M floats against NumPy, the per-call cost of a 1-element
program (minus the cffi call overhead, measured on a trivial entry point), and sgemm
GFLOP/s against numpy.matmul (OpenBLAS) at 1 and 2 threads (each thread count runs in its
own process so OpenBLAS can be pinned with OPENBLAS_NUM_THREADS).
"""
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from express._cext import ffi, lib  # noqa: E402


def best(f, reps):
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        t = min(t, time.perf_counter() - t0)
    return t


def add_program(a, b, c):
    n = a.size
    p = ffi.new("ex_program *", {"ndim": 1, "shape": [n], "n_in": 2, "n_out": 1, "n_instr": 1, "n_reg": 3})
    ins = ffi.new("ex_operand[2]", [{"data": ffi.cast("void *", a.ctypes.data), "dtype": lib.EX_F32, "reg": 0, "strides": [1]},
                                    {"data": ffi.cast("void *", b.ctypes.data), "dtype": lib.EX_F32, "reg": 1, "strides": [1]}])
    out = ffi.new("ex_operand[1]", [{"data": ffi.cast("void *", c.ctypes.data), "dtype": lib.EX_F32, "reg": 2, "strides": [1]}])
    code = ffi.new("ex_instr[1]", [{"op": lib.EX_OP_F_ADD, "dst": 2, "a": 0, "b": 1, "c": -1}])
    kinds = ffi.new("int32_t[3]", [lib.EX_REG_F] * 3)
    setattr(p, "in", ins)
    p.out, p.code, p.reg_kind = out, code, kinds
    return p, (ins, out, code, kinds)


def sgemm(a, b, c):
    n = a.shape[0]
    assert lib.ex_matmul(lib.EX_F32, ffi.cast("void *", a.ctypes.data), n, 1, ffi.cast("void *", b.ctypes.data), n, 1,
                         ffi.cast("void *", c.ctypes.data), n, n, n, 0, ffi.NULL, ffi.NULL, ffi.NULL) == 0


def child(threads):
    lib.ex_set_num_threads(threads)
    rows = []
    n = 1 << 22
    a, b, c = (np.random.rand(n).astype(np.float32) for _ in range(3))
    p, keep = add_program(a, b, c)
    t_ex = best(lambda: lib.ex_elementwise(p), 50)
    t_np = best(lambda: np.add(a, b, out=c), 50)
    rows.append(f"add 4M f32      express {t_ex * 1e3:6.2f} ms ({12 * n / t_ex / 1e9:5.1f} GB/s)   "
                f"numpy {t_np * 1e3:6.2f} ms ({12 * n / t_np / 1e9:5.1f} GB/s)")
    a1, b1, c1 = (np.ones(1, np.float32) for _ in range(3))
    p1, keep1 = add_program(a1, b1, c1)
    iters = 200000
    f, g = lib.ex_elementwise, lib.ex_isa
    t1 = best(lambda: [f(p1) for _ in range(iters)], 3) / iters
    t0 = best(lambda: [g() for _ in range(iters)], 3) / iters
    rows.append(f"1-element op    {t1 * 1e9:6.0f} ns per call from Python, ~{(t1 - t0) * 1e9:4.0f} ns in C")
    for n in (512, 1024, 2048):
        A, B = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
        C = np.empty((n, n), np.float32)
        reps = 10 if n < 2048 else 4
        t_ex = best(lambda: sgemm(A, B, C), reps)
        t_np = best(lambda: np.matmul(A, B, out=C), reps)
        ge, gn = 2 * n**3 / t_ex / 1e9, 2 * n**3 / t_np / 1e9
        rows.append(f"sgemm {n:4d}      express {ge:6.1f} GFLOP/s   numpy {gn:6.1f} GFLOP/s   ratio {ge / gn:5.2f}")
    print(f"--- {threads} thread(s), isa={'avx2' if lib.ex_isa() else 'generic'}")
    print("\n".join(rows), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(int(sys.argv[1]))
    else:
        for t in (1, 2):
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t))
            subprocess.run([sys.executable, __file__, str(t)], env=env, check=True)
