/* The AVX-512 build of every kernel: the same sources as variant_avx2.c under a wider target
 * pragma, with EX_AVX2 (every AVX2 fast path) and EX_AVX512 (the 14x32 GEMM micro-kernel).
 * runtime.c only selects it when the CPU has avx512 f/bw/vl/dq besides avx2/fma/f16c. */
#if defined(__x86_64__)
/* system headers first, outside the target region */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")
#define EX_AVX2 1
#define EX_AVX512 1
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

const ex_kernel_table ex_kernels_avx512 = {
    .elementwise = elementwise, .copy = copy, .reduce = reduce, .cumsum = cumsum,
    .matmul = matmul, .softmax = softmax, .linear = linear, .conv2d = conv2d, .winograd_weights = winograd_weights,
    .conv_packed_size = conv_packed_size, .conv_pack_weights = conv_pack_weights,
    .conv_transpose2d = conv_transpose2d, .pool2d = pool2d, .adaptive_pool2d = adaptive_pool2d,
    .resize2d = resize2d, .pad = pad, .layer_norm = layer_norm, .rms_norm = rms_norm,
    .group_norm = group_norm, .batch_norm = batch_norm, .attention = attention};
#pragma GCC pop_options
#else
typedef int ex_no_avx512_variant; /* keep the translation unit non-empty */
#endif
