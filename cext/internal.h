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
  int (*linear)(const float *x, const void *w, int32_t w_dtype, const float *bias, const float *res,
                float *y, int64_t m, int64_t n, int64_t k, int32_t act);
  int (*conv2d)(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                const float *res, float *y);
  int (*conv_pwdw)(const ex_conv_params *p1, const float *w1, const float *b1, const ex_conv_params *p2,
                   const float *w2, const float *b2, const float *x, const float *res, float *y);
  int (*winograd_weights)(const float *w, float *u, int64_t oc, int64_t ic);
  int64_t (*conv_packed_size)(const ex_conv_params *p);
  int (*conv_pack_weights)(const ex_conv_params *p, const float *w, float *out);
  int (*conv_transpose2d)(const ex_conv_params *p, const float *x, const float *w,
                          const float *bias, float *y);
  int (*pool2d)(int32_t kind, const float *x, float *y, int64_t nc, int64_t h, int64_t w,
                int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                int64_t ph, int64_t pw, int64_t dh, int64_t dw);
  int (*adaptive_pool2d)(int32_t kind, const float *x, float *y, int64_t nc, int64_t h, int64_t w,
                         int64_t oh, int64_t ow);
  int (*resize2d)(int32_t mode, int32_t align_corners, const float *x, float *y, int64_t nc,
                  int64_t h, int64_t w, int64_t oh, int64_t ow, float scale_h, float scale_w);
  int (*pad)(int32_t elem_size, int32_t mode, const void *x, void *y, int64_t outer,
             const int64_t *in_shape, const int64_t *before, const int64_t *after, const void *value);
  int (*layer_norm)(const float *x, const float *w, const float *b, float *y, int64_t rows,
                    int64_t n, float eps);
  int (*rms_norm)(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps);
  int (*group_norm)(const float *x, const float *w, const float *b, float *y, int64_t n, int64_t c,
                    int64_t inner, int64_t groups, float eps, int32_t act);
  int (*batch_norm)(const float *x, const float *mean, const float *var, const float *w,
                    const float *b, float *y, int64_t n, int64_t c, int64_t inner, float eps,
                    int32_t act);
  int (*attention)(const float *q, const int64_t *q_strides, const float *k,
                   const int64_t *k_strides, const float *v, const int64_t *v_strides,
                   const float *mask, const int64_t *mask_strides, float *y, int64_t b, int64_t hq,
                   int64_t hk, int64_t lq, int64_t lk, int64_t d, int64_t dv, float scale,
                   int32_t causal);
} ex_kernel_table;

extern const ex_kernel_table ex_kernels_generic;
#if defined(__x86_64__)
extern const ex_kernel_table ex_kernels_avx2;
extern const ex_kernel_table ex_kernels_avx512;
#endif

/* Run fn(ctx, begin, end) over disjoint ranges covering [0, n), each about `grain` items or more
 * (the last may be shorter), at most 4 a thread and where possible a whole number a thread, on
 * the pool; the caller takes part.  Runs inline when n <= grain, with one
 * thread, inside another task, or while another thread holds the pool. */
typedef void (*ex_task_fn)(void *ctx, int64_t begin, int64_t end);
void ex_parallel_for(int64_t n, int64_t grain, ex_task_fn fn, void *ctx);
/* The items in each range that ex_parallel_for(n, grain, ...) issued from here would make (the
 * last may be shorter; n when it would run inline), for a caller that plans around its split. */
int64_t ex_parallel_per(int64_t n, int64_t grain);
/* Threads a parallel_for issued from here would use (1 inside a task). */
int ex_pool_width(void);
/* 64-byte aligned; with `huge`, from 1 MB up mapped on transparent huge pages (for memory kept
 * and reused); freed by ex_aligned_free with the same size and `huge` */
void *ex_aligned_alloc(size_t nbytes, int huge);
void ex_aligned_free(void *p, size_t nbytes, int huge);

/* A memory-bound one-row product walks its share [lo, hi) of the weights as EX_PARTS parts side
 * by side (one stream leaves a core short of the memory's rate), their lengths differing by at
 * most one.  ex_part_start: where part q starts (part EX_PARTS: hi).  EX_WALK_PARTS calls
 * WALK(args..., start, count, S) for S parts from start[0 .. S), count items each: once over
 * every part's first items, then once over the extra item of the longer parts, S a constant in
 * each call so that an always-inline WALK keeps its S streams in registers.  (A rest walked one
 * item at a time would be read as one stream.) */
#define EX_PARTS 4
static inline int64_t ex_part_start(int64_t lo, int64_t hi, int64_t q) {
  const int64_t rem = (hi - lo) % EX_PARTS;
  return lo + q * ((hi - lo) / EX_PARTS) + (q < rem ? q : rem);
}
#define EX_WALK_PARTS(lo, hi, WALK, ...)                                                          \
  do {                                                                                            \
    const int64_t base_ = ((hi) - (lo)) / EX_PARTS;                                               \
    const int rem_ = (int)(((hi) - (lo)) % EX_PARTS);                                             \
    int64_t start_[EX_PARTS], tail_[EX_PARTS];                                                    \
    for (int q_ = 0; q_ < EX_PARTS; q_++) {                                                       \
      start_[q_] = ex_part_start(lo, hi, q_);                                                     \
      tail_[q_] = start_[q_] + base_;                                                             \
    }                                                                                             \
    if (base_) WALK(__VA_ARGS__, start_, base_, EX_PARTS);                                        \
    if (rem_ == 1) WALK(__VA_ARGS__, tail_, 1, 1);                                                \
    if (rem_ == 2) WALK(__VA_ARGS__, tail_, 1, 2);                                                \
    if (rem_ == 3) WALK(__VA_ARGS__, tail_, 1, 3);                                                \
  } while (0)
_Static_assert(EX_PARTS == 4, "EX_WALK_PARTS walks a rest of at most 3 items");

#endif
