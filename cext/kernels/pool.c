/* ex_pool2d, ex_adaptive_pool2d, ex_resize2d, ex_pad: spatial kernels over contiguous float32
 * planes (NCHW flattened to nc planes).  Reference semantics are PyTorch's:
 *   max pool: -inf padding, NaN propagates; avg pool: divisor is the window clipped to the
 *   padded input (count_include_pad) or to the input (EX_POOL_AVG_EXCL);
 *   adaptive: window [floor(i*H/oh), ceil((i+1)*H/oh));
 *   resize: nearest src = min(floor(dst * scale), in - 1); bilinear with half-pixel centres
 *   (align_corners = 0: src = (dst + 0.5) * scale - 0.5, clamped at 0) or corner alignment.
 * Planes are split over the pool. */
#include "common.h"

typedef struct {
  int32_t kind;
  const float *x;
  float *y;
  int64_t h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
} pool_ctx;

/* nan_max over n floats: d[i] = nan_max(d[i], s[i]) */
static void max_into(float *d, const float *s, int64_t n) {
  int64_t i = 0;
#ifdef EX_AVX2
  /* maxps returns its second operand when either is NaN: put s second, then keep d's own NaNs */
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(d + i), m = _mm256_max_ps(a, _mm256_loadu_ps(s + i));
    _mm256_storeu_ps(d + i, _mm256_blendv_ps(m, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q)));
  }
#endif
  for (; i < n; i++) d[i] = nan_max(d[i], s[i]);
}

/* Max pooling with column stride 2 (3x3 s2 in ResNets) reads the input rows in place: per output
 * row the max over the window's rows that lie inside the plane (unit stride, into the padded row
 * v), that row split into even and odd columns, then the max over the kw taps, every one a
 * unit-stride read: column 2 ox + j is ev[ox + j / 2] or od[ox + j / 2].
 * Otherwise the plane is copied into a padded buffer (-inf for max, 0 for avg), then per output
 * row a max/sum over the taps with unit (or constant) stride inner loops; avg divides by the
 * window size clipped as PyTorch does. */
#ifdef EX_AVX512
/* 3-wide windows at column stride 2, left padding 1 (ResNet's 3x3 s2 max pool), AVX-512: each
 * input row's max over the window's columns once, 16 outputs a step (its even columns, its odd
 * ones, and the odd ones one to the left), into h[row][ow], then per output row the max over the
 * window's rows.  ResNet-18's 64 x 112 x 112 at one thread: 0.36 -> 0.24 ms (the rows reused
 * from L1 rather than read again for the next output row, and prefetched).  Plain vmaxps drops
 * a NaN in its first operand, so a plane with a NaN anywhere returns 0 and takes the general
 * path. */
static int max3s2_plane(const pool_ctx *g, const float *x, float *y, float *h) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (int64_t r = 0; r < g->h; r++) {
    const float *xr = x + r * g->w;
    float *hr = h + r * g->ow;
    __m512 odp = ninf; /* the previous step's odd columns: column 2 ox - 1 is od[ox - 1] */
    for (int64_t o = 0; o < g->ow; o += 16) {
      const int64_t c = 2 * o, n0 = EX_MAX(0, EX_MIN(16, g->w - c)), n1 = EX_MAX(0, EX_MIN(16, g->w - c - 16));
      _mm_prefetch((const char *)(xr + c + 2048), _MM_HINT_T0); /* 8 KB on: 0.30 -> 0.24 ms */
      _mm_prefetch((const char *)(xr + c + 2064), _MM_HINT_T0);
      const __m512 v0 = _mm512_mask_loadu_ps(ninf, (__mmask16)((1u << n0) - 1), xr + c),
                   v1 = _mm512_mask_loadu_ps(ninf, (__mmask16)((1u << n1) - 1), xr + c + 16);
      nan |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q);
      __m512 ev, od;
      split512(v0, v1, &ev, &od);
      const __m512 left = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(od), _mm512_castps_si512(odp), 15));
      _mm512_mask_storeu_ps(hr + o, (__mmask16)(0xFFFFu >> (16 - EX_MIN(16, g->ow - o))),
                            _mm512_max_ps(_mm512_max_ps(left, ev), od));
      odp = od;
    }
  }
  if (nan) return 0;
  for (int64_t oy = 0; oy < g->oh; oy++)
    for (int64_t o = 0; o < g->ow; o += 16) {
      const __mmask16 m = (__mmask16)(0xFFFFu >> (16 - EX_MIN(16, g->ow - o)));
      __m512 a = ninf;
      for (int64_t i = 0; i < g->kh; i++) {
        const int64_t iy = oy * g->sh - g->ph + i;
        if (iy >= 0 && iy < g->h) a = _mm512_max_ps(a, _mm512_maskz_loadu_ps(m, h + iy * g->ow + o));
      }
      _mm512_mask_storeu_ps(y + oy * g->ow + o, m, a);
    }
  return 1;
}
#endif

