/* ex_qgemm: y = x @ dequant(W)^T (+ bias) (+ res) with int8 or int4 group-quantized W (low-memory mode:
 * W stays packed and is expanded only in registers).
 *
 * Packed layout, interleaved by 16 rows (n16 = n rounded up to 16; padding rows are zero):
 *   for each group of 16 rows R and each run of 32 values b along k, one chunk of bytes:
 *     int8: 512 bytes, 8 steps t of [row r][j] = q[16R + r][32b + 4t + j]       (r < 16, j < 4)
 *     int4: 256 bytes, 4 steps t of [row r][j] = (q[..][32b + 4t + j] + 8)
 *                                             | (q[..][32b + 16 + 4t + j] + 8) << 4
 *   scales: float16 [n16 / 16][k / group][16]; w = q * scale.
 * A 512-bit load of one step holds 4 consecutive values of 16 rows, so one vpdpbusd against 4
 * values of x broadcast gives 16 rows' partial dot products side by side (no horizontal sums, no
 * shuffles of x); AVX2 takes each step's two 256-bit halves (rows 0-7, 8-15) as two 8-row groups.
 * (The layout was 8 rows until the one-row GEMV, arithmetic-bound on a Zen 4 core, needed x as a
 * plain broadcast: 16 rows run it 1.7x faster with the weights in cache.)
 *
 * x is quantized to int8 per 32 values (scale max|x| / 127, the Q8_0 scheme), each 32-block is
 * an integer dot product, scaled by the weight and activation scales in float.  int4 keeps the
 * unsigned nibbles and subtracts 8 * sum(x) per block; its int16 partial sums cannot overflow
 * (8 steps * 2 * 15 * 127 < 32768).  Row groups are split over the pool; each task walks its row
 * groups and, for each, all rows of x QG_MR at a time (a chunk is expanded once per QG_MR rows,
 * and the group's weights stay in L1 while x passes over them).
 *
 * AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes: int4 nibbles are already unsigned;
 * int8 weights are made unsigned by flipping their sign bit (q + 128), and both subtract the
 * offset times sum(x) by starting the block's int32 sum at -offset * sum(x).  Each task walks row
 * groups and, for each, all rows of x QG_MR512 at a time, so the group's weights (k / 2 bytes per
 * row for int4) stay in L1 while every row of x passes over them.
 *
 * Its own translation unit: the SIMD code carries target attributes and runs only when the
 * selected ISA allows it (ex_isa: AVX2 for "avx2", VNNI for "avx512" when the CPU has
 * avx512vnni), so EXPRESS_ISA=generic / avx2 exercise the portable and AVX2 code. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../internal.h"
#include "half.h"
#include "simd_avx2.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define QG_ROWS 16 /* rows a packed group interleaves */
#define QG_MR 4
#define QG_MR512 8
/* software prefetch distances (bytes) for streaming weights: a hardware prefetcher alone leaves a
 * single core well short of the DRAM bandwidth (measured on a Zen 5 core; the AVX2 blocks of
 * m > 1 prefetch QG_PF ahead into L1).  The VNNI one-row GEMV prefetches each stream QG_PF_VNNI
 * ahead into L2 only: on the Intel Xeon host of docs/benchmarks.rst an int4 Qwen2.5-0.5B step's
 * products took 18.7 - 19.1 ms at one thread without, 17.1 - 17.4 with 1 or 4 KB ahead, and 9.1 -
 * 9.5 -> 8.2 - 8.6 at two (2 KB about the same, 512 B or into L1 less); int8 36.2 - 37.1 -> 34.5 -
 * 34.9 and 18.7 - 19.3 -> 18.3 - 18.6 (on a Zen 4 core the same loop had been faster without).
 * The AVX2 one-row GEMV prefetches nothing.  It used to prefetch 512 B ahead into L1 and 4 KB into
 * L2, which a Zen 4 core forced to AVX2 had liked a little (a decode step 12.5 - 15.1 ms against
 * 14.0 - 15.8); on the 2-core Zen 3 (EPYC) machine of docs/benchmarks.rst, the one the engine is
 * built for, the benchmark's decode loop ran without them at 30.4 - 35.1 tok/s against 25.1 - 30.5
 * (int4, one thread), 40.7 - 49.7 against 37.4 - 43.8 (two), and int8 18.6 - 22.7 against 14.5 -
 * 15.9 and 37.4 - 39.5 against 24.8 - 28.2 (alternating processes, 4 - 6 each). */
#define QG_PF 8192
#define QG_PF_VNNI 1024
/* bytes of each stream the idle worker prefetches before a one-row product (ex_prefetch_async):
 * a Qwen2.5-0.5B decode step at two threads, 32 streams, 11.5 -> 11.2 ms (int4) and 20.6 -> 20.2
 * (int8), medians of 4 alternating runs each; 4 and 16 KB about the same as 8 */
#define QG_PF_IDLE 8192

#define QG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define QG_MAX(a, b) ((a) > (b) ? (a) : (b))
#define QG_MULTI_MAX 8 /* weights one ex_qgemm_multi call takes */
#define QG_ITEM1 4      /* row groups a parallel_for item at m = 1 */

/* bits, k and group a packed weight can have */
static inline int qg_shape_ok(int32_t bits, int64_t k, int64_t group) {
  return (bits == 4 || bits == 8) && k > 0 && group > 0 && group % 32 == 0 && k % group == 0;
}

