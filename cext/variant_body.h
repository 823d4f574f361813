/* The body of every kernel variant: all kernel sources and the table of entry points, named
 * EX_TABLE. Each variant_*.c sets its target ISA, then includes this once. */
#include "kernels/common.h"
#include "kernels/elementwise.c"
#include "kernels/layout.c"
#include "kernels/reduce.c"
#include "kernels/gemm.c"
#include "kernels/norm.c"
#include "kernels/depthwise.c"
#include "kernels/conv.c"
#include "kernels/pool.c"
#include "kernels/normalize.c"
#include "kernels/attention.c"

const ex_kernel_table EX_TABLE = {
    .elementwise = elementwise, .copy = copy, .reduce = reduce, .cumsum = cumsum,
    .matmul = matmul, .softmax = softmax, .linear = linear, .conv2d = conv2d, .conv_pwdw = conv_pwdw, .winograd_weights = winograd_weights,
    .conv_packed_size = conv_packed_size, .conv_pack_weights = conv_pack_weights,
    .conv_transpose2d = conv_transpose2d, .pool2d = pool2d, .adaptive_pool2d = adaptive_pool2d,
    .resize2d = resize2d, .pad = pad, .layer_norm = layer_norm, .rms_norm = rms_norm,
    .group_norm = group_norm, .batch_norm = batch_norm, .attention = attention};
