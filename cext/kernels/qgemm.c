/* ex_qgemm: y = x @ dequant(W)^T (+ bias) with int8 or int4 group-quantized W (low-memory mode:
 * W stays packed and is expanded only in registers).
 *
 * Packed layout, interleaved by 8 rows (n8 = n rounded up to 8; padding rows are zero):
 *   for each group of 8 rows R and each run of 32 values b along k, one chunk of bytes:
 *     int8: 256 bytes, 8 steps t of [row r][j] = q[8R + r][32b + 4t + j]        (r < 8, j < 4)
 *     int4: 128 bytes, 4 steps t of [row r][j] = (q[..][32b + 4t + j] + 8)
 *                                             | (q[..][32b + 16 + 4t + j] + 8) << 4
 *   scales: float16 [n8 / 8][k / group][8]; w = q * scale.
 * A 256-bit load of one step holds 4 consecutive values of 8 rows, so a broadcast of 4 values of
 * x and one maddubs give 8 rows' partial dot products side by side (no horizontal sums).
 *
 * x is quantized to int8 per 32 values (scale max|x| / 127, the Q8_0 scheme), each 32-block is
 * an integer dot product, scaled by the weight and activation scales in float.  int4 keeps the
 * unsigned nibbles and subtracts 8 * sum(x) per block; its int16 partial sums cannot overflow
 * (8 steps * 2 * 15 * 127 < 32768).  Row groups are split over the pool; each task walks its rows
 * for up to QG_MR rows of x at a time, so a weight chunk is expanded once per QG_MR rows.
 *
 * Its own translation unit: the AVX2 code carries a target attribute and runs only when the
 * selected ISA is not generic (ex_isa), so EXPRESS_ISA=generic exercises the portable code. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../internal.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define QG_MR 4
#define QG_MIN(a, b) ((a) < (b) ? (a) : (b))

typedef struct {
  int32_t bits;
  int64_t m, n, k, group;
  const int8_t *xq;   /* m x k quantized activations */
  const float *xs;    /* m x k/32 their scales */
  const float *xc;    /* m x k/32: 8 * sum(xq) of the block (int4 offset correction) */
  const uint8_t *wq;
  const uint16_t *scales; /* float16 */
  const float *bias;
  float *y;
  int avx2;
} qg_ctx;

static void quantize_rows(const float *x, int64_t m, int64_t k, int8_t *xq, float *xs, float *xc) {
  for (int64_t i = 0; i < m * (k / 32); i++) {
    const float *v = x + i * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
    const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) {
      xq[i * 32 + j] = (int8_t)lrintf(v[j] * inv);
      sum += xq[i * 32 + j];
    }
    xs[i] = d;
    xc[i] = 8.0f * (float)sum;
  }
}

static inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
  float f;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e) {
    u = sign | ((e + 112) << 23) | (m << 13);
  } else {
    f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
    memcpy(&u, &f, 4);
    u |= sign;
  }
  memcpy(&f, &u, 4);
  return f;
}

static inline int64_t chunk_bytes(int bits) { return bits == 8 ? 256 : 128; }

/* rows [8 * g0, 8 * g1) x all m, portable */
static void rows_generic(const qg_ctx *c, int64_t g0, int64_t g1) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32, cb = chunk_bytes(c->bits);
  for (int64_t R = g0; R < g1; R++) {
    for (int64_t i = 0; i < c->m; i++) {
      float acc[8] = {0};
      const int8_t *xq = c->xq + i * c->k;
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *w = c->wq + (R * nb + b) * cb;
        const uint16_t *s = c->scales + (R * ng + b / per_g) * 8;
        for (int r = 0; r < 8; r++) {
          int32_t d = 0;
          if (c->bits == 8) {
            for (int t = 0; t < 8; t++)
              for (int j = 0; j < 4; j++) d += (int32_t)(int8_t)w[t * 32 + r * 4 + j] * xq[b * 32 + 4 * t + j];
          } else {
            for (int t = 0; t < 4; t++)
              for (int j = 0; j < 4; j++) {
                const uint8_t v = w[t * 32 + r * 4 + j];
                d += ((v & 15) - 8) * xq[b * 32 + 4 * t + j] + ((v >> 4) - 8) * xq[b * 32 + 16 + 4 * t + j];
              }
          }
          acc[r] += (float)d * c->xs[i * nb + b] * half_to_float(s[r]);
        }
      }
      for (int r = 0; r < 8; r++) {
        const int64_t row = R * 8 + r;
        if (row < c->n) c->y[i * c->n + row] = acc[r] + (c->bias ? c->bias[row] : 0.0f);
      }
    }
  }
}

#if defined(__x86_64__)
#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

AVX2_FN static inline __m256i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/* 8 rows of group R against MR rows of x starting at i0 */
/* y rows R*8 .. R*8+7 of the mr rows of x from i0: the 8 lanes of each accumulator, plus bias */
AVX2_FN static void store_rows(const qg_ctx *c, const __m256 *acc, int64_t R, int64_t i0, int mr) {
  for (int i = 0; i < mr; i++) {
    float out[8];
    _mm256_storeu_ps(out, acc[i]);
    for (int r = 0; r < 8; r++) {
      const int64_t row = R * 8 + r;
      if (row < c->n) c->y[(i0 + i) * c->n + row] = out[r] + (c->bias ? c->bias[row] : 0.0f);
    }
  }
}

