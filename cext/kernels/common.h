/* Helpers shared by the kernel files.  Each variant translation unit (variant_generic.c,
 * variant_avx2.c) includes this once; EX_AVX2 is defined only in the AVX2+FMA+F16C unit.
 * The portable half-precision conversions are the reference; the F16C ones are the fast path. */
#ifndef EX_KERNELS_COMMON_H
#define EX_KERNELS_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../internal.h"
#include "half.h"
#ifdef EX_AVX2
#include <immintrin.h>
#endif

#define EX_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EX_MAX(a, b) ((a) > (b) ? (a) : (b))

static inline uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float f_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline int dtype_ok(int32_t dt) { return dt >= EX_F32 && dt <= EX_BOOL; }
static inline int dtype_is_float(int32_t dt) { return dt == EX_F32 || dt == EX_F16 || dt == EX_BF16; }
static inline int dtype_size(int32_t dt) {
  static const int8_t sz[] = {4, 2, 2, 1, 1, 4, 8, 1};
  return sz[dt];
}

/* ---- f16 / bf16 <-> f32, round to nearest even ---- */
static inline float f16_to_f32(uint16_t h) {
#ifdef EX_AVX2
  return _cvtsh_ss(h);
#else
  return half_to_f32(h);
#endif
}

static inline uint16_t f32_to_f16(float f) {
#ifdef EX_AVX2
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  return f32_to_half(f);
#endif
}

static inline float bf16_to_f32(uint16_t h) { return f_from_bits((uint32_t)h << 16); }
static inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* strided arrays of f16 <-> contiguous f32 */
static void f16_load(float *d, const uint16_t *s, int64_t st, int64_t n) {
  int64_t i = 0;
#ifdef EX_AVX2
  if (st == 1)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
  for (; i < n; i++) d[i] = f16_to_f32(s[i * st]);
}
static void f16_store(uint16_t *d, int64_t st, const float *s, int64_t n) {
  int64_t i = 0;
#ifdef EX_AVX2
  if (st == 1)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128((__m128i *)(d + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; i++) d[i * st] = f32_to_f16(s[i]);
}

/* float -> int64 truncating toward zero; NaN and out-of-range give INT64_MIN (as x86 does) */
static inline int64_t f_to_i64(float x) {
  return (x >= -9.223372036854775808e18f && x < 9.223372036854775808e18f) ? (int64_t)x : INT64_MIN;
}

/* NumPy maximum/minimum: NaN in either operand wins */
static inline float nan_max(float x, float y) { float r = x >= y ? x : y; return x != x ? x : r; }
static inline float nan_min(float x, float y) { float r = x <= y ? x : y; return x != x ? x : r; }

/* the even- and odd-indexed elements of the 2 vectors a, b (a's first): the register form of
 * deinterleave, also used by the depthwise kernel */
#ifdef EX_AVX512
static inline void split512(__m512 a, __m512 b, __m512 *ev, __m512 *od) {
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  *ev = _mm512_permutex2var_ps(a, ie, b);
  *od = _mm512_permutex2var_ps(a, io, b);
}
/* ReLU / ReLU6 of v for those act values (any other: v unchanged).  The constant is the first
 * operand: max/min return the second when either is NaN, so NaN passes through as in act_row */
static inline __m512 relu512(__m512 v, int act) {
  if (act == EX_ACT_RELU || act == EX_ACT_RELU6) v = _mm512_max_ps(_mm512_setzero_ps(), v);
  if (act == EX_ACT_RELU6) v = _mm512_min_ps(_mm512_set1_ps(6.0f), v);
  return v;
}
/* r[0..15] (rows) -> r[o] = column o of the 16 x 16 block (conv.c's and depthwise.c's
 * small-plane forms): pairs of rows interleaved, then pairs of pairs, then 128-bit lanes gathered
 * twice */
static inline void tr16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) { /* u[i + k], lane l: column 4 l + k of rows i .. i + 3 */
    const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]),
                  t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
    u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int k = 0; k < 4; k++) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), v1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD),
                 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88),
                 v3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[4 + k] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}
#endif
#ifdef EX_AVX2
/* relu512's AVX2 twin: ReLU / ReLU6 of v for those act values (any other: v unchanged), NaN
 * passing through */
static inline __m256 relu256(__m256 v, int act) {
  if (act == EX_ACT_RELU || act == EX_ACT_RELU6) v = _mm256_max_ps(_mm256_setzero_ps(), v);
  if (act == EX_ACT_RELU6) v = _mm256_min_ps(_mm256_set1_ps(6.0f), v);
  return v;
}
/* r[0..7] (rows) -> r[o] = column o of the 8 x 8 block: pairs of rows interleaved, then pairs of
 * pairs, then the 128-bit halves gathered */
