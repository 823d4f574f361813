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
 * (8 steps * 2 * 15 * 127 < 32768).  Row groups are split over the pool; each task walks its row
 * groups and, for each, all rows of x QG_MR at a time (a chunk is expanded once per QG_MR rows,
 * and the group's weights stay in L1 while x passes over them).
 *
 * AVX-512 VNNI: a 512-bit register holds one step of two row groups side by side (16 rows x 4
 * values), so one vpdpbusd against 4 values of x broadcast from memory gives 16 rows' partial
 * sums.  vpdpbusd multiplies unsigned by signed bytes: int4 nibbles are already unsigned; int8
 * weights are made unsigned by flipping their sign bit (q + 128), and both subtract the offset
 * times sum(x) by starting the block's int32 sum at -offset * sum(x).  Each task walks column
 * pairs of groups and, for each, all rows of x QG_MR512 at a time, so the weights of a pair
 * (k / 2 bytes per row for int4) stay in L1 while every row of x passes over them.
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
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define QG_MR 4
#define QG_MR512 8
/* software prefetch distance (bytes) for streaming weights at m = 1: a hardware prefetcher alone
 * leaves a single core well short of the DRAM bandwidth (measured on a Zen 5 core).  The VNNI
 * GEMV prefetches int4 weights QG_PF_L2 ahead into L2, not L1: on a Zen 4 core (32 KB L1) 16 KB
 * ahead into L1 halved the down projection's rate, into L2 int4 ran 5-10% faster than 8 KB into
 * L1 (decode at 2 threads 76 -> 85 tokens/s) while int8 ran 0-15% slower */
#define QG_PF 8192
#define QG_PF_L2 16384
#define QG_MIN(a, b) ((a) < (b) ? (a) : (b))

typedef struct {
  int32_t bits;
  int64_t m, n, k, group;
  const int8_t *xq;   /* m x k quantized activations */
  const float *xs;    /* m x k/32 their scales */
  const int32_t *xc;  /* m x k/32: offset * sum(xq) of the block (8 for int4, 128 for int8) */
  const uint8_t *wq;
  const uint16_t *scales; /* float16 */
  const float *bias;
  float *y;
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
          acc[r] += (float)d * c->xs[i * nb + b] * half_to_f32(s[r]);
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
    _mm_prefetch((const char *)(w + QG_PF), _MM_HINT_T0);
    _mm_prefetch((const char *)(w + QG_PF + 64), _MM_HINT_T0);
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
      const __m256 d = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_madd_epi16(p, ones), _mm256_set1_epi32(c->xc[xb])));
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
    for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)(w + QG_PF + l), _MM_HINT_T0);
    for (int t = 0; t < 8; t++) {
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

/* one step t of row groups R0 | R1 in the two halves of a register */
VNNI_FN static inline __m512i load_pair(const uint8_t *w0, const uint8_t *w1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)w0)),
                            _mm256_loadu_si256((const __m256i *)w1), 1);
}

/* y columns 8 * R .. 8 * R + 15 (row groups R and R + 1; when R is the last group its copy fills
 * the upper half and is not stored) for MR rows of x from i0.  BITS and MR are constants at
 * every call, so the accumulators live in registers. */
VNNI_FN __attribute__((always_inline)) static inline void pair_vnni(const qg_ctx *c, int64_t R, int64_t i0,
                                                                    const int BITS, const int MR) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32, cb = BITS == 8 ? 256 : 128;
  const int64_t R1 = R + 1 < (c->n + 7) / 8 ? R + 1 : R;
  const uint8_t *w0 = c->wq + R * nb * cb, *w1 = c->wq + R1 * nb * cb;
  const uint16_t *s0 = c->scales + R * ng * 8, *s1 = c->scales + R1 * ng * 8;
  const __m512i m4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[MR];
  for (int i = 0; i < MR; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++, w0 += cb, w1 += cb) {
    __m512i w[8]; /* w[t] pairs with x values 4t .. 4t + 3 of the block */
    if (BITS == 4) {
      for (int t = 0; t < 4; t++) {
        const __m512i r = load_pair(w0 + 32 * t, w1 + 32 * t);
        w[t] = _mm512_and_si512(r, m4);
        w[4 + t] = _mm512_and_si512(_mm512_srli_epi16(r, 4), m4);
      }
    } else {
      for (int t = 0; t < 8; t++) w[t] = _mm512_xor_si512(load_pair(w0 + 32 * t, w1 + 32 * t), flip);
    }
    const int64_t sg = (b / per_g) * 8;
    const __m512 sw = _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(s0 + sg))), _mm_loadu_si128((const __m128i *)(s1 + sg)), 1));
    for (int i = 0; i < MR; i++) {
      const int8_t *x = c->xq + (i0 + i) * c->k + b * 32;
      const int64_t xb = (i0 + i) * nb + b;
      __m512i d = _mm512_set1_epi32(-c->xc[xb]);
      int32_t v;
      for (int t = 0; t < 8; t++) {
        memcpy(&v, x + 4 * t, 4);
        d = _mm512_dpbusd_epi32(d, w[t], _mm512_set1_epi32(v));
      }
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sw, _mm512_set1_ps(c->xs[xb])), acc[i]);
    }
  }
  const int64_t cols = QG_MIN(c->n - R * 8, R1 > R ? 16 : 8);
  const __mmask16 mask = (__mmask16)((1u << cols) - 1);
  const __m512 bias = c->bias ? _mm512_maskz_loadu_ps(mask, c->bias + R * 8) : _mm512_setzero_ps();
  for (int i = 0; i < MR; i++) _mm512_mask_storeu_ps(c->y + (i0 + i) * c->n + R * 8, mask, _mm512_add_ps(acc[i], bias));
}

