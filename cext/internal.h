/* Private interface between runtime.c and the kernel variants: the dispatch table each variant
 * exports, and the thread pool the kernels share. */
#ifndef EX_INTERNAL_H
#define EX_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "express.h"

typedef struct {
  int (*elementwise)(const ex_program *p);
  int (*copy)(int32_t elem_size, const void *src, const int64_t *src_strides, void *dst,
              int32_t ndim, const int64_t *shape);
  int (*reduce)(int32_t op, int32_t in_dtype, const void *x, int32_t out_dtype, void *y,
                int64_t outer, int64_t r, int64_t inner);
  int (*cumsum)(int32_t in_dtype, const void *x, int32_t out_dtype, void *y,
                int64_t outer, int64_t r, int64_t inner);
  int (*matmul)(int32_t dtype, const void *a, int64_t a_rs, int64_t a_cs,
                const void *b, int64_t b_rs, int64_t b_cs, void *c,
                int64_t m, int64_t n, int64_t k,
                int32_t nbatch_dims, const int64_t *batch_shape,
                const int64_t *a_bs, const int64_t *b_bs);
  int (*softmax)(const float *x, float *y, int64_t outer, int64_t r, int64_t inner, int32_t log);
} ex_kernel_table;

extern const ex_kernel_table ex_kernels_generic;
#if defined(__x86_64__)
extern const ex_kernel_table ex_kernels_avx2;
#endif

/* Run fn(ctx, begin, end) over disjoint ranges covering [0, n), each at least `grain` items
 * (except the last), on the pool; the caller takes part.  Runs inline when n <= grain, with one
 * thread, inside another task, or while another thread holds the pool. */
typedef void (*ex_task_fn)(void *ctx, int64_t begin, int64_t end);
void ex_parallel_for(int64_t n, int64_t grain, ex_task_fn fn, void *ctx);
/* Threads a parallel_for issued from here would use (1 inside a task). */
int ex_pool_width(void);

#endif
