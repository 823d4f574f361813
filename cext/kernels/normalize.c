/* ex_layer_norm, ex_rms_norm, ex_group_norm, ex_batch_norm over contiguous float32 data.
 * Reference: two-pass mean and variance (biased, as PyTorch), y = (x - mean) / sqrt(var + eps)
 * * weight + bias.  Statistics accumulate per 4096-element block in float lanes and across
 * blocks in double, so long groups (group_norm over H*W) keep full float accuracy.  Rows or
 * groups are split over the pool; the affine and an optional activation are fused. */
#include "common.h"

#define NB 4096

static void mean_rstd(const float *x, int64_t n, float eps, float *mu, float *rs) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i += NB) s += sum_f32(x + i, EX_MIN(NB, n - i));
  const float m = (float)(s / (double)n);
  double v = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += NB) {
    const int64_t e = EX_MIN(n, i0 + NB);
    float l[16] = {0};
    int64_t i = i0;
    for (; i + 16 <= e; i += 16)
      for (int j = 0; j < 16; j++) { const float d = x[i + j] - m; l[j] += d * d; }
    float t = 0.0f;
    for (; i < e; i++) { const float d = x[i] - m; t += d * d; }
    for (int j = 0; j < 16; j++) t += l[j];
    v += t;
  }
  *mu = m;
  *rs = (float)(1.0 / sqrt(v / (double)n + (double)eps));
}

static float mean_sq(const float *x, int64_t n) {
  double v = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += NB) {
    const int64_t e = EX_MIN(n, i0 + NB);
    float l[16] = {0}, t = 0.0f;
    int64_t i = i0;
    for (; i + 16 <= e; i += 16)
      for (int j = 0; j < 16; j++) l[j] += x[i + j] * x[i + j];
    for (; i < e; i++) t += x[i] * x[i];
    for (int j = 0; j < 16; j++) t += l[j];
    v += t;
  }
  return (float)(v / (double)n);
}

typedef struct {
  const float *x, *w, *b, *mean, *var;
  float *y;
  int64_t n, c, inner, groups;
  float eps;
  int32_t act, rms;
} nm_ctx;

static void ln_task(void *vctx, int64_t r0, int64_t r1) {
  const nm_ctx *g = vctx;
  const int64_t n = g->n;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = g->x + r * n;
    float *y = g->y + r * n;
    float mu = 0.0f, rs;
    if (g->rms) rs = 1.0f / sqrtf(mean_sq(x, n) + g->eps);
    else mean_rstd(x, n, g->eps, &mu, &rs);
    if (g->w && g->b)
      for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mu) * rs * g->w[i] + g->b[i];
    else if (g->w)
      for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mu) * rs * g->w[i];
    else if (g->b)
      for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mu) * rs + g->b[i];
    else
      for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mu) * rs;
  }
}

static int layer_norm(const float *x, const float *w, const float *b, float *y, int64_t rows,
                      int64_t n, float eps) {
  if (rows < 0 || n < 0) return EX_EINVAL;
  if (rows * n == 0) return EX_OK;
  if (!x || !y) return EX_EINVAL;
  nm_ctx g = {x, w, b, NULL, NULL, y, n, 0, 0, 0, eps, 0, 0};
  ex_parallel_for(rows, EX_MAX(1, 16384 / n), ln_task, &g);
  return EX_OK;
}

static int rms_norm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps) {
  if (rows < 0 || n < 0) return EX_EINVAL;
  if (rows * n == 0) return EX_OK;
  if (!x || !y) return EX_EINVAL;
  nm_ctx g = {x, w, NULL, NULL, NULL, y, n, 0, 0, 0, eps, 0, 1};
  ex_parallel_for(rows, EX_MAX(1, 16384 / n), ln_task, &g);
  return EX_OK;
}

static void gn_task(void *vctx, int64_t q0, int64_t q1) {
  const nm_ctx *g = vctx;
  const int64_t cg = g->c / g->groups, len = cg * g->inner;
  for (int64_t q = q0; q < q1; q++) { /* (image, group) */
    const float *x = g->x + q * len;
    float *y = g->y + q * len;
    float mu, rs;
    mean_rstd(x, len, g->eps, &mu, &rs);
    for (int64_t ci = 0; ci < cg; ci++) {
      const int64_t ch = q % g->groups * cg + ci;
      const float s = rs * (g->w ? g->w[ch] : 1.0f), t = (g->b ? g->b[ch] : 0.0f) - mu * s;
      const float *xc = x + ci * g->inner;
      float *yc = y + ci * g->inner;
      for (int64_t i = 0; i < g->inner; i++) yc[i] = xc[i] * s + t;
      act_row(g->act, yc, g->inner);
    }
  }
}

static int group_norm(const float *x, const float *w, const float *b, float *y, int64_t n,
                      int64_t c, int64_t inner, int64_t groups, float eps, int32_t act) {
  if (n < 0 || c < 1 || inner < 0 || groups < 1 || c % groups || !act_ok(act)) return EX_EINVAL;
  if (n * inner == 0) return EX_OK;
  if (!x || !y) return EX_EINVAL;
  nm_ctx g = {x, w, b, NULL, NULL, y, n, c, inner, groups, eps, act, 0};
  ex_parallel_for(n * groups, EX_MAX(1, 32768 / (c / groups * inner)), gn_task, &g);
  return EX_OK;
}

static void bn_task(void *vctx, int64_t q0, int64_t q1) {
  const nm_ctx *g = vctx;
  for (int64_t q = q0; q < q1; q++) { /* (image, channel) planes */
    const int64_t ch = q % g->c;
    const double sd = 1.0 / sqrt((double)g->var[ch] + (double)g->eps) * (g->w ? g->w[ch] : 1.0);
    const float s = (float)sd, t = (float)((g->b ? g->b[ch] : 0.0) - g->mean[ch] * sd);
    const float *xc = g->x + q * g->inner;
    float *yc = g->y + q * g->inner;
    for (int64_t i = 0; i < g->inner; i++) yc[i] = xc[i] * s + t;
    act_row(g->act, yc, g->inner);
  }
}

static int batch_norm(const float *x, const float *mean, const float *var, const float *w,
                      const float *b, float *y, int64_t n, int64_t c, int64_t inner, float eps,
                      int32_t act) {
  if (n < 0 || c < 0 || inner < 0 || !act_ok(act)) return EX_EINVAL;
  if (n * c * inner == 0) return EX_OK;
  if (!x || !y || !mean || !var) return EX_EINVAL;
  nm_ctx g = {x, w, b, mean, var, y, n, c, inner, 0, eps, act, 0};
  ex_parallel_for(n * c, EX_MAX(1, 32768 / inner), bn_task, &g);
  return EX_OK;
}