#define QG_PAIR_CASES(BITS)                                            \
  switch (mr) {                                                        \
    case 1: pair_vnni(c, R, i0, BITS, 1); break;                       \
    case 2: pair_vnni(c, R, i0, BITS, 2); break;                       \
    case 3: pair_vnni(c, R, i0, BITS, 3); break;                       \
    case 4: pair_vnni(c, R, i0, BITS, 4); break;                       \
    case 5: pair_vnni(c, R, i0, BITS, 5); break;                       \
    case 6: pair_vnni(c, R, i0, BITS, 6); break;                       \
    case 7: pair_vnni(c, R, i0, BITS, 7); break;                       \
    default: pair_vnni(c, R, i0, BITS, QG_MR512); break;               \
  }

/* column pairs [p0, p1) (groups 2p, 2p + 1), every row of x */
VNNI_FN static void pairs_vnni(const qg_ctx *c, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; p++) {
    const int64_t R = 2 * p;
    for (int64_t i0 = 0; i0 < c->m; i0 += QG_MR512) {
      const int mr = (int)QG_MIN(QG_MR512, c->m - i0);
      if (c->bits == 4) {
        QG_PAIR_CASES(4)
      } else {
        QG_PAIR_CASES(8)
      }
    }
  }
}

/* row groups [g0, g1), m = 1; lanes r and 8 + r both sum row r (the block's even and odd steps).
 * Each task reads its row groups as one stream of 64-byte loads (two steps t, t + 1 of 8 rows),
 * prefetched ahead (int4 QG_PF_L2 into L2, int8 QG_PF).  Vector p of x holds values 8p .. 8p + 3
 * of the block in its lower 8 lanes and 8p + 4 .. 8p + 7 in its upper 8, permuted from the
 * block's 32 bytes in registers: a copy of x expanded to that form in memory (256 bytes a block)
 * outgrew L1 at k = 4864 and took the down projection from 34 to 25 GB/s.  Tried and measured
 * slower on a Zen 5 core (int4, Qwen2.5-0.5B shapes, with x then read from that copy, ~31 GB/s of
 * ~40 the core can read): 8 or 4 row groups side by side (x loaded once for all; 8 prefetched
 * streams, ~20 GB/s), two blocks a step in register accumulators, and adding the halves of two
 * blocks crosswise to halve the float work (both ~28).  Within the noise: the high nibble by one
 * gf2p8affine (GFNI) instead of a shift and a mask, non-temporal prefetches, a 16 KB prefetch
 * distance.  On a Zen 4
 * core, where int4 is bound by this loop's arithmetic (33 - 35 GB/s with the weights in cache):
 * two row groups a step sharing the x vectors and the float work (43 GB/s in cache, but two
 * streams: 10% slower from memory), x from in-lane shuffles instead of permutes, prefetching the
 * scales, all no faster. */