typedef struct {
  int32_t bits;
  int64_t m, n, k, group;
  const int8_t *xq;   /* m x k quantized activations */
  const float *xs;    /* m x k/32 their scales */
  const int32_t *xc;  /* m x k/32: offset * sum(xq) of the block (8 for int4, 128 for int8) */
  const uint8_t *wq;
  const uint16_t *scales; /* float16 */
  const float *bias;
  const float *res;   /* NULL, or m x n added to y (a residual), row stride n */
  float *y;           /* m x n, rows ldy apart (a column block of a wider y: ex_qgemm_multi) */
  int64_t ldy;
  int path;           /* QG_GENERIC, QG_AVX2 or QG_VNNI */
} qg_ctx;

enum { QG_GENERIC, QG_AVX2, QG_VNNI };

/* nblk blocks of 32: int8 codes, scales, offset * sum of the codes */
static void quantize_rows(const float *x, int64_t nblk, int32_t offset, int8_t *xq, float *xs, int32_t *xc) {
  for (int64_t i = 0; i < nblk; i++) {
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
    xc[i] = offset * sum;
  }
}

static inline int64_t chunk_bytes(int bits) { return bits == 8 ? 512 : 256; }

/* rows [16 * g0, 16 * g1) x all m, portable */
static void rows_generic(const qg_ctx *c, int64_t g0, int64_t g1) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32, cb = chunk_bytes(c->bits);
  for (int64_t R = g0; R < g1; R++) {
    for (int64_t i = 0; i < c->m; i++) {
      float acc[QG_ROWS] = {0};
      const int8_t *xq = c->xq + i * c->k;
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *w = c->wq + (R * nb + b) * cb;
        const uint16_t *s = c->scales + (R * ng + b / per_g) * QG_ROWS;
        for (int r = 0; r < QG_ROWS; r++) {
          int32_t d = 0;
          if (c->bits == 8) {
            for (int t = 0; t < 8; t++)
              for (int j = 0; j < 4; j++) d += (int32_t)(int8_t)w[t * 64 + r * 4 + j] * xq[b * 32 + 4 * t + j];
          } else {
            for (int t = 0; t < 4; t++)
              for (int j = 0; j < 4; j++) {
                const uint8_t v = w[t * 64 + r * 4 + j];
                d += ((v & 15) - 8) * xq[b * 32 + 4 * t + j] + ((v >> 4) - 8) * xq[b * 32 + 16 + 4 * t + j];
              }
          }
          acc[r] += (float)d * c->xs[i * nb + b] * half_to_f32(s[r]);
        }
      }
      for (int r = 0; r < QG_ROWS; r++) {
        const int64_t row = R * QG_ROWS + r;
        if (row < c->n)
          c->y[i * c->ldy + row] = acc[r] + (c->bias ? c->bias[row] : 0.0f) + (c->res ? c->res[i * c->n + row] : 0.0f);
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

/* y columns 8H .. 8H + 7 of the mr rows of x from i0: the 8 lanes of each accumulator, plus bias
 * and residual (the same sums in the same order whole or lane by lane; a lane at a time only for
 * the last, partial 8 rows: a decode step stores some 57 000 of these, and the scalar loop for all
 * of them took 6% of it) */
AVX2_FN static void store_rows(const qg_ctx *c, const __m256 *acc, int64_t H, int64_t i0, int mr) {
  if (H * 8 + 8 <= c->n) {
    const __m256 bias = c->bias ? _mm256_loadu_ps(c->bias + H * 8) : _mm256_setzero_ps();
    for (int i = 0; i < mr; i++) {
      __m256 y = _mm256_add_ps(acc[i], bias);
      if (c->res) y = _mm256_add_ps(y, _mm256_loadu_ps(c->res + (i0 + i) * c->n + H * 8));
      _mm256_storeu_ps(c->y + (i0 + i) * c->ldy + H * 8, y);
    }
    return;
  }
  for (int i = 0; i < mr; i++) {
    float out[8];
    _mm256_storeu_ps(out, acc[i]);
    for (int r = 0; r < 8; r++) {
      const int64_t row = H * 8 + r;
      if (row < c->n)
        c->y[(i0 + i) * c->ldy + row] =
            out[r] + (c->bias ? c->bias[row] : 0.0f) + (c->res ? c->res[(i0 + i) * c->n + row] : 0.0f);
    }
  }
}

/* quantize_rows with the same rounding (cvtps rounds to nearest even, as lrintf; max_ps with the
 * running maximum second skips a NaN, as fmaxf does) */
AVX2_FN static void quantize_rows_avx2(const float *x, int64_t nblk, int32_t offset, int8_t *xq, float *xs,
                                       int32_t *xc) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < nblk; i++) {
    __m256 v[4], m = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
      v[j] = _mm256_loadu_ps(x + i * 32 + 8 * j);
      m = _mm256_max_ps(_mm256_and_ps(v[j], absmask), m);
    }
    const float d = ex_hmax8(m) / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(inv)));
    ex_pack32_i8(xq + i * 32, q[0], q[1], q[2], q[3]);
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    xs[i] = d;
    xc[i] = offset * _mm_cvtsi128_si32(t);
  }
}

