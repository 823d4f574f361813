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
#include "kernels/common.h"
#include "kernels/elementwise.c"
#include "kernels/layout.c"
#include "kernels/reduce.c"
#include "kernels/gemm.c"
#include "kernels/norm.c"
#include "kernels/conv.c"
#include "kernels/pool.c"
#include "kernels/normalize.c"
#include "kernels/attention.c"

const ex_kernel_table ex_kernels_avx2 = {
    .elementwise = elementwise, .copy = copy, .reduce = reduce, .cumsum = cumsum,
    .matmul = matmul, .softmax = softmax, .linear = linear, .conv2d = conv2d, .winograd_weights = winograd_weights,
    .conv_packed_size = conv_packed_size, .conv_pack_weights = conv_pack_weights,
    .conv_transpose2d = conv_transpose2d, .pool2d = pool2d, .adaptive_pool2d = adaptive_pool2d,
    .resize2d = resize2d, .pad = pad, .layer_norm = layer_norm, .rms_norm = rms_norm,
    .group_norm = group_norm, .batch_norm = batch_norm, .attention = attention};
#pragma GCC pop_options
#else
typedef int ex_no_avx2_variant; /* keep the translation unit non-empty */
#endif