static inline void tr8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]),
               t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]),
               t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]),
               t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
static inline void split256(__m256 a, __m256 b, __m256 *ev, __m256 *od) {
  /* within 128-bit lanes, then fix the lane order */
  const __m256 e = _mm256_shuffle_ps(a, b, 0x88), o = _mm256_shuffle_ps(a, b, 0xDD);
  *ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8));
  *od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8));
}
#endif

/* even-indexed then odd-indexed elements of s[0:n] to ev[0:(n+1)/2], od[0:n/2] */
static void deinterleave(const float *s, int64_t n, float *ev, float *od) {
  int64_t i = 0;
#ifdef EX_AVX512
  for (; i + 32 <= n; i += 32) {
    __m512 e, o;
    split512(_mm512_loadu_ps(s + i), _mm512_loadu_ps(s + i + 16), &e, &o);
    _mm512_storeu_ps(ev + i / 2, e);
    _mm512_storeu_ps(od + i / 2, o);
  }
  if (i < n) { /* the last 1..31 under masks (a 56-float row's 24 took as long as the 32 before) */
    const int64_t r = n - i;
    const __mmask16 m0 = (__mmask16)(r >= 16 ? 0xFFFFu : (1u << r) - 1), m1 = (__mmask16)(r > 16 ? (1u << (r - 16)) - 1 : 0);
    __m512 e, o;
    split512(_mm512_maskz_loadu_ps(m0, s + i), _mm512_maskz_loadu_ps(m1, s + i + 16), &e, &o);
    _mm512_mask_storeu_ps(ev + i / 2, (__mmask16)((1u << (r + 1) / 2) - 1), e);
    _mm512_mask_storeu_ps(od + i / 2, (__mmask16)((1u << r / 2) - 1), o);
    return;
  }
#elif defined(EX_AVX2)
  for (; i + 16 <= n; i += 16) {
    __m256 e, o;
    split256(_mm256_loadu_ps(s + i), _mm256_loadu_ps(s + i + 8), &e, &o);
    _mm256_storeu_ps(ev + i / 2, e);
    _mm256_storeu_ps(od + i / 2, o);
  }
#endif
  for (; i + 1 < n; i += 2) { ev[i / 2] = s[i]; od[i / 2] = s[i + 1]; }
  if (i < n) ev[i / 2] = s[i];
}

/* ---- strided loads (widen to f32 / int64) and stores (narrow to the dtype) ----
 * float->int truncates (f_to_i64), int->narrower int wraps, anything->bool is (x != 0). */
#define CONV_LOOP(DST, SRC_T, SRC, S, N, EXPR)                            \
  do {                                                                    \
    const SRC_T *src_ = (const SRC_T *)(SRC);                             \
    if ((S) == 1)                                                         \
      for (int64_t i_ = 0; i_ < (N); i_++) { SRC_T v = src_[i_]; (DST)[i_] = (EXPR); } \
    else                                                                  \
      for (int64_t i_ = 0; i_ < (N); i_++) { SRC_T v = src_[i_ * (S)]; (DST)[i_] = (EXPR); } \
  } while (0)

static void load_f(float *d, const void *x, int32_t dt, int64_t s, int64_t n) {
  switch (dt) {
  case EX_F32: CONV_LOOP(d, float, x, s, n, v); break;
  case EX_F16: f16_load(d, (const uint16_t *)x, s, n); break;
  case EX_BF16: CONV_LOOP(d, uint16_t, x, s, n, bf16_to_f32(v)); break;
  case EX_I8: CONV_LOOP(d, int8_t, x, s, n, (float)v); break;
  case EX_U8: CONV_LOOP(d, uint8_t, x, s, n, (float)v); break;
  case EX_I32: CONV_LOOP(d, int32_t, x, s, n, (float)v); break;
  case EX_I64: CONV_LOOP(d, int64_t, x, s, n, (float)v); break;
  default: CONV_LOOP(d, uint8_t, x, s, n, v != 0 ? 1.0f : 0.0f); break;
  }
}

static void load_i(int64_t *d, const void *x, int32_t dt, int64_t s, int64_t n) {
  switch (dt) {
  case EX_F32: CONV_LOOP(d, float, x, s, n, f_to_i64(v)); break;
  case EX_F16: CONV_LOOP(d, uint16_t, x, s, n, f_to_i64(f16_to_f32(v))); break;
  case EX_BF16: CONV_LOOP(d, uint16_t, x, s, n, f_to_i64(bf16_to_f32(v))); break;
  case EX_I8: CONV_LOOP(d, int8_t, x, s, n, v); break;
  case EX_U8: CONV_LOOP(d, uint8_t, x, s, n, v); break;
  case EX_I32: CONV_LOOP(d, int32_t, x, s, n, v); break;
  case EX_I64: CONV_LOOP(d, int64_t, x, s, n, v); break;
  default: CONV_LOOP(d, uint8_t, x, s, n, v != 0); break;
  }
}