/* the 8-row half H of the packed groups (rows 8H .. 8H + 7 are half H & 1 of each 64-byte step of
 * group H / 2) against mr rows of x from i0 (mr is a constant at each call from rows_avx2, so its
 * accumulators stay in registers) */
AVX2_FN __attribute__((always_inline)) static inline void q4_avx2(const qg_ctx *c, int64_t H, int64_t i0,
                                                                    const int mr) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32;
  const __m256i mask = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 acc[QG_MR];
  for (int i = 0; i < QG_MR; i++) acc[i] = _mm256_setzero_ps();
  const uint8_t *wg = c->wq + (H / 2) * nb * 256;
  const uint16_t *sc = c->scales + (H / 2) * ng * QG_ROWS;
  for (int64_t b = 0; b < nb; b++, wg += 256) {
    for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)(wg + QG_PF + l), _MM_HINT_T0);
    const uint8_t *w = wg + (H & 1) * 32;
    const __m256i r0 = _mm256_loadu_si256((const __m256i *)w), r1 = _mm256_loadu_si256((const __m256i *)(w + 64)),
                  r2 = _mm256_loadu_si256((const __m256i *)(w + 128)), r3 = _mm256_loadu_si256((const __m256i *)(w + 192));
    const __m256i l0 = _mm256_and_si256(r0, mask), l1 = _mm256_and_si256(r1, mask),
                  l2 = _mm256_and_si256(r2, mask), l3 = _mm256_and_si256(r3, mask);
    const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), mask),
                  h1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), mask),
                  h2 = _mm256_and_si256(_mm256_srli_epi16(r2, 4), mask),
                  h3 = _mm256_and_si256(_mm256_srli_epi16(r3, 4), mask);
    const __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + (b / per_g) * QG_ROWS + (H & 1) * 8)));
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
      const __m256 d = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_madd_epi16(p, ones), _mm256_set1_epi32(c->xc[xb])));
      acc[i] = _mm256_fmadd_ps(d, _mm256_mul_ps(sw, _mm256_set1_ps(c->xs[xb])), acc[i]);
    }
  }
  store_rows(c, acc, H, i0, mr);
}

AVX2_FN __attribute__((always_inline)) static inline void q8_avx2(const qg_ctx *c, int64_t H, int64_t i0,
                                                                    const int mr) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[QG_MR];
  for (int i = 0; i < QG_MR; i++) acc[i] = _mm256_setzero_ps();
  const uint8_t *wg = c->wq + (H / 2) * nb * 512;
  const uint16_t *sc = c->scales + (H / 2) * ng * QG_ROWS;
  for (int64_t b = 0; b < nb; b++, wg += 512) {
    for (int l = 0; l < 512; l += 64) _mm_prefetch((const char *)(wg + QG_PF + l), _MM_HINT_T0);
    const uint8_t *w = wg + (H & 1) * 32;
    __m256i wv[8], wa[8];
    for (int t = 0; t < 8; t++) {
      wv[t] = _mm256_loadu_si256((const __m256i *)(w + t * 64));
      wa[t] = _mm256_sign_epi8(wv[t], wv[t]);
    }
    const __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + (b / per_g) * QG_ROWS + (H & 1) * 8)));
    for (int i = 0; i < mr; i++) {
      const int8_t *x = c->xq + (i0 + i) * c->k + b * 32;
      __m256i s = _mm256_setzero_si256();
      for (int t = 0; t < 8; t++)
        s = _mm256_add_epi32(
            s, _mm256_madd_epi16(_mm256_maddubs_epi16(wa[t], _mm256_sign_epi8(bcast4(x + 4 * t), wv[t])), ones));
      const int64_t xb = (i0 + i) * nb + b;
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sw, _mm256_set1_ps(c->xs[xb])), acc[i]);
    }
  }
  store_rows(c, acc, H, i0, mr);
}

/* q4_avx2 / q8_avx2 with mr a constant in each call, so that their accumulators stay in registers */
AVX2_FN static void rows_avx2(const qg_ctx *c, int64_t H, int64_t i0, int mr) {
#define QG_ROWS_CASE(MR) \
  case MR: c->bits == 4 ? q4_avx2(c, H, i0, MR) : q8_avx2(c, H, i0, MR); break;
  switch (mr) {
    QG_ROWS_CASE(1)
    QG_ROWS_CASE(2)
    QG_ROWS_CASE(3)
    default: c->bits == 4 ? q4_avx2(c, H, i0, QG_MR) : q8_avx2(c, H, i0, QG_MR); break;
  }
#undef QG_ROWS_CASE
}

/* the 8 rows' dot products (int32, offset not included) of one 32-value block, rows 8h .. 8h + 7 of
 * a packed group: w points at the block's chunk plus 32h */
