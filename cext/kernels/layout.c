/* ex_copy: gather a strided view into a contiguous row-major buffer.
 * Reference: the element-by-element loop in copy_rows.  Optimized: dims are coalesced, unit
 * inner stride rows are memcpy'd, 2-D transposes are done in cache-sized blocks, and large
 * copies are split over the pool by outer rows. */
#include "common.h"

typedef struct {
  int32_t es, nd;
  int64_t shape[EX_MAX_DIMS], str[EX_MAX_DIMS]; /* coalesced; str in elements of src */
  const char *src;
  char *dst;
  int64_t L; /* inner length */
} copy_ctx;

static void copy_elems(char *d, const char *s, int64_t st, int64_t n, int32_t es) {
  switch (es) {
#define CASE(T) { T *dd = (T *)d; const T *ss = (const T *)s; \
                  for (int64_t i = 0; i < n; i++) dd[i] = ss[i * st]; } break
  case 1: CASE(uint8_t);
  case 2: CASE(uint16_t);
  case 4: CASE(uint32_t);
  case 8: CASE(uint64_t);
#undef CASE
  default:
    for (int64_t i = 0; i < n; i++) memcpy(d + i * es, s + i * st * es, (size_t)es);
  }
}

/* dst rows [r0, r1) of the [rows, L] view */
static void copy_rows(void *vctx, int64_t r0, int64_t r1) {
  const copy_ctx *c = vctx;
  const int nd = c->nd;
  const int64_t L = c->L, st = c->str[nd - 1];
  int64_t idx[EX_MAX_DIMS] = {0}, off = 0;
  for (int64_t d = nd - 2, r = r0; d >= 0; d--) { idx[d] = r % c->shape[d]; r /= c->shape[d]; }
  for (int d = 0; d < nd - 1; d++) off += idx[d] * c->str[d];
  for (int64_t r = r0; r < r1; r++) {
    char *d = c->dst + r * L * c->es;
    const char *s = c->src + off * c->es;
    if (st == 1) memcpy(d, s, (size_t)(L * c->es));
    else copy_elems(d, s, st, L, c->es);
    for (int k = nd - 2; k >= 0; k--) { /* next row */
      off += c->str[k];
      if (++idx[k] < c->shape[k]) break;
      off -= c->shape[k] * c->str[k];
      idx[k] = 0;
    }
  }
}

/* 2-D transpose-like copy: dst[i, j] = src[i * s0 + j * s1] with |s1| large and s0 == 1;
 * done in blocks so both sides stay in cache.  Parallel over block rows [b0, b1). */
#define TB 32
typedef struct { const copy_ctx *c; int64_t M, N, batch_off; } tr_ctx;

static void transpose_blocks(void *vctx, int64_t b0, int64_t b1) {
  const tr_ctx *t = vctx;
  const copy_ctx *c = t->c;
  const int64_t N = t->N, s0 = c->str[c->nd - 2], s1 = c->str[c->nd - 1];
  const int32_t es = c->es;
  for (int64_t bi = b0; bi < b1; bi++) {
    const int64_t i0 = bi * TB, i1 = EX_MIN(t->M, i0 + TB);
    for (int64_t j0 = 0; j0 < N; j0 += TB) {
      const int64_t j1 = EX_MIN(N, j0 + TB);
      /* walk j outer so the source reads along s0 (unit) are sequential */
      for (int64_t j = j0; j < j1; j++) {
        const char *s = c->src + (t->batch_off + i0 * s0 + j * s1) * es;
        char *d = c->dst + (i0 * N + j) * es;
        switch (es) {
#define CASE(T) for (int64_t i = 0; i < i1 - i0; i++) ((T *)d)[i * N] = ((const T *)s)[i * s0]; break
        case 1: CASE(uint8_t);
        case 2: CASE(uint16_t);
        case 4: CASE(uint32_t);
        case 8: CASE(uint64_t);
#undef CASE
        default:
          for (int64_t i = 0; i < i1 - i0; i++) memcpy(d + i * N * es, s + i * s0 * es, (size_t)es);
        }
      }
    }
  }
}

static int copy(int32_t elem_size, const void *src, const int64_t *src_strides, void *dst,
                int32_t ndim, const int64_t *shape) {
  if (elem_size <= 0 || ndim < 0 || ndim > EX_MAX_DIMS || (ndim && (!shape || !src_strides)))
    return EX_EINVAL;
  int64_t total = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) return EX_EINVAL;
    total *= shape[d];
  }
  if (total == 0) return EX_OK;
  if (!src || !dst) return EX_EINVAL;

  copy_ctx c = {.es = elem_size, .src = src, .dst = dst};
  int nd = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    if (nd > 0 && c.str[nd - 1] == src_strides[d] * shape[d]) {
      c.shape[nd - 1] *= shape[d];
      c.str[nd - 1] = src_strides[d];
    } else {
      c.shape[nd] = shape[d];
      c.str[nd++] = src_strides[d];
    }
  }
  if (nd == 0) { c.shape[0] = 1; c.str[0] = 1; nd = 1; }
  c.nd = nd;
  c.L = c.shape[nd - 1];
  const int64_t rows = total / c.L;

  const int64_t s_in = c.str[nd - 1];
  if (nd >= 2 && c.str[nd - 2] == 1 && (s_in > 16 || s_in < -16) && c.L >= 8 && c.shape[nd - 2] >= 8) {
    /* the inner dst dim walks far in src while the next one is unit: blocked transpose */
    const int64_t M = c.shape[nd - 2], N = c.L, nb = (M + TB - 1) / TB;
    const int64_t batches = rows / M;
    int64_t idx[EX_MAX_DIMS] = {0};
    for (int64_t b = 0; b < batches; b++) {
      int64_t off = 0;
      for (int64_t d = nd - 3, r = b; d >= 0; d--) { idx[d] = r % c.shape[d]; r /= c.shape[d]; }
      for (int d = 0; d < nd - 2; d++) off += idx[d] * c.str[d];
      copy_ctx cb = c;
      cb.dst = c.dst + b * M * N * elem_size;
      tr_ctx t = {&cb, M, N, off};
      ex_parallel_for(nb, EX_MAX(1, (65536 / (TB * N)) + 1), transpose_blocks, &t);
    }
    return EX_OK;
  }
  ex_parallel_for(rows, EX_MAX(1, 65536 / c.L), copy_rows, &c);
  return EX_OK;
}
