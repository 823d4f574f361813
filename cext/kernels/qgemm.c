/* ex_qgemm: y = x @ dequant(W)^T (+ bias) with int8 or int4 group-quantized W (low-memory mode:
 * W stays packed; it is expanded only inside the kernel).
 *
 * Weight layout (row n of W, k values, groups of `group` values along k, group % 32 == 0):
 *   int8: int8 q[n][k]; int4: uint8 q[n][k / 2], each run of 32 values in 16 bytes, byte j holding
 *   value j in its low nibble and value j + 16 in its high nibble, stored as q + 8 (ggml's Q4_0
 *   order); scales float s[n][k / group]; w = q * s.
 *
 * Few rows (m < QG_SMALL_M, decode): x is quantized to int8 per 32 values (scale max|x| / 127) and
 * each 32-block is an integer dot product (AVX2: maddubs + madd), scaled by both scales, rows of
 * W split over the pool.  More rows (prefill): tiles of QG_NB rows of W are dequantized to float32
 * and multiplied by the f32 GEMM (ex_matmul), tiles split over the pool.
 *
 * Its own translation unit: the AVX2 functions carry a target attribute and run only when the
 * selected ISA is AVX2 (ex_isa), so EXPRESS_ISA=generic exercises the portable code. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../internal.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define QG_SMALL_M 8
#define QG_NB 64
#define EX_QG_MIN(a, b) ((a) < (b) ? (a) : (b))

typedef struct {
  int32_t bits;
  int64_t m, n, k, group;
  const float *x;
  const int8_t *xq;   /* m x k quantized activations (small-m path) */
  const float *xs;    /* m x k/32 their scales */
  const uint8_t *wq;
  const float *scales;
  const float *bias;
  float *y;
  int avx2;
  int err;
} qg_ctx;

static void quantize_rows(const float *x, int64_t m, int64_t k, int8_t *xq, float *xs) {
  for (int64_t i = 0; i < m * (k / 32); i++) {
    const float *v = x + i * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
    const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
    xs[i] = d;
    for (int j = 0; j < 32; j++) xq[i * 32 + j] = (int8_t)lrintf(v[j] * inv);
  }
}

/* weight row values of one 32-block as int8 in natural order */
static inline void unpack32(int bits, const uint8_t *w, int8_t *out) {
  if (bits == 8) {
    memcpy(out, w, 32);
  } else {
    for (int j = 0; j < 16; j++) {
      out[j] = (int8_t)((w[j] & 15) - 8);
      out[j + 16] = (int8_t)((w[j] >> 4) - 8);
    }
  }
}