AVX2_FN __attribute__((always_inline)) static inline __m256i block_dot_avx2(const uint8_t *w, const int8_t *x,
                                                                           const int BITS) {
  const __m256i ones = _mm256_set1_epi16(1);
  if (BITS == 4) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i r0 = _mm256_loadu_si256((const __m256i *)w), r1 = _mm256_loadu_si256((const __m256i *)(w + 64)),
                  r2 = _mm256_loadu_si256((const __m256i *)(w + 128)), r3 = _mm256_loadu_si256((const __m256i *)(w + 192));
    __m256i p = _mm256_maddubs_epi16(_mm256_and_si256(r0, m4), bcast4(x));
    __m256i q = _mm256_maddubs_epi16(_mm256_and_si256(r1, m4), bcast4(x + 4));
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_and_si256(r2, m4), bcast4(x + 8)));
    q = _mm256_add_epi16(q, _mm256_maddubs_epi16(_mm256_and_si256(r3, m4), bcast4(x + 12)));
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r0, 4), m4), bcast4(x + 16)));
    q = _mm256_add_epi16(q, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r1, 4), m4), bcast4(x + 20)));
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r2, 4), m4), bcast4(x + 24)));
    q = _mm256_add_epi16(q, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r3, 4), m4), bcast4(x + 28)));
    return _mm256_madd_epi16(_mm256_add_epi16(p, q), ones);
  }
  __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
  for (int t = 0; t < 8; t += 2) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)(w + 64 * t)),
                  b = _mm256_loadu_si256((const __m256i *)(w + 64 * t + 64));
    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(a, a),
                                                                     _mm256_sign_epi8(bcast4(x + 4 * t), a)), ones));
    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(b, b),
                                                                     _mm256_sign_epi8(bcast4(x + 4 * t + 4), b)), ones));
  }
  return _mm256_add_epi32(s0, s1);
}

/* m = 1, AVX2: S streams side by side, as gemv_streams (VNNI) below, both 8-row halves of a group
 * per block (each cache line read once).  On the Intel host of docs/benchmarks.rst with
 * EXPRESS_ISA=avx2, a Qwen2.5-0.5B decode step's GEMVs took 22.5 - 23.1 ms (int4) and 39.8 -
 * 40.3 ms (int8) at one thread as one stream of groups, 17.4 - 18.3 and 34.4 - 34.7 as four;
 * 12.1 -> 9.8 - 10.4 ms (int4) at two threads. */
AVX2_FN __attribute__((always_inline)) static inline void gemv_streams_avx2(const qg_ctx *c, const int BITS,
                                                                           const int64_t *start, int64_t count,
                                                                           const int S) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32, cb = BITS == 8 ? 512 : 256;
  for (int64_t i = 0; i < count; i++) {
    const uint8_t *w[EX_PARTS];
    const uint16_t *s[EX_PARTS];
    __m256 acc[EX_PARTS][2];
    for (int q = 0; q < S; q++) {
      const int64_t R = start[q] + i;
      w[q] = c->wq + R * nb * cb;
      s[q] = c->scales + R * ng * QG_ROWS;
      acc[q][0] = acc[q][1] = _mm256_setzero_ps();
    }
    for (int64_t b = 0, j = 0; b < nb; b++) {
      const int8_t *x = c->xq + b * 32;
      const __m256 xs = _mm256_set1_ps(c->xs[b]);
      const __m256i xc = BITS == 4 ? _mm256_set1_epi32(c->xc[b]) : _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int q = 0; q < S; q++) {
        for (int h = 0; h < 2; h++) {
          const __m256 sw = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s[q] + 8 * h))), xs);
          const __m256i d = _mm256_sub_epi32(block_dot_avx2(w[q] + 32 * h, x, BITS), xc);
          acc[q][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sw, acc[q][h]);
        }
        w[q] += cb;
      }
      if (++j == per_g) {
        j = 0;
        for (int q = 0; q < S; q++) s[q] += QG_ROWS;
      }
    }
    for (int q = 0; q < S; q++)
      for (int h = 0; h < 2; h++) store_rows(c, &acc[q][h], 2 * (start[q] + i) + h, 0, 1);
  }
}

/* row groups [g0, g1), m = 1, as EX_WALK_PARTS' streams (their rest walked one group at a time
 * was read alone: with a 7-group share, 3 of 7 groups of the 896-row projections) */
AVX2_FN static void gemv_avx2(const qg_ctx *c, int64_t g0, int64_t g1) {
  if (c->bits == 4)
    EX_WALK_PARTS(g0, g1, gemv_streams_avx2, c, 4);
  else
    EX_WALK_PARTS(g0, g1, gemv_streams_avx2, c, 8);
}

#define VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* the same rounding as quantize_rows (cvtps rounds to nearest even, as lrintf) */
VNNI_FN static void quantize_rows_avx512(const float *x, int64_t nblk, int32_t offset, int8_t *xq, float *xs,
                                         int32_t *xc) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < nblk; i++) {
    const __m512 a = _mm512_loadu_ps(x + i * 32), b = _mm512_loadu_ps(x + i * 32 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(a, absmask), _mm512_and_ps(b, absmask)));
    const float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    _mm_storeu_si128((__m128i *)(xq + i * 32), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(xq + i * 32 + 16), _mm512_cvtsepi32_epi8(qb));
    xs[i] = d;
    xc[i] = offset * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  }
}