#define STORE_LOOP(DST_T, DST, S, SRC, N, EXPR)                           \
  do {                                                                    \
    DST_T *dst_ = (DST_T *)(DST);                                         \
    if ((S) == 1)                                                         \
      for (int64_t i_ = 0; i_ < (N); i_++) { __typeof__((SRC)[0]) v = (SRC)[i_]; dst_[i_] = (DST_T)(EXPR); } \
    else                                                                  \
      for (int64_t i_ = 0; i_ < (N); i_++) { __typeof__((SRC)[0]) v = (SRC)[i_]; dst_[i_ * (S)] = (DST_T)(EXPR); } \
  } while (0)

static void store_f(void *y, int32_t dt, int64_t s, const float *d, int64_t n) {
  switch (dt) {
  case EX_F32: STORE_LOOP(float, y, s, d, n, v); break;
  case EX_F16: f16_store((uint16_t *)y, s, d, n); break;
  case EX_BF16: STORE_LOOP(uint16_t, y, s, d, n, f32_to_bf16(v)); break;
  case EX_I8: STORE_LOOP(int8_t, y, s, d, n, f_to_i64(v)); break;
  case EX_U8: STORE_LOOP(uint8_t, y, s, d, n, f_to_i64(v)); break;
  case EX_I32: STORE_LOOP(int32_t, y, s, d, n, f_to_i64(v)); break;
  case EX_I64: STORE_LOOP(int64_t, y, s, d, n, f_to_i64(v)); break;
  default: STORE_LOOP(uint8_t, y, s, d, n, v != 0); break;
  }
}

static void store_i(void *y, int32_t dt, int64_t s, const int64_t *d, int64_t n) {
  switch (dt) {
  case EX_F32: STORE_LOOP(float, y, s, d, n, (float)v); break;
  case EX_F16: STORE_LOOP(uint16_t, y, s, d, n, f32_to_f16((float)v)); break;
  case EX_BF16: STORE_LOOP(uint16_t, y, s, d, n, f32_to_bf16((float)v)); break;
  case EX_I8: STORE_LOOP(int8_t, y, s, d, n, v); break;   /* gcc: conversion wraps */
  case EX_U8: STORE_LOOP(uint8_t, y, s, d, n, v); break;
  case EX_I32: STORE_LOOP(int32_t, y, s, d, n, v); break;
  case EX_I64: STORE_LOOP(int64_t, y, s, d, n, v); break;
  default: STORE_LOOP(uint8_t, y, s, d, n, v != 0); break;
  }
}

/* Pairwise sum of a contiguous float array (NumPy's scheme: 8 lanes below 128 elements). */
static float sum_f32(const float *x, int64_t n) {
  if (n < 8) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
  }
  if (n <= 128) {
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = x[j];
    int64_t i = 8;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; j++) acc[j] += x[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += x[i];
    return s;
  }
  int64_t h = (n / 2) & ~(int64_t)7;
  return sum_f32(x, h) + sum_f32(x + h, n - h);
}

/* Accumulates a stream of equal-sized float partial vectors pairwise (a binary counter of
 * levels), so the error grows with log(count) instead of count. */
#define EX_PW_LEVELS 40
typedef struct {
  float *lv;     /* EX_PW_LEVELS * w floats */
  uint64_t mask; /* occupied levels */
  int64_t w;
} pairwise_acc;

static void pw_push(pairwise_acc *p, float *v) { /* v is clobbered */
  int l = 0;
  for (; p->mask >> l & 1; l++) {
    float *o = p->lv + l * p->w;
    for (int64_t j = 0; j < p->w; j++) v[j] += o[j];
  }
  p->mask = (p->mask & ~((((uint64_t)1) << l) - 1)) | ((uint64_t)1 << l);
  memcpy(p->lv + l * p->w, v, (size_t)p->w * sizeof(float));
}
static void pw_total(pairwise_acc *p, float *out) {
  for (int64_t j = 0; j < p->w; j++) out[j] = 0.0f;
  for (int l = 0; l < EX_PW_LEVELS; l++)
    if (p->mask >> l & 1)
      for (int64_t j = 0; j < p->w; j++) out[j] += p->lv[l * p->w + j];
}

#endif
