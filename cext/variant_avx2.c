/* The AVX2 + FMA + F16C build of every kernel: the same sources as variant_generic.c compiled
 * under a target pragma (no global -m flags, so the library still loads on any x86-64), with
 * EX_AVX2 enabling the intrinsic fast paths.  runtime.c only selects it when the CPU has all
 * three features.  Other architectures compile nothing here. */
#if defined(__x86_64__)
/* system headers first, outside the target region */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define EX_AVX2 1
#define EX_TABLE ex_kernels_avx2
#include "variant_body.h"
#pragma GCC pop_options
#else
typedef int ex_no_avx2_variant; /* keep the translation unit non-empty */
#endif