AVX2_FN static void block_avx2_q4(const qg_ctx *c, int64_t R, int64_t i0, int mr) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32;
  const __m256i mask = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 acc[QG_MR];
  for (int i = 0; i < mr; i++) acc[i] = _mm256_setzero_ps();
  const uint8_t *w = c->wq + R * nb * 128;
  for (int64_t b = 0; b < nb; b++, w += 128) {
    _mm_prefetch((const char *)(w + 2048), _MM_HINT_T0);
    _mm_prefetch((const char *)(w + 2112), _MM_HINT_T0);
    const __m256i r0 = _mm256_loadu_si256((const __m256i *)w), r1 = _mm256_loadu_si256((const __m256i *)(w + 32)),
                  r2 = _mm256_loadu_si256((const __m256i *)(w + 64)), r3 = _mm256_loadu_si256((const __m256i *)(w + 96));
    const __m256i l0 = _mm256_and_si256(r0, mask), l1 = _mm256_and_si256(r1, mask),
                  l2 = _mm256_and_si256(r2, mask), l3 = _mm256_and_si256(r3, mask);
    const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), mask), h1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), mask),
                  h2 = _mm256_and_si256(_mm256_srli_epi16(r2, 4), mask), h3 = _mm256_and_si256(_mm256_srli_epi16(r3, 4), mask);
    const __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c->scales + (R * ng + b / per_g) * 8)));
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
      const int8_t *x = c->xq + (i0 + i) * c->k + b * 32;
      __m256i p = _mm256_maddubs_epi16(l0, bcast4(x));
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(l1, bcast4(x + 4)));
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(l2, bcast4(x + 8)));
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(l3, bcast4(x + 12)));
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(h0, bcast4(x + 16)));
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(h1, bcast4(x + 20)));
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(h2, bcast4(x + 24)));
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(h3, bcast4(x + 28)));
      const int64_t xb = (i0 + i) * nb + b;
      const __m256 d = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), _mm256_set1_ps(c->xc[xb]));
      acc[i] = _mm256_fmadd_ps(d, _mm256_mul_ps(sw, _mm256_set1_ps(c->xs[xb])), acc[i]);
    }
  }
  store_rows(c, acc, R, i0, mr);
}

AVX2_FN static void block_avx2_q8(const qg_ctx *c, int64_t R, int64_t i0, int mr) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[QG_MR];
  for (int i = 0; i < mr; i++) acc[i] = _mm256_setzero_ps();
  const uint8_t *w = c->wq + R * nb * 256;
  for (int64_t b = 0; b < nb; b++, w += 256) {
    __m256i wv[8], wa[8];
    for (int t = 0; t < 8; t++) {
      _mm_prefetch((const char *)(w + 1024 + t * 32), _MM_HINT_T0);
      wv[t] = _mm256_loadu_si256((const __m256i *)(w + t * 32));
      wa[t] = _mm256_sign_epi8(wv[t], wv[t]);
    }
    const __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c->scales + (R * ng + b / per_g) * 8)));
    for (int i = 0; i < mr; i++) {
      const int8_t *x = c->xq + (i0 + i) * c->k + b * 32;
      __m256i s = _mm256_setzero_si256();
      for (int t = 0; t < 8; t++)
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(wa[t], _mm256_sign_epi8(bcast4(x + 4 * t), wv[t])), ones));
      const int64_t xb = (i0 + i) * nb + b;
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sw, _mm256_set1_ps(c->xs[xb])), acc[i]);
    }
  }
  store_rows(c, acc, R, i0, mr);
}
#endif

static void task(void *ctx, int64_t g0, int64_t g1) {
  const qg_ctx *c = ctx;
#if defined(__x86_64__)
  if (c->avx2) {
    /* x rows in blocks of QG_MR (outer) so a task's weights stream once per block of x rows */
    for (int64_t i0 = 0; i0 < c->m; i0 += QG_MR) {
      const int mr = (int)QG_MIN(QG_MR, c->m - i0);
      for (int64_t R = g0; R < g1; R++) {
        if (c->bits == 4)
          block_avx2_q4(c, R, i0, mr);
        else
          block_avx2_q8(c, R, i0, mr);
      }
    }
    return;
  }
#endif
  rows_generic(c, g0, g1);
}

int ex_qgemm(int32_t bits, int64_t m, int64_t n, int64_t k, int64_t group, const float *x, const void *wq,
             const void *scales, const float *bias, float *y) {
  if ((bits != 4 && bits != 8) || m < 0 || n < 0 || k <= 0 || group <= 0 || group % 32 || k % group)
    return EX_EINVAL;
  if (m == 0 || n == 0) return EX_OK;
  int8_t *xq = malloc((size_t)(m * k));
  float *xs = malloc(sizeof(float) * (size_t)(2 * m * k / 32));
  if (!xq || !xs) {
    free(xq), free(xs);
    return EX_ENOMEM;
  }
  quantize_rows(x, m, k, xq, xs, xs + m * k / 32);
  qg_ctx c = {bits, m, n, k, group, xq, xs, xs + m * k / 32, wq, scales, bias, y, ex_isa() != EX_ISA_GENERIC};
  ex_parallel_for((n + 7) / 8, 4, task, &c);
  free(xq), free(xs);
  return EX_OK;
}