/* 4 values of x from p in every 32-bit lane */
VNNI_FN static inline __m512i bcast4_512(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

/* y columns 16R .. 16R + 15 for MR rows of x from i0.  BITS and MR are constants at every call,
 * so the accumulators live in registers. */
VNNI_FN __attribute__((always_inline)) static inline void group_vnni(const qg_ctx *c, int64_t R, int64_t i0,
                                                                     const int BITS, const int MR) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32, cb = BITS == 8 ? 512 : 256;
  const uint8_t *wp = c->wq + R * nb * cb;
  const uint16_t *s = c->scales + R * ng * QG_ROWS;
  const __m512i m4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[MR];
  for (int i = 0; i < MR; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++, wp += cb) {
    __m512i w[8]; /* w[t] pairs with x values 4t .. 4t + 3 of the block */
    if (BITS == 4) {
      for (int t = 0; t < 4; t++) {
        const __m512i r = _mm512_loadu_si512(wp + 64 * t);
        w[t] = _mm512_and_si512(r, m4);
        w[4 + t] = _mm512_and_si512(_mm512_srli_epi16(r, 4), m4);
      }
    } else {
      for (int t = 0; t < 8; t++) w[t] = _mm512_xor_si512(_mm512_loadu_si512(wp + 64 * t), flip);
    }
    const __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + (b / per_g) * QG_ROWS)));
    for (int i = 0; i < MR; i++) {
      const int8_t *x = c->xq + (i0 + i) * c->k + b * 32;
      const int64_t xb = (i0 + i) * nb + b;
      __m512i d = _mm512_set1_epi32(-c->xc[xb]);
      for (int t = 0; t < 8; t++) d = _mm512_dpbusd_epi32(d, w[t], bcast4_512(x + 4 * t));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sw, _mm512_set1_ps(c->xs[xb])), acc[i]);
    }
  }
  const __mmask16 mask = (__mmask16)((1u << QG_MIN(c->n - R * QG_ROWS, QG_ROWS)) - 1);
  const __m512 bias = c->bias ? _mm512_maskz_loadu_ps(mask, c->bias + R * QG_ROWS) : _mm512_setzero_ps();
  for (int i = 0; i < MR; i++) {
    __m512 y = _mm512_add_ps(acc[i], bias);
    if (c->res) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, c->res + (i0 + i) * c->n + R * QG_ROWS));
    _mm512_mask_storeu_ps(c->y + (i0 + i) * c->ldy + R * QG_ROWS, mask, y);
  }
}

#define QG_GROUP_CASES(BITS)                                           \
  switch (mr) {                                                        \
    case 1: group_vnni(c, R, i0, BITS, 1); break;                      \
    case 2: group_vnni(c, R, i0, BITS, 2); break;                      \
    case 3: group_vnni(c, R, i0, BITS, 3); break;                      \
    case 4: group_vnni(c, R, i0, BITS, 4); break;                      \
    case 5: group_vnni(c, R, i0, BITS, 5); break;                      \
    case 6: group_vnni(c, R, i0, BITS, 6); break;                      \
    case 7: group_vnni(c, R, i0, BITS, 7); break;                      \
    default: group_vnni(c, R, i0, BITS, QG_MR512); break;              \
  }

/* row groups [g0, g1), every row of x */
VNNI_FN static void groups_vnni(const qg_ctx *c, int64_t g0, int64_t g1) {
  for (int64_t R = g0; R < g1; R++) {
    for (int64_t i0 = 0; i0 < c->m; i0 += QG_MR512) {
      const int mr = (int)QG_MIN(QG_MR512, c->m - i0);
      if (c->bits == 4) {
        QG_GROUP_CASES(4)
      } else {
        QG_GROUP_CASES(8)
      }
    }
  }
}

/* the 16 rows' dot products (int32, offset included) of one packed 32-value block at w with the
 * block of x at x: 8 vpdpbusd on two chains */
VNNI_FN __attribute__((always_inline)) static inline __m512i block_dot_vnni(const uint8_t *w, const int8_t *x, int32_t xc,
                                                                             const int BITS) {
  __m512i d0 = _mm512_set1_epi32(-xc), d1 = _mm512_setzero_si512();
  if (BITS == 4) {
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i r0 = _mm512_loadu_si512(w), r1 = _mm512_loadu_si512(w + 64), r2 = _mm512_loadu_si512(w + 128),
                  r3 = _mm512_loadu_si512(w + 192);
    d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(r0, m4), bcast4_512(x + 0));
    d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(r1, m4), bcast4_512(x + 4));
    d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(r2, m4), bcast4_512(x + 8));
    d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(r3, m4), bcast4_512(x + 12));
    d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(_mm512_srli_epi16(r0, 4), m4), bcast4_512(x + 16));
    d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(_mm512_srli_epi16(r1, 4), m4), bcast4_512(x + 20));
    d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(_mm512_srli_epi16(r2, 4), m4), bcast4_512(x + 24));
    d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(_mm512_srli_epi16(r3, 4), m4), bcast4_512(x + 28));
  } else {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int t = 0; t < 8; t += 2) {
      d0 = _mm512_dpbusd_epi32(d0, _mm512_xor_si512(_mm512_loadu_si512(w + 64 * t), flip), bcast4_512(x + 4 * t));
      d1 = _mm512_dpbusd_epi32(d1, _mm512_xor_si512(_mm512_loadu_si512(w + 64 * t + 64), flip), bcast4_512(x + 4 * t + 4));
    }
  }
  return _mm512_add_epi32(d0, d1);
}

