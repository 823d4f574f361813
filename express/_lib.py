"""The compiled C library (built by cffi at install time) and the runtime switches around it."""
from __future__ import annotations

import os

from .errors import ExpressError, KernelError

try:
    from ._cext import ffi, lib
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError("express's C library is not built; install with `pip install -e .` "
                      f"(needs a C compiler): {e}") from None

_ERRORS = {lib.EX_EINVAL: "invalid argument", lib.EX_ENOMEM: "out of memory",
           lib.EX_EDTYPE: "unsupported dtype", lib.EX_EOPCODE: "bad opcode"}


def check(rc: int, what: str) -> None:
    """Turn a C error code into an exception naming the kernel."""
    if rc != 0:
        if rc == lib.EX_ENOMEM:
            raise MemoryError(f"{what}: out of memory")
        raise KernelError(f"{what}: {_ERRORS.get(rc, f'error {rc}')}")


class KernelCall:
    """A plan step that is one C kernel call, `lib.ex_NAME(*args)`, its arguments fixed when the
    plan is built.  It runs alone when called, or with its neighbours in one `ex_run_calls`
    (express/plan.py), which saves a trip through Python per kernel.  `fail(rc)` raises for a
    nonzero return (default: `check`); `keep` holds what the pointers in `args` point into."""

    def __init__(self, name: str, args: tuple, what: str, fail=None, keep=None):
        self.fn, self.args, self.what, self.keep = getattr(lib, "ex_" + name), args, what, keep
        self.kind = getattr(lib, "EX_CALL_" + name.upper())
        self.packed = ffi.new(f"ex_args_{name} *", list(args))
        if fail is not None:
            self.fail = fail

    def fail(self, rc: int) -> None:
        check(rc, self.what)

    def __call__(self):
        rc = self.fn(*self.args)
        if rc:
            self.fail(rc)


def set_num_threads(n: int) -> None:
    """Use `n` threads in the kernels (the default is the number of CPUs)."""
    n = int(n)
    if n < 1:
        raise ExpressError(f"set_num_threads: need n >= 1, got {n}")
    lib.ex_set_num_threads(n)


def get_num_threads() -> int:
    return lib.ex_get_num_threads()


def isa() -> str:
    """The kernel variant in use: 'avx512', 'avx2' or 'generic' (the portable C fallback)."""
    return {lib.EX_ISA_AVX512: "avx512", lib.EX_ISA_AVX2: "avx2"}.get(lib.ex_isa(), "generic")


def set_isa(name: str) -> None:
    """Switch kernels: 'avx512', 'avx2' or 'generic'. `EXPRESS_ISA=...` caps the choice at start-up."""
    code = {"avx512": lib.EX_ISA_AVX512, "avx2": lib.EX_ISA_AVX2, "generic": lib.EX_ISA_GENERIC}.get(name)
    if code is None or lib.ex_set_isa(code) != 0:
        have = (["avx512"] if lib.ex_cpu_has_avx512() else []) + (["avx2"] if lib.ex_cpu_has_avx2() else [])
        raise ExpressError(f"set_isa: {name!r} is not available on this CPU (have: {', '.join(have + ['generic'])})")


def memory_stats() -> dict:
    """Bytes Express's allocator holds now and at its peak (since the last reset)."""
    return {"current": int(lib.ex_mem_current()), "peak": int(lib.ex_mem_peak())}


def reset_peak_memory() -> None:
    lib.ex_mem_reset_peak()


def ptr(a) -> int:
    """The address of a NumPy array's first element."""
    return a.__array_interface__["data"][0]


if os.environ.get("EXPRESS_ISA") not in (None, "", "generic", "avx2", "avx512"):
    raise ExpressError(f"EXPRESS_ISA must be 'generic', 'avx2' or 'avx512', got {os.environ['EXPRESS_ISA']!r}")
