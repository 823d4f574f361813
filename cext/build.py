"""cffi builder (API mode) for express._cext, the C kernel library.

setup.py runs it through ``cffi_modules=["cext/build.py:ffibuilder"]`` from the repository
root; ``python cext/build.py`` builds the extension in place into express/ for development.
"""
import os
import re
import shutil
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _declarations():
    with open(os.path.join(HERE, "express.h")) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


KERNELS = ["half.h", "elementwise.c", "layout.c", "reduce.c", "gemm.c", "norm.c", "common.h",
           "depthwise.c", "conv.c", "pool.c", "normalize.c", "attention.c"]


def make_builder(base):
    """base: the cext folder as the compiler will see it from its working directory."""
    ffi = FFI()
    ffi.cdef(_declarations())
    p = lambda *parts: os.path.join(base, *parts)  # noqa: E731
    ffi.set_source(
        "express._cext",
        '#include <stddef.h>\n#include <stdint.h>\n#include "express.h"\n',
        sources=[p("runtime.c"), p("variant_generic.c"), p("variant_avx2.c"), p("variant_avx512.c"), p("kernels", "gather.c"), p("kernels", "qgemm.c"),
                 p("kernels", "ggml_quant.c")],
        depends=[p("express.h"), p("internal.h"), p("variant_body.h"), p("kernels", "ggml_quant_simd.inc")] + [p("kernels", k) for k in KERNELS],
        include_dirs=[base],
        # C11 without FP contraction, so both variants round exactly as written; no -ffast-math
        # (NaN/inf semantics must match NumPy); -fno-math-errno only lets sqrtf & co. inline.
        extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-fno-math-errno",
                            "-Wall", "-Wextra", "-Wno-unused-parameter"],
        libraries=["m", "pthread"],
    )
    return ffi


# setuptools loads this file with the repository root as cwd and wants relative paths there
ffibuilder = make_builder("cext" if os.path.abspath(os.getcwd()) == ROOT else HERE)

if __name__ == "__main__":
    # cffi compiles from inside tmpdir, so give it absolute paths
    so = make_builder(HERE).compile(tmpdir=os.path.join(ROOT, "build", "cffi"), verbose="-q" not in sys.argv)
    dest = os.path.join(ROOT, "express", os.path.basename(so))
    # copy then rename: overwriting the file in place would corrupt processes that have it loaded
    shutil.copy(so, dest + ".tmp")
    os.replace(dest + ".tmp", dest)
    print(dest)
