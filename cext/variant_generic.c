/* The portable build of every kernel (baseline ISA of the target; plain C). */
#include "kernels/common.h"
#include "kernels/elementwise.c"
#include "kernels/layout.c"
#include "kernels/reduce.c"
#include "kernels/gemm.c"
#include "kernels/norm.c"

const ex_kernel_table ex_kernels_generic = {elementwise, copy, reduce, cumsum, matmul, softmax};