/* m = 1: S streams side by side, stream q walking the row groups start[q] + i (i < count), each
 * a run of 64-byte steps (4 values of 16 rows) prefetched QG_PF_VNNI ahead (see QG_PF), against 4
 * values of x broadcast from memory.  One stream leaves a core short of the memory's rate: on
 * the Intel Xeon host of docs/benchmarks.rst, a Qwen2.5-0.5B int4 decode step's GEMVs took 20.6 ms
 * at one thread as one stream (a stream prefetched 16 KB ahead into L2 and 1 KB into L1), 17.2 -
 * 18.1 as four, 17.1 - 18.0 as two (the same within the noise), 18.4 - 19.6 as six, 20.1 - 20.6 as
 * eight; 1, 2 and 4 KB ahead into L1 within the noise of each other.  int8 gained more: 12 -> 15.6
 * GB/s of weights at one thread, 74 -> 96% of a plain read.  (On a Zen 5 core with the former
 * 8-row layout, 4 and 8 streams were slower than one.) */
VNNI_FN __attribute__((always_inline)) static inline void gemv_streams(const qg_ctx *c, const int BITS,
                                                                       const int64_t *start, int64_t count,
                                                                       const int S) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32, cb = BITS == 8 ? 512 : 256;
  for (int64_t i = 0; i < count; i++) {
    const uint8_t *w[EX_PARTS];
    const uint16_t *s[EX_PARTS];
    __m512 acc[EX_PARTS];
    for (int q = 0; q < S; q++) {
      const int64_t R = start[q] + i;
      w[q] = c->wq + R * nb * cb;
      s[q] = c->scales + R * ng * QG_ROWS;
      acc[q] = _mm512_setzero_ps();
    }
    for (int64_t b = 0, j = 0; b < nb; b++) {
      const int8_t *x = c->xq + b * 32;
      const __m512 xs = _mm512_set1_ps(c->xs[b]);
      for (int q = 0; q < S; q++) {
        for (int l = 0; l < cb; l += 64) _mm_prefetch((const char *)w[q] + QG_PF_VNNI + l, _MM_HINT_T1);
        const __m512 sw = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s[q])), xs);
        acc[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_dot_vnni(w[q], x, c->xc[b], BITS)), sw, acc[q]);
        w[q] += cb;
      }
      if (++j == per_g) {
        j = 0;
        for (int q = 0; q < S; q++) s[q] += QG_ROWS;
      }
    }
    for (int q = 0; q < S; q++) {
      const int64_t R = start[q] + i;
      const __mmask16 mask = (__mmask16)((1u << QG_MIN(c->n - R * QG_ROWS, QG_ROWS)) - 1);
      __m512 y = acc[q];
      if (c->bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, c->bias + R * QG_ROWS));
      if (c->res) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, c->res + R * QG_ROWS));
      _mm512_mask_storeu_ps(c->y + R * QG_ROWS, mask, y);
    }
  }
}

/* row groups [g0, g1), m = 1, as EX_WALK_PARTS' streams */
VNNI_FN static void gemv_vnni(const qg_ctx *c, int64_t g0, int64_t g1) {
  if (c->bits == 4)
    EX_WALK_PARTS(g0, g1, gemv_streams, c, 4);
  else
    EX_WALK_PARTS(g0, g1, gemv_streams, c, 8);
}
#endif

static void task(void *ctx, int64_t g0, int64_t g1) {
  const qg_ctx *c = ctx;
#if defined(__x86_64__)
  if (c->path == QG_VNNI) {
    if (c->m == 1)
      gemv_vnni(c, g0, g1);
    else
      groups_vnni(c, g0, g1);
    return;
  }
  if (c->path == QG_AVX2 && c->m == 1) {
    gemv_avx2(c, g0, g1);
    return;
  }
  if (c->path == QG_AVX2) {
    /* every block of QG_MR rows of x against each 8-row half of a group while its weights are in
     * L1 */
    for (int64_t R = g0; R < g1; R++) {
      for (int64_t i0 = 0; i0 < c->m; i0 += QG_MR) {
        const int mr = (int)QG_MIN(QG_MR, c->m - i0);
        for (int64_t H = 2 * R; H < 2 * R + 2; H++) rows_avx2(c, H, i0, mr);
      }
    }
    return;
  }
#endif
  rows_generic(c, g0, g1);
}

static int qg_path(void) {
  const int isa = ex_isa();
#if defined(__x86_64__)
  if (isa == EX_ISA_AVX512) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni")) return QG_VNNI;
  }
#endif
  return isa == EX_ISA_GENERIC ? QG_GENERIC : QG_AVX2;
}

/* several weights over one x: their row groups form one range split over the pool; an item
 * runs the part of it in each weight it covers */
typedef struct {
  const qg_ctx *c;
  const int64_t *first; /* count + 1 prefix sums of the weights' row groups */
  int32_t count;
} qg_multi;

static void multi_task(void *ctx, int64_t g0, int64_t g1) {
  const qg_multi *mu = ctx;
  for (int32_t j = 0; j < mu->count; j++) {
    const int64_t lo = g0 > mu->first[j] ? g0 : mu->first[j], hi = QG_MIN(g1, mu->first[j + 1]);
    if (lo < hi) task((void *)&mu->c[j], lo - mu->first[j], hi - mu->first[j]);
  }
}

