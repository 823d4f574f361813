/* ex_softmax over the middle axis of a contiguous f32 [outer, r, inner] array.
 * Reference: max-subtracted softmax, y = exp(x - max) / sum (log: x - max - log(sum)), libm expf.
 * Optimized: rows (inner == 1) use the pairwise sum; inner > 1 works on column blocks so each
 * pass is vectorizable along inner; slabs are split over the pool. */
#include "common.h"

#define SW 256 /* columns per block when inner > 1 */

typedef struct {
  const float *x;
  float *y;
  int64_t outer, r, inner, nblk;
  int32_t log;
} sm_ctx;

static void sm_row(const float *x, float *y, int64_t r, int32_t lg) {
  float m = -INFINITY;
  for (int64_t i = 0; i < r; i++) m = nan_max(m, x[i]);
  if (lg) { /* y may alias x: sum the exponentials through a buffer, then write once */
    float buf[1024], lv[EX_PW_LEVELS], s;
    pairwise_acc pw = {lv, 0, 1};
    for (int64_t i0 = 0; i0 < r; i0 += 1024) {
      const int64_t n = EX_MIN(1024, r - i0);
      for (int64_t i = 0; i < n; i++) buf[i] = expf(x[i0 + i] - m);
      s = sum_f32(buf, n);
      pw_push(&pw, &s);
    }
    pw_total(&pw, &s);
    const float ls = logf(s);
    for (int64_t i = 0; i < r; i++) y[i] = x[i] - m - ls;
  } else {
    for (int64_t i = 0; i < r; i++) y[i] = expf(x[i] - m);
    const float inv = 1.0f / sum_f32(y, r);
    for (int64_t i = 0; i < r; i++) y[i] *= inv;
  }
}

static void sm_cols(const float *x, float *y, int64_t r, int64_t inner, int64_t w, int32_t lg) {
  float m[SW], s[SW];
  for (int64_t j = 0; j < w; j++) { m[j] = -INFINITY; s[j] = 0.0f; }
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < w; j++) m[j] = nan_max(m[j], x[i * inner + j]);
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < w; j++) {
      const float e = expf(x[i * inner + j] - m[j]);
      s[j] += e;
      if (!lg) y[i * inner + j] = e;
    }
  for (int64_t j = 0; j < w; j++) s[j] = lg ? logf(s[j]) : 1.0f / s[j];
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < w; j++)
      y[i * inner + j] = lg ? x[i * inner + j] - m[j] - s[j] : y[i * inner + j] * s[j];
}

static void sm_task(void *vctx, int64_t b, int64_t e) {
  const sm_ctx *c = vctx;
  for (int64_t it = b; it < e; it++) {
    const int64_t o = it / c->nblk, j0 = (it % c->nblk) * SW, off = o * c->r * c->inner + j0;
    if (c->inner == 1) sm_row(c->x + off, c->y + off, c->r, c->log);
    else sm_cols(c->x + off, c->y + off, c->r, c->inner, EX_MIN(SW, c->inner - j0), c->log);
  }
}

static int softmax(const float *x, float *y, int64_t outer, int64_t r, int64_t inner, int32_t log) {
  if (outer < 0 || r < 0 || inner < 0) return EX_EINVAL;
  if (outer * r * inner == 0) return EX_OK;
  if (!x || !y) return EX_EINVAL;
  sm_ctx c = {x, y, outer, r, inner, (inner + SW - 1) / SW, log};
  ex_parallel_for(outer * c.nblk, EX_MAX(1, 16384 / (r * EX_MIN(inner, SW))), sm_task, &c);
  return EX_OK;
}