static void small_rows_generic(qg_ctx *c, int64_t n0, int64_t n1) {
  const int64_t nb = c->k / 32, per_g = c->group / 32, rowb = c->bits == 8 ? c->k : c->k / 2;
  const int64_t bb = c->bits == 8 ? 32 : 16;
  int8_t wv[32];
  for (int64_t j = n0; j < n1; j++) {
    const uint8_t *w = c->wq + j * rowb;
    const float *s = c->scales + j * (c->k / c->group);
    for (int64_t i = 0; i < c->m; i++) {
      const int8_t *xq = c->xq + i * c->k;
      const float *xs = c->xs + i * nb;
      float acc = 0.0f;
      for (int64_t g = 0; g < nb / per_g; g++) {
        float gacc = 0.0f;
        for (int64_t b = g * per_g; b < (g + 1) * per_g; b++) {
          unpack32(c->bits, w + b * bb, wv);
          int32_t d = 0;
          for (int t = 0; t < 32; t++) d += (int32_t)wv[t] * xq[b * 32 + t];
          gacc += (float)d * xs[b];
        }
        acc += gacc * s[g];
      }
      c->y[i * c->n + j] = acc + (c->bias ? c->bias[j] : 0.0f);
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static inline __m256i load_w32(int bits, const uint8_t *w) {
  if (bits == 8) return _mm256_loadu_si256((const __m256i *)w);
  const __m128i raw = _mm_loadu_si128((const __m128i *)w);
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(15)), _mm256_set1_epi8(8));
}

__attribute__((target("avx2,fma"))) static inline __m256 dot32(__m256i w, __m256i x) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

__attribute__((target("avx2,fma"))) static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static void small_rows_avx2(qg_ctx *c, int64_t n0, int64_t n1) {
  const int64_t nb = c->k / 32, per_g = c->group / 32, rowb = c->bits == 8 ? c->k : c->k / 2;
  const int64_t bb = c->bits == 8 ? 32 : 16, ng = c->k / c->group;
  const int bits = c->bits;
  if (c->m == 1) {
    const int8_t *xq = c->xq;
    const float *xs = c->xs;
    int64_t j = n0;
    for (; j + 2 <= n1; j += 2) { /* two weight rows share each activation load */
      const uint8_t *w0 = c->wq + j * rowb, *w1 = w0 + rowb;
      const float *s0 = c->scales + j * ng, *s1 = s0 + ng;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0;
      for (int64_t g = 0, b = 0; g < ng; g++) {
        const __m256 sg0 = _mm256_set1_ps(s0[g]), sg1 = _mm256_set1_ps(s1[g]);
        for (int64_t e = b + per_g; b < e; b++) {
          const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + b * 32));
          const __m256 xsb = _mm256_set1_ps(xs[b]);
          _mm_prefetch((const char *)(w0 + (b + 8) * bb), _MM_HINT_T0);
          _mm_prefetch((const char *)(w1 + (b + 8) * bb), _MM_HINT_T0);
          a0 = _mm256_fmadd_ps(dot32(load_w32(bits, w0 + b * bb), xv), _mm256_mul_ps(xsb, sg0), a0);
          a1 = _mm256_fmadd_ps(dot32(load_w32(bits, w1 + b * bb), xv), _mm256_mul_ps(xsb, sg1), a1);
        }
      }
      c->y[j] = hsum(a0) + (c->bias ? c->bias[j] : 0.0f);
      c->y[j + 1] = hsum(a1) + (c->bias ? c->bias[j + 1] : 0.0f);
    }
    if (j < n1) {
      qg_ctx one = *c;
      small_rows_generic(&one, j, n1);
    }
    return;
  }
  __m256 acc[QG_SMALL_M];
  for (int64_t j = n0; j < n1; j++) {
    const uint8_t *w = c->wq + j * rowb;
    const float *s = c->scales + j * ng;
    for (int64_t i = 0; i < c->m; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0, b = 0; g < ng; g++) {
      const __m256 sg = _mm256_set1_ps(s[g]);
      for (int64_t e = b + per_g; b < e; b++) {
        const __m256i wv = load_w32(bits, w + b * bb);
        for (int64_t i = 0; i < c->m; i++) {
          const __m256i xv = _mm256_loadu_si256((const __m256i *)(c->xq + i * c->k + b * 32));
          acc[i] = _mm256_fmadd_ps(dot32(wv, xv), _mm256_mul_ps(_mm256_set1_ps(c->xs[i * nb + b]), sg), acc[i]);
        }
      }
    }
    for (int64_t i = 0; i < c->m; i++) c->y[i * c->n + j] = hsum(acc[i]) + (c->bias ? c->bias[j] : 0.0f);
  }
}

__attribute__((target("avx2,fma"))) static void dequant_tile_avx2(int bits, const uint8_t *w, const float *s,
                                                                   int64_t k, int64_t group, float *out) {
  const int64_t bb = bits == 8 ? 32 : 16;
  for (int64_t b = 0; b < k / 32; b++) {
    const __m256 sc = _mm256_set1_ps(s[b * 32 / group]);
    const __m256i v = load_w32(bits, w + b * bb);
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    _mm256_storeu_ps(out + b * 32, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), sc));
    _mm256_storeu_ps(out + b * 32 + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), sc));
    _mm256_storeu_ps(out + b * 32 + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), sc));
    _mm256_storeu_ps(out + b * 32 + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), sc));
  }
}
#endif