int ex_qgemm_multi(int32_t bits, int64_t m, int64_t k, int64_t group, const float *x, int32_t count,
                   const int64_t *n, const void *const *wq, const void *const *scales, const float *const *bias,
                   const float *const *res, float *y, const ex_prefetch *then) {
  if (!qg_shape_ok(bits, k, group) || m < 0 || count < 1 || count > QG_MULTI_MAX) return EX_EINVAL;
  int64_t ldy = 0;
  for (int32_t j = 0; j < count; j++) {
    if (n[j] < 0) return EX_EINVAL;
    ldy += n[j];
  }
  if (m == 0 || ldy == 0) return EX_OK;
  const int64_t nblk = m * (k / 32);
  int8_t *xq = malloc((size_t)(m * k));
  float *xs = malloc(sizeof(float) * (size_t)nblk);
  int32_t *xc = malloc(sizeof(int32_t) * (size_t)nblk);
  if (!xq || !xs || !xc) {
    free(xq), free(xs), free(xc);
    return EX_ENOMEM;
  }
  const int path = qg_path();
  const int32_t offset = bits == 4 ? 8 : 128;
#if defined(__x86_64__)
  if (path == QG_VNNI)
    quantize_rows_avx512(x, nblk, offset, xq, xs, xc);
  else if (path == QG_AVX2)
    quantize_rows_avx2(x, nblk, offset, xq, xs, xc);
  else
#endif
    quantize_rows(x, nblk, offset, xq, xs, xc);
  qg_ctx c[QG_MULTI_MAX];
  int64_t first[QG_MULTI_MAX + 1] = {0}, col = 0;
  for (int32_t j = 0; j < count; j++) {
    c[j] = (qg_ctx){bits, m, n[j], k, group, xq, xs, xc, wq[j], scales[j], bias ? bias[j] : NULL,
                    res ? res[j] : NULL, y + col, ldy, path};
    col += n[j];
    first[j + 1] = first[j] + (n[j] + QG_ROWS - 1) / QG_ROWS;
  }
  qg_multi mu = {c, first, count};
  /* at m = 1, 4 groups (64 rows) an item: 896 rows split 4:4 over two threads (8 groups an item
   * gave 4:3, and one thread alone for 128 rows; 12-14% slower on those two shapes) */
  ex_parallel_for(first[count], m == 1 ? QG_ITEM1 : path != QG_VNNI ? 2 : m >= QG_MR512 ? 1 : 8, multi_task, &mu);
  free(xq), free(xs), free(xc);
  if (then) ex_prefetch_async(then);
  return EX_OK;
}

void ex_qgemm_prefetch_plan(int32_t bits, int64_t k, int64_t group, int32_t count, const int64_t *n,
                            const void *const *wq, const void *const *scales, ex_prefetch *req) {
  req->n = 0;
  if (!qg_shape_ok(bits, k, group) || count < 1 || count > QG_MULTI_MAX) return;
  int64_t first[QG_MULTI_MAX + 1] = {0};
  for (int32_t j = 0; j < count; j++) first[j + 1] = first[j] + (QG_MAX(n[j], 0) + QG_ROWS - 1) / QG_ROWS;
  const int64_t items = first[count], cb = (bits == 8 ? 512 : 256) * (k / 32), sb = 2 * QG_ROWS * (k / group);
  /* the ranges ex_qgemm_multi's ex_parallel_for makes, each weight's part in EX_WALK_PARTS' streams */
  const int64_t per = ex_parallel_per(items, QG_ITEM1);
  for (int64_t g0 = 0; g0 < items; g0 += per)
    for (int32_t j = 0; j < count; j++) {
      const int64_t lo = QG_MAX(g0, first[j]) - first[j], hi = QG_MIN(g0 + per, first[j + 1]) - first[j];
      for (int64_t q = 0; q < EX_PARTS && lo < hi && req->n + 2 <= EX_PREFETCH_MAX; q++) {
        const int64_t R = ex_part_start(lo, hi, q), len = ex_part_start(lo, hi, q + 1) - R;
        if (len == 0) break;
        req->p[req->n] = (const uint8_t *)wq[j] + R * cb;
        req->bytes[req->n++] = QG_MIN(QG_PF_IDLE, len * cb);
        req->p[req->n] = (const uint8_t *)scales[j] + R * sb;
        req->bytes[req->n++] = QG_MIN(QG_PF_IDLE * sb / cb, len * sb);
      }
    }
}

int ex_qgemm_rows(int32_t bits, int64_t n, int64_t k, int64_t group, const void *wq, const void *scales,
                  const int64_t *rows, int64_t count, float *out) {
  if (!qg_shape_ok(bits, k, group) || n < 0 || count < 0) return EX_EINVAL;
  for (int64_t i = 0; i < count; i++)
    if (rows[i] < 0 || rows[i] >= n) return EX_EINVAL;
  const int64_t nb = k / 32, ng = k / group, per_g = group / 32, cb = bits == 8 ? 512 : 256;
  for (int64_t i = 0; i < count; i++) {
    const int64_t r = rows[i] % QG_ROWS;
    const uint8_t *w = (const uint8_t *)wq + rows[i] / QG_ROWS * nb * cb;
    const uint16_t *sc = (const uint16_t *)scales + rows[i] / QG_ROWS * ng * QG_ROWS;
    float *y = out + i * k;
    /* a 32-value block of the group is 4-byte runs, one per row, run t holding values 4t .. 4t + 3
     * (int8), or their low nibbles values 4t .. 4t + 3 and high nibbles 16 + 4t .. (int4) */
    for (int64_t b = 0; b < nb; b++, w += cb, y += 32) {
      const float d = half_to_f32(sc[b / per_g * QG_ROWS + r]);
      for (int t = 0; t < (bits == 8 ? 8 : 4); t++)
        for (int j = 0; j < 4; j++) {
          const uint8_t v = w[(t * QG_ROWS + r) * 4 + j];
          if (bits == 8) {
            y[4 * t + j] = (float)(int8_t)v * d;
          } else {
            y[4 * t + j] = (float)((v & 15) - 8) * d;
            y[16 + 4 * t + j] = (float)((v >> 4) - 8) * d;
          }
        }
    }
  }
  return EX_OK;
}