static void pool_plane_fast(const pool_ctx *g, const float *x, float *y, float *pad, float *acc) {
  const int64_t PH = (g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1,
                PW = (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1;
  const int mx = g->kind == EX_POOL_MAX;
#ifdef EX_AVX512
  if (mx && g->kw == 3 && g->sw == 2 && g->pw == 1 && g->dw == 1 && g->dh == 1 && PH * PW >= g->h * g->ow &&
      max3s2_plane(g, x, y, pad))
    return;
#endif
  const float fill = mx ? -INFINITY : 0.0f;
  const int64_t lo = EX_MIN(g->pw, PW), hi = EX_MAX(EX_MIN(PW, g->pw + g->w), lo); /* inside the row */
  if (mx && g->sw == 2 && g->dw == 1) {
    float *v = acc + g->ow, *ev = v + PW, *od = ev + (PW + 1) / 2;
    for (int64_t c = 0; c < lo; c++) v[c] = -INFINITY;
    for (int64_t c = hi; c < PW; c++) v[c] = -INFINITY;
    for (int64_t oy = 0; oy < g->oh; oy++) {
      int rows = 0;
      for (int64_t i = 0; i < g->kh; i++) {
        const int64_t iy = oy * g->sh - g->ph + i * g->dh;
        if (iy < 0 || iy >= g->h) continue;
        const float *row = x + iy * g->w + (lo - g->pw);
        if (rows++) max_into(v + lo, row, hi - lo);
        else memcpy(v + lo, row, (size_t)(hi - lo) * sizeof(float));
      }
      if (!rows) for (int64_t c = lo; c < hi; c++) v[c] = -INFINITY;
      deinterleave(v, PW, ev, od);
      float *yr = y + oy * g->ow;
      memcpy(yr, ev, (size_t)g->ow * sizeof(float));
      for (int64_t j = 1; j < g->kw; j++) max_into(yr, (j & 1 ? od : ev) + j / 2, g->ow);
    }
    return;
  }
  for (int64_t r = 0; r < PH; r++) {
    const int64_t iy = r - g->ph;
    float *d = pad + r * PW;
    if (iy < 0 || iy >= g->h) { for (int64_t c = 0; c < PW; c++) d[c] = fill; continue; }
    for (int64_t c = 0; c < lo; c++) d[c] = fill;
    if (hi > lo) memcpy(d + lo, x + iy * g->w, (size_t)(hi - lo) * sizeof(float));
    for (int64_t c = hi; c < PW; c++) d[c] = fill;
  }
  for (int64_t oy = 0; oy < g->oh; oy++) {
    for (int64_t ox = 0; ox < g->ow; ox++) acc[ox] = fill;
    for (int64_t i = 0; i < g->kh; i++) {
      const float *row = pad + (oy * g->sh + i * g->dh) * PW;
      for (int64_t j = 0; j < g->kw; j++) {
        const float *s = row + j * g->dw;
        if (mx) {
          if (g->sw == 1) for (int64_t ox = 0; ox < g->ow; ox++) acc[ox] = nan_max(acc[ox], s[ox]);
          else if (g->sw == 2) for (int64_t ox = 0; ox < g->ow; ox++) acc[ox] = nan_max(acc[ox], s[2 * ox]);
          else for (int64_t ox = 0; ox < g->ow; ox++) acc[ox] = nan_max(acc[ox], s[ox * g->sw]);
        } else {
          if (g->sw == 1) for (int64_t ox = 0; ox < g->ow; ox++) acc[ox] += s[ox];
          else for (int64_t ox = 0; ox < g->ow; ox++) acc[ox] += s[ox * g->sw];
        }
      }
    }
    float *yr = y + oy * g->ow;
    if (mx) { memcpy(yr, acc, (size_t)g->ow * sizeof(float)); continue; }
    const int64_t y0 = oy * g->sh - g->ph;
    int64_t ye = EX_MIN(y0 + g->kh, g->h + g->ph);
    const int64_t ph_ = ye - y0, ys = EX_MAX(y0, 0);
    ye = EX_MIN(ye, g->h);
    for (int64_t ox = 0; ox < g->ow; ox++) {
      const int64_t x0 = ox * g->sw - g->pw;
      int64_t xe = EX_MIN(x0 + g->kw, g->w + g->pw);
      const int64_t pw_ = xe - x0, xs = EX_MAX(x0, 0);
      xe = EX_MIN(xe, g->w);
      const int64_t cnt = g->kind == EX_POOL_AVG ? ph_ * pw_ : (ye - ys) * (xe - xs);
      yr[ox] = cnt > 0 ? acc[ox] / (float)cnt : 0.0f;
    }
  }
}

static void pool_task(void *vctx, int64_t q0, int64_t q1) {
  const pool_ctx *g = vctx;
  const int64_t PH = (g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1,
                PW = (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1;
  /* the padded plane must cover the input windows (ceil_mode can reach past the padding) */
  float *pad = g->dh == 1 || g->kind == EX_POOL_MAX ? malloc((size_t)(PH * PW + g->ow + 2 * PW + 2) * sizeof(float)) : NULL;
  if (pad) {
    for (int64_t q = q0; q < q1; q++)
      pool_plane_fast(g, g->x + q * g->h * g->w, g->y + q * g->oh * g->ow, pad, pad + PH * PW);
    free(pad);
    return;
  }
  for (int64_t q = q0; q < q1; q++) {
    const float *x = g->x + q * g->h * g->w;
    float *y = g->y + q * g->oh * g->ow;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ox = 0; ox < g->ow; ox++) {
        const int64_t y0 = oy * g->sh - g->ph, x0 = ox * g->sw - g->pw;
        float r;
        if (g->kind == EX_POOL_MAX) {
          r = -INFINITY;
          for (int64_t i = 0; i < g->kh; i++) {
            const int64_t iy = y0 + i * g->dh;
            if (iy < 0 || iy >= g->h) continue;
            for (int64_t j = 0; j < g->kw; j++) {
              const int64_t ix = x0 + j * g->dw;
              if (ix >= 0 && ix < g->w) r = nan_max(r, x[iy * g->w + ix]);
            }
          }
        } else {
          int64_t ye = EX_MIN(y0 + g->kh, g->h + g->ph), xe = EX_MIN(x0 + g->kw, g->w + g->pw);
          const int64_t pool = (ye - y0) * (xe - x0);
          const int64_t ys = EX_MAX(y0, 0), xs = EX_MAX(x0, 0);
          ye = EX_MIN(ye, g->h);
          xe = EX_MIN(xe, g->w);
          float s = 0.0f;
          for (int64_t iy = ys; iy < ye; iy++)
            for (int64_t ix = xs; ix < xe; ix++) s += x[iy * g->w + ix];
          const int64_t cnt = g->kind == EX_POOL_AVG ? pool : (ye - ys) * (xe - xs);
          r = cnt > 0 ? s / (float)cnt : 0.0f;
        }
        y[oy * g->ow + ox] = r;
      }
  }
}

static int pool2d(int32_t kind, const float *x, float *y, int64_t nc, int64_t h, int64_t w,
                  int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                  int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
  if (kind < EX_POOL_MAX || kind > EX_POOL_AVG_EXCL) return EX_EOPCODE;
  if (nc < 0 || h < 0 || w < 0 || oh < 0 || ow < 0 || kh < 1 || kw < 1 || sh < 1 || sw < 1 ||
      ph < 0 || pw < 0 || dh < 1 || dw < 1)
    return EX_EINVAL;
  if (nc * oh * ow == 0) return EX_OK;
  if (!x || !y) return EX_EINVAL;
  pool_ctx g = {kind, x, y, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw};
  ex_parallel_for(nc, EX_MAX(1, 16384 / EX_MAX(oh * ow * kh * kw, 1)), pool_task, &g);
  return EX_OK;
}

static void apool_task(void *vctx, int64_t q0, int64_t q1) {
  const pool_ctx *g = vctx;
  for (int64_t q = q0; q < q1; q++) {
    const float *x = g->x + q * g->h * g->w;
    float *y = g->y + q * g->oh * g->ow;
    for (int64_t oy = 0; oy < g->oh; oy++) {
      const int64_t ys = oy * g->h / g->oh, ye = ((oy + 1) * g->h + g->oh - 1) / g->oh;
      for (int64_t ox = 0; ox < g->ow; ox++) {
        const int64_t xs = ox * g->w / g->ow, xe = ((ox + 1) * g->w + g->ow - 1) / g->ow;
        float r = g->kind == EX_POOL_MAX ? -INFINITY : 0.0f;
        if (g->kind != EX_POOL_MAX && xe - xs == g->w) /* whole rows: one contiguous sum */
          r = sum_f32(x + ys * g->w, (ye - ys) * g->w);
        else
          for (int64_t iy = ys; iy < ye; iy++) {
            const float *row = x + iy * g->w;
            if (g->kind == EX_POOL_MAX)
              for (int64_t ix = xs; ix < xe; ix++) r = nan_max(r, row[ix]);
            else
              r += sum_f32(row + xs, xe - xs);
          }
        y[oy * g->ow + ox] = g->kind == EX_POOL_MAX ? r : r / (float)((ye - ys) * (xe - xs));
      }
    }
  }
}

static int adaptive_pool2d(int32_t kind, const float *x, float *y, int64_t nc, int64_t h,
                           int64_t w, int64_t oh, int64_t ow) {
  if (kind != EX_POOL_MAX && kind != EX_POOL_AVG) return EX_EOPCODE;
  if (nc < 0 || h < 1 || w < 1 || oh < 1 || ow < 1) return EX_EINVAL;
  if (nc == 0) return EX_OK;
  if (!x || !y) return EX_EINVAL;
  pool_ctx g = {.kind = kind, .x = x, .y = y, .h = h, .w = w, .oh = oh, .ow = ow};
  ex_parallel_for(nc, EX_MAX(1, 16384 / (h * w)), apool_task, &g);
  return EX_OK;
}

/* ---- resize ---- */
typedef struct {
  int32_t mode, align;
  const float *x;
  float *y;
  int64_t h, w, oh, ow;
  float sy, sx;
} rs_ctx;

static void rs_coord(int32_t mode, int32_t align, int64_t d, float scale, int64_t in, int64_t out,
                     int64_t *i0, int64_t *i1, float *f) {
  if (mode == EX_RESIZE_NEAREST) {
    int64_t s = (int64_t)floorf((float)d * scale);
    *i0 = *i1 = EX_MIN(s, in - 1);
    *f = 0.0f;
    return;
  }
  float s = align ? (out > 1 ? (float)d * (float)(in - 1) / (float)(out - 1) : 0.0f)
                  : ((float)d + 0.5f) * scale - 0.5f;
  if (s < 0.0f) s = 0.0f;
  int64_t a = (int64_t)s;
  if (a > in - 1) a = in - 1;
  *i0 = a;
  *i1 = a + (a < in - 1);
  *f = s - (float)a;
}

static void rs_task(void *vctx, int64_t q0, int64_t q1) {
  const rs_ctx *g = vctx;
  for (int64_t q = q0; q < q1; q++) {
    const float *x = g->x + q * g->h * g->w;
    float *y = g->y + q * g->oh * g->ow;
    for (int64_t oy = 0; oy < g->oh; oy++) {
      int64_t y0, y1;
      float fy;
      rs_coord(g->mode, g->align, oy, g->sy, g->h, g->oh, &y0, &y1, &fy);
      for (int64_t ox = 0; ox < g->ow; ox++) {
        int64_t x0, x1;
        float fx;
        rs_coord(g->mode, g->align, ox, g->sx, g->w, g->ow, &x0, &x1, &fx);
        if (g->mode == EX_RESIZE_NEAREST) {
          y[oy * g->ow + ox] = x[y0 * g->w + x0];
        } else {
          const float a = x[y0 * g->w + x0], b = x[y0 * g->w + x1], c = x[y1 * g->w + x0],
                      d = x[y1 * g->w + x1];
          y[oy * g->ow + ox] = (1.0f - fy) * ((1.0f - fx) * a + fx * b) + fy * ((1.0f - fx) * c + fx * d);
        }
      }
    }
  }
}

static int resize2d(int32_t mode, int32_t align_corners, const float *x, float *y, int64_t nc,
                    int64_t h, int64_t w, int64_t oh, int64_t ow, float scale_h, float scale_w) {
  if (mode != EX_RESIZE_NEAREST && mode != EX_RESIZE_BILINEAR) return EX_EOPCODE;
  if (nc < 0 || h < 1 || w < 1 || oh < 0 || ow < 0) return EX_EINVAL;
  if (nc * oh * ow == 0) return EX_OK;
  if (!x || !y) return EX_EINVAL;
  rs_ctx g = {mode, align_corners, x, y, h, w, oh, ow, scale_h, scale_w};
  ex_parallel_for(nc, EX_MAX(1, 16384 / (oh * ow)), rs_task, &g);
  return EX_OK;
}

/* ---- pad: the last three dims of [outer, d0, d1, d2] ---- */
typedef struct {
  int32_t es, mode;
  const char *x;
  char *y;
  const int64_t *in, *before, *after;
  const char *value;
  int64_t out[3];
} pad_ctx;

static int64_t pad_src(int32_t mode, int64_t i, int64_t n) {
  if (i >= 0 && i < n) return i;
  if (mode == EX_PAD_CONSTANT) return -1;
  if (mode == EX_PAD_REPLICATE) return i < 0 ? 0 : n - 1;
  if (n == 1) return 0;
  const int64_t period = 2 * (n - 1); /* reflect without repeating the edge */
  i %= period;
  if (i < 0) i += period;
  return i < n ? i : period - i;
}

static void pad_task(void *vctx, int64_t r0, int64_t r1) { /* rows over [outer, o0, o1] */
  const pad_ctx *g = vctx;
  const int64_t es = g->es, O2 = g->out[2];
  for (int64_t r = r0; r < r1; r++) {
    const int64_t i1 = r % g->out[1], i0 = r / g->out[1] % g->out[0], o = r / (g->out[1] * g->out[0]);
    char *dst = g->y + r * O2 * es;
    const int64_t s0 = pad_src(g->mode, i0 - g->before[0], g->in[0]),
                  s1 = pad_src(g->mode, i1 - g->before[1], g->in[1]);
    if (s0 < 0 || s1 < 0) {
      for (int64_t j = 0; j < O2; j++) memcpy(dst + j * es, g->value, (size_t)es);
      continue;
    }
    const char *src = g->x + ((o * g->in[0] + s0) * g->in[1] + s1) * g->in[2] * es;
    const int64_t b = g->before[2], n = g->in[2];
    for (int64_t j = 0; j < O2; j++) {
      const int64_t sj = j - b;
      if (sj >= 0 && sj < n) {
        const int64_t run = EX_MIN(n - sj, O2 - j);
        memcpy(dst + j * es, src + sj * es, (size_t)(run * es));
        j += run - 1;
        continue;
      }
      const int64_t s = pad_src(g->mode, sj, n);
      memcpy(dst + j * es, s < 0 ? g->value : src + s * es, (size_t)es);
    }
  }
}

static int pad(int32_t elem_size, int32_t mode, const void *x, void *y, int64_t outer,
               const int64_t *in_shape, const int64_t *before, const int64_t *after,
               const void *value) {
  if (mode < EX_PAD_CONSTANT || mode > EX_PAD_REPLICATE) return EX_EOPCODE;
  if (elem_size < 1 || elem_size > 8 || outer < 0 || !in_shape || !before || !after) return EX_EINVAL;
  pad_ctx g = {elem_size, mode, x, y, in_shape, before, after, value, {0, 0, 0}};
  for (int d = 0; d < 3; d++) {
    if (in_shape[d] < 0 || before[d] < 0 || after[d] < 0) return EX_EINVAL;
    if (mode == EX_PAD_REFLECT && (before[d] >= in_shape[d] || after[d] >= in_shape[d]) &&
        (before[d] || after[d]))
      return EX_EINVAL;
    if (mode != EX_PAD_CONSTANT && in_shape[d] == 0 && (before[d] || after[d])) return EX_EINVAL;
    g.out[d] = in_shape[d] + before[d] + after[d];
  }
  const int64_t rows = outer * g.out[0] * g.out[1];
  if (rows * g.out[2] == 0) return EX_OK;
  if (!x || !y || (mode == EX_PAD_CONSTANT && !value)) return EX_EINVAL;
  ex_parallel_for(rows, EX_MAX(1, 65536 / (g.out[2] * elem_size)), pad_task, &g);
  return EX_OK;
}
