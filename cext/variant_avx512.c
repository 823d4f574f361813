/* The AVX-512 build of every kernel: the same sources as variant_avx2.c under a wider target
 * pragma, with EX_AVX2 (every AVX2 fast path) and EX_AVX512 (the 14x32 GEMM micro-kernel).
 * runtime.c only selects it when the CPU has avx512 f/bw/vl/dq besides avx2/fma/f16c (every such
 * CPU also has prefetchw, which the GEMM uses to fetch the C lines it will write). */
#if defined(__x86_64__)
/* system headers first, outside the target region */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2,prfchw")
#define EX_AVX2 1
#define EX_AVX512 1
#define EX_TABLE ex_kernels_avx512
#include "variant_body.h"
#pragma GCC pop_options
#else
typedef int ex_no_avx512_variant; /* keep the translation unit non-empty */
#endif