static void dequant_tile(qg_ctx *c, int64_t j, float *out) {
  const int64_t rowb = c->bits == 8 ? c->k : c->k / 2, bb = c->bits == 8 ? 32 : 16;
  const uint8_t *w = c->wq + j * rowb;
  const float *s = c->scales + j * (c->k / c->group);
#if defined(__x86_64__)
  if (c->avx2) {
    dequant_tile_avx2(c->bits, w, s, c->k, c->group, out);
    return;
  }
#endif
  int8_t wv[32];
  for (int64_t b = 0; b < c->k / 32; b++) {
    unpack32(c->bits, w + b * bb, wv);
    const float sc = s[b * 32 / c->group];
    for (int t = 0; t < 32; t++) out[b * 32 + t] = (float)wv[t] * sc;
  }
}

static void small_task(void *ctx, int64_t b, int64_t e) {
  qg_ctx *c = ctx;
  b *= 4, e = EX_QG_MIN(e * 4, c->n);
#if defined(__x86_64__)
  if (c->avx2) {
    small_rows_avx2(c, b, e);
    return;
  }
#endif
  small_rows_generic(c, b, e);
}

static void tile_task(void *ctx, int64_t t0, int64_t t1) {
  qg_ctx *c = ctx;
  float *wt = malloc(sizeof(float) * QG_NB * c->k), *yt = malloc(sizeof(float) * QG_NB * c->m);
  if (!wt || !yt) {
    c->err = EX_ENOMEM;
    free(wt), free(yt);
    return;
  }
  const int64_t one = 1, zero = 0;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t j0 = t * QG_NB, nb = EX_QG_MIN(QG_NB, c->n - j0);
    for (int64_t j = 0; j < nb; j++) dequant_tile(c, j0 + j, wt + j * c->k);
    /* yt[m, nb] = x[m, k] @ wt^T  (wt is nb x k: element (p, j) at j * k + p) */
    int rc = ex_matmul(EX_F32, c->x, c->k, 1, wt, 1, c->k, yt, c->m, nb, c->k, 0, &one, &zero, &zero);
    if (rc) {
      c->err = rc;
      break;
    }
    for (int64_t i = 0; i < c->m; i++)
      for (int64_t j = 0; j < nb; j++) c->y[i * c->n + j0 + j] = yt[i * nb + j] + (c->bias ? c->bias[j0 + j] : 0.0f);
  }
  free(wt), free(yt);
}

int ex_qgemm(int32_t bits, int64_t m, int64_t n, int64_t k, int64_t group, const float *x, const void *wq,
             const float *scales, const float *bias, float *y) {
  if ((bits != 4 && bits != 8) || m < 0 || n < 0 || k <= 0 || group <= 0 || group % 32 || k % group)
    return EX_EINVAL;
  if (m == 0 || n == 0) return EX_OK;
  qg_ctx c = {bits, m, n, k, group, x, NULL, NULL, wq, scales, bias, y, ex_isa() != EX_ISA_GENERIC, 0};
  if (m < QG_SMALL_M) {
    int8_t *xq = malloc((size_t)(m * k));
    float *xs = malloc(sizeof(float) * (size_t)(m * k / 32));
    if (!xq || !xs) {
      free(xq), free(xs);
      return EX_ENOMEM;
    }
    quantize_rows(x, m, k, xq, xs);
    c.xq = xq, c.xs = xs;
    ex_parallel_for((n + 3) / 4, 16, small_task, &c); /* units of 4 rows keep row pairs together */
    free(xq), free(xs);
    return EX_OK;
  }
  ex_parallel_for((n + QG_NB - 1) / QG_NB, 1, tile_task, &c);
  return c.err;
}