int ex_qgemm(int32_t bits, int64_t m, int64_t n, int64_t k, int64_t group, const float *x, const void *wq,
             const void *scales, const float *bias, float *y) {
  return ex_qgemm_multi(bits, m, k, group, x, 1, &n, &wq, &scales, bias ? &bias : NULL, NULL, y, NULL);
}

/* ---- ex_read_sum: the sum of a float buffer, read as fast as the pool can read ----
 * The yardstick for the m = 1 GEMV above (llm.py's decode bound): each task reads its part as
 * QG_RS_STREAMS independent streams, prefetched as the GEMV of the same ISA is (see QG_PF), and
 * sums them, so that no load can be dropped; little work per byte.  (Without the prefetches the
 * AVX-512 loop read 32.6 - 34.3 GB/s at one thread on a Zen 4 core, 30.5 - 32.9 with the AVX2
 * GEMV's old 512 B / 4 KB prefetches; on the Intel Xeon host QG_PF_VNNI made no difference: 17.0 -
 * 17.9 / 36.6 - 38.5 GB/s at one / two threads with it, 17.9 / 37.2 - 37.5 without.) */
#define QG_RS_STREAMS 4
#define QG_RS_ITEM 4096 /* floats a parallel_for item: 16 KiB */

typedef struct {
  const float *p;
  int64_t n;
  _Atomic double sum;
} rs_ctx;

static void rs_add(rs_ctx *c, double v) {
  double old = atomic_load(&c->sum);
  while (!atomic_compare_exchange_weak(&c->sum, &old, old + v)) {
  }
}

/* [i0, i1) as QG_RS_STREAMS streams of len floats (a multiple of 16) each */
#if defined(__x86_64__)
VNNI_FN static double rs_avx512(const float *p, int64_t len) {
  __m512 acc[QG_RS_STREAMS];
  for (int s = 0; s < QG_RS_STREAMS; s++) acc[s] = _mm512_setzero_ps();
  for (int64_t i = 0; i < len; i += 16)
    for (int s = 0; s < QG_RS_STREAMS; s++) {
      _mm_prefetch((const char *)(p + s * len + i) + QG_PF_VNNI, _MM_HINT_T1);
      acc[s] = _mm512_add_ps(acc[s], _mm512_loadu_ps(p + s * len + i));
    }
  for (int s = 1; s < QG_RS_STREAMS; s++) acc[0] = _mm512_add_ps(acc[0], acc[s]);
  return (double)_mm512_reduce_add_ps(acc[0]);
}

AVX2_FN static double rs_avx2(const float *p, int64_t len) {
  __m256 acc[2 * QG_RS_STREAMS];
  for (int s = 0; s < 2 * QG_RS_STREAMS; s++) acc[s] = _mm256_setzero_ps();
  for (int64_t i = 0; i < len; i += 16)
    for (int s = 0; s < QG_RS_STREAMS; s++) {
      acc[2 * s] = _mm256_add_ps(acc[2 * s], _mm256_loadu_ps(p + s * len + i));
      acc[2 * s + 1] = _mm256_add_ps(acc[2 * s + 1], _mm256_loadu_ps(p + s * len + i + 8));
    }
  for (int s = 1; s < 2 * QG_RS_STREAMS; s++) acc[0] = _mm256_add_ps(acc[0], acc[s]);
  float out[8];
  _mm256_storeu_ps(out, acc[0]);
  double sum = 0;
  for (int l = 0; l < 8; l++) sum += out[l];
  return sum;
}
#endif

static void rs_task(void *ctx, int64_t b, int64_t e) {
  rs_ctx *c = ctx;
  const int64_t i0 = b * QG_RS_ITEM, i1 = QG_MIN(e * QG_RS_ITEM, c->n);
  const int64_t len = (i1 - i0) / (16 * QG_RS_STREAMS) * 16; /* floats a stream */
  const float *p = c->p + i0;
  double sum = 0;
  int64_t i = 0;
#if defined(__x86_64__)
  const int path = qg_path();
  if (path == QG_VNNI && len) sum = rs_avx512(p, len), i = QG_RS_STREAMS * len;
  if (path == QG_AVX2 && len) sum = rs_avx2(p, len), i = QG_RS_STREAMS * len;
#endif
  double part[8] = {0}; /* the rest, and everything for the portable code */
  for (; i + 8 <= i1 - i0; i += 8)
    for (int l = 0; l < 8; l++) part[l] += p[i + l];
  for (; i < i1 - i0; i++) part[0] += p[i];
  for (int l = 0; l < 8; l++) sum += part[l];
  rs_add(c, sum);
}

double ex_read_sum(const float *p, int64_t n) {
  if (!p || n <= 0) return 0.0;
  rs_ctx c = {p, n, 0.0};
  const int64_t items = (n + QG_RS_ITEM - 1) / QG_RS_ITEM;
  ex_parallel_for(items, 1, rs_task, &c);
  return atomic_load(&c.sum);
}
