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


def _calls(decls):
    """ex_run_calls' table, written from the declarations: for every `int ex_NAME(params)`, a
    struct ex_args_NAME of its parameters, a number EX_CALL_NAME, and a trampoline that unpacks
    the struct.  Returns (declarations for cffi, C source)."""
    fns = [(name, [" ".join(a.split()) for a in params.split(",")])
           for name, params in re.findall(r"\bint\s+ex_(\w+)\s*\(([^)]*)\)\s*;", decls)
           if params.strip() != "void" and name not in ("set_isa", "run_calls")]  # kernels only
    structs = "".join(f"typedef struct {{ {' '.join(a + ';' for a in params)} }} ex_args_{name};\n"
                      for name, params in fns)
    kinds = "enum ex_call_kind { " + ", ".join(f"EX_CALL_{name.upper()}" for name, _ in fns) + ", EX_CALL_COUNT };\n"
    field = lambda a: re.search(r"(\w+)$", a).group(1)  # noqa: E731
    source = structs + kinds + "".join(
        f"static int call_{name}(const void *p) {{ const ex_args_{name} *a = p; "
        f"return ex_{name}({', '.join('a->' + field(a) for a in params)}); }}\n" for name, params in fns)
    source += ("static int (*const CALLS[EX_CALL_COUNT])(const void *) = {"
               + ", ".join(f"call_{name}" for name, _ in fns) + "};\n"
               "int ex_run_calls(const ex_call *calls, int64_t n, int64_t *failed) {\n"
               "  for (int64_t i = 0; i < n; i++) {\n"
               "    const ex_call *c = &calls[i];\n"
               "    const int rc = c->kind >= 0 && c->kind < EX_CALL_COUNT && c->args ? CALLS[c->kind](c->args) : EX_EINVAL;\n"
               "    if (rc) { *failed = i; return rc; }\n"
               "  }\n"
               "  return EX_OK;\n"
               "}\n")
    return structs + kinds, source


KERNELS = ["half.h", "elementwise.c", "layout.c", "reduce.c", "gemm.c", "norm.c", "common.h",
           "depthwise.c", "conv.c", "pool.c", "normalize.c", "attention.c"]


def make_builder(base):
    """base: the cext folder as the compiler will see it from its working directory."""
    ffi = FFI()
    decls = _declarations()
    call_decls, call_source = _calls(decls)
    ffi.cdef(decls + call_decls)
    p = lambda *parts: os.path.join(base, *parts)  # noqa: E731
    ffi.set_source(
        "express._cext",
        '#include <stddef.h>\n#include <stdint.h>\n#include "express.h"\n' + call_source,
        sources=[p("runtime.c"), p("variant_generic.c"), p("variant_avx2.c"), p("variant_avx512.c"), p("kernels", "gather.c"), p("kernels", "qgemm.c"),
                 p("kernels", "ggml_quant.c")],
        depends=[p("express.h"), p("internal.h"), p("variant_body.h"), p("kernels", "ggml_quant_simd.inc"), p("kernels", "simd_avx2.h")] + [p("kernels", k) for k in KERNELS],
        include_dirs=[base],
        # C11 without FP contraction, so both variants round exactly as written; no -ffast-math
        # (NaN/inf semantics must match NumPy); -fno-math-errno only lets sqrtf & co. inline, and
        # -fno-trapping-math (no FP exception flags are read) lets GCC if-convert and so vectorize
        # loops with float selects: SiLU, GELU-tanh, max/min were scalar loops without it.
        extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
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