VNNI_FN static void gemv_vnni(const qg_ctx *c, int64_t g0, int64_t g1) {
  const int64_t nb = c->k / 32, ng = c->k / c->group, per_g = c->group / 32, cb = chunk_bytes(c->bits);
  const __m512i m4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
  const __m512i lo = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i i0 = lo, i1 = _mm512_add_epi32(lo, _mm512_set1_epi32(2)), i2 = _mm512_add_epi32(lo, _mm512_set1_epi32(4)),
                i3 = _mm512_add_epi32(lo, _mm512_set1_epi32(6));
  for (int64_t R = g0; R < g1; R++) {
    const uint8_t *w = c->wq + R * nb * cb;
    const uint16_t *s = c->scales + R * ng * 8;
    /* two int32 sums per block and two float sums (even, odd blocks): short dependency chains */
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0, j = 0; b < nb; b++, w += cb) {
      if (c->bits == 4)
        for (int l = 0; l < cb; l += 64) _mm_prefetch((const char *)w + QG_PF_L2 + l, _MM_HINT_T1);
      else
        for (int l = 0; l < cb; l += 64) _mm_prefetch((const char *)w + QG_PF + l, _MM_HINT_T0);
      const __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(c->xq + b * 32)));
      const __m512i x0 = _mm512_permutexvar_epi32(i0, v), x1 = _mm512_permutexvar_epi32(i1, v),
                    x2 = _mm512_permutexvar_epi32(i2, v), x3 = _mm512_permutexvar_epi32(i3, v);
      __m512i d0 = _mm512_maskz_set1_epi32(0x00ff, -c->xc[b]), d1 = _mm512_setzero_si512();
      if (c->bits == 4) {
        const __m512i r0 = _mm512_loadu_si512(w), r1 = _mm512_loadu_si512(w + 64);
        d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(r0, m4), x0);
        d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(r1, m4), x1);
        d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(_mm512_srli_epi16(r0, 4), m4), x2);
        d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(_mm512_srli_epi16(r1, 4), m4), x3);
      } else {
        d0 = _mm512_dpbusd_epi32(d0, _mm512_xor_si512(_mm512_loadu_si512(w), flip), x0);
        d1 = _mm512_dpbusd_epi32(d1, _mm512_xor_si512(_mm512_loadu_si512(w + 64), flip), x1);
        d0 = _mm512_dpbusd_epi32(d0, _mm512_xor_si512(_mm512_loadu_si512(w + 128), flip), x2);
        d1 = _mm512_dpbusd_epi32(d1, _mm512_xor_si512(_mm512_loadu_si512(w + 192), flip), x3);
      }
      const __m512 sw = _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)s)));
      acc[b & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), _mm512_mul_ps(sw, _mm512_set1_ps(c->xs[b])), acc[b & 1]);
      if (++j == per_g) j = 0, s += 8; /* the next scale group */
    }
    acc[0] = _mm512_add_ps(acc[0], acc[1]);
    __m256 y = _mm256_add_ps(_mm512_castps512_ps256(acc[0]), _mm512_extractf32x8_ps(acc[0], 1));
    const int64_t cols = QG_MIN(c->n - R * 8, 8);
    const __mmask8 mask = (__mmask8)((1u << cols) - 1);
    if (c->bias) y = _mm256_add_ps(y, _mm256_maskz_loadu_ps(mask, c->bias + R * 8));
    _mm256_mask_storeu_ps(c->y + R * 8, mask, y);
  }
}
#endif

static void task(void *ctx, int64_t g0, int64_t g1) {
  const qg_ctx *c = ctx;
#if defined(__x86_64__)
  if (c->path == QG_VNNI) {
    if (c->m == 1)
      gemv_vnni(c, g0, g1);
    else
      pairs_vnni(c, g0, g1);
    return;
  }
  if (c->path == QG_AVX2) {
    /* every block of QG_MR rows of x against one row group while its weights are in L1 */
    for (int64_t R = g0; R < g1; R++) {
      for (int64_t i0 = 0; i0 < c->m; i0 += QG_MR) {
        const int mr = (int)QG_MIN(QG_MR, c->m - i0);
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

int ex_qgemm(int32_t bits, int64_t m, int64_t n, int64_t k, int64_t group, const float *x, const void *wq,
             const void *scales, const float *bias, float *y) {
  if ((bits != 4 && bits != 8) || m < 0 || n < 0 || k <= 0 || group <= 0 || group % 32 || k % group)
    return EX_EINVAL;
  if (m == 0 || n == 0) return EX_OK;
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
  else
#endif
    quantize_rows(x, nblk, offset, xq, xs, xc);
  qg_ctx c = {bits, m, n, k, group, xq, xs, xc, wq, scales, bias, y, path};
  const int64_t groups = (n + 7) / 8;
  if (path == QG_VNNI && m > 1)
    ex_parallel_for((groups + 1) / 2, m >= QG_MR512 ? 1 : 8, task, &c);
  else
    ex_parallel_for(groups, m == 1 ? 16 : 4, task, &c);
  free(xq), free(xs), free(xc);
  return EX_OK;
}

/* ---- ex_read_sum: the sum of a float buffer, read as fast as the pool can read ----
 * The yardstick for the m = 1 GEMV above (llm.py's decode bound): each task reads its part as
 * QG_RS_STREAMS independent streams with software prefetch (one stream, as the GEMV reads, came
 * out the same here) and sums them, so that no load can be dropped; little work per byte. */
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
      _mm_prefetch((const char *)(p + s * len + i) + QG_PF / 2, _MM_HINT_T0);
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
      _mm_prefetch((const char *)(p + s * len + i) + QG_PF / 2, _MM_HINT_T0);
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
