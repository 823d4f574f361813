/* ex_ggml_gemm: y = x @ W^T (+ bias) with W in GGUF blocks exactly as the file stores them (so a
 * memory-mapped file is used in place: no conversion, no copy).
 *
 * Block layouts (ggml-common.h), per row of k values, k a multiple of the block:
 *   Q4_0  (32): f16 d, u8 qs[16]                  w = d * (q - 8)   q: lo nibbles 0-15, hi 16-31
 *   Q5_0  (32): f16 d, u32 qh, u8 qs[16]          w = d * (q - 16)  bit 4 of value j: bit j of qh
 *   Q8_0  (32): f16 d, i8 qs[32]                  w = d * q
 *   Q4_K (256): f16 d, f16 dmin, u8 scales[12], u8 qs[128]
 *               8 sub-blocks of 32 with 6-bit sc, m:  w = d * sc * q - dmin * m
 *               qs: 4 chunks of 32 bytes, lo nibbles = sub-block 2c, hi nibbles = 2c + 1
 *   Q5_K (256): as Q4_K with u8 qh[32] before qs: bit 4 of value l of sub-block s is bit s of qh[l]
 *   Q6_K (256): u8 ql[128], u8 qh[64], i8 scales[16], f16 d    w = d * sc * (q - 32), groups of 16
 *
 * The activations are quantized as ggml's CPU backend does, and every block is an integer dot
 * product, so the results follow llama.cpp's numerics (not just the float product):
 *   for Q4_0/Q5_0/Q8_0: Q8_0 per 32 values, d = fp16(max|x| / 127), q = round_even(x * 127 / max|x|)
 *   for the K types:    Q8_K per 256 values, float d = max / -127 where max is the value of largest
 *                       magnitude, q = round_even(x * -127 / max), plus sums of q per 16 (bsums)
 * Per block (or super-block) the integer dot is scaled in float: sum_b d_w * d_x * dot_b, with
 * the K-type minimums and the Q6_K offset applied through the bsums.  Only the order of the float
 * sums over blocks differs between the portable code and the SIMD code.
 *
 * Its own translation unit: the SIMD code (ggml_quant_simd.inc, included twice: AVX2 with
 * maddubs, AVX-512 VNNI with vpdpbusd/vpdpwssd) carries target pragmas and runs only when the
 * selected ISA (ex_isa) allows it, so EXPRESS_ISA=generic exercises the portable code.
 * Work: the activations are quantized on the pool (groups of rows).  The rows of W are then
 * claimed in small chunks off a shared counter by one task per thread, so a thread that is
 * preempted or slow holds up the call by one chunk at most.
 *   prefill (8 rows of x or more): the rows of x are interleaved so that the lanes of a vector
 *     are 16 (AVX-512) or 8 (AVX2) rows of x; tiles of GQ_RB decoded rows of W against one or
 *     two such groups keep 8 independent multiply-add chains per load (rows_lanes).
 *   a few rows of x: GQ_RB rows of W at a time against up to GQ_MR rows of x (row_*).
 *   decode (one row of x): the loops stream the weights from memory, prefetching GQ_PF bytes
 *     ahead; Q8_0 / Q4_0 / Q5_0 take two blocks per 512-bit vector with AVX-512, the K types
 *     unpack their scales with vector shuffles. */
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

enum { T_Q4_0 = 2, T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };
#define GQ_MR 4 /* activation rows per pass */
#define GQ_RB 4 /* weight rows per pass */
#define GQ_PF 16384 /* bytes ahead of the weight stream to prefetch in the one-row (decode) loops */
#define GQ_YB 64 /* rows of W whose prefill results are gathered before they go to y */
#define GQ_LDB (GQ_YB + 4) /* the row stride of that buffer: not a power of two */
#define GQ_MULTI_MAX 8 /* weights one ex_ggml_gemm_multi call takes */

static int64_t block_values(int t) { return t == T_Q4_K || t == T_Q5_K || t == T_Q6_K ? 256 : 32; }

static int64_t block_bytes(int t) {
  switch (t) {
    case T_Q4_0: return 18;
    case T_Q5_0: return 22;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    default: return 0;
  }
}

/* a little-endian float16 at any byte address */
static inline float gq_half(const uint8_t *p) { return half_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* ---- activations ---- */
typedef struct {
  int8_t *q;   /* m x k */
  float *d;    /* m x k/32 (Q8_0) or m x k/256 (Q8_K) */
  int16_t *bs; /* m x k/16 (Q8_K) */
} gq_acts;

static void quantize_q8_0(const float *x, int64_t k, int8_t *q, float *d) {
  for (int64_t b = 0; b < k / 32; b++) {
    const float *v = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
    d[b] = half_to_f32(f32_to_half(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; j++) q[b * 32 + j] = (int8_t)lrintf(v[j] * id);
  }
}

static void quantize_q8_k(const float *x, int64_t k, int8_t *q, float *d, int16_t *bs) {
  for (int64_t b = 0; b < k / 256; b++) {
    const float *v = x + b * 256;
    int8_t *o = q + b * 256;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; j++)
      if (fabsf(v[j]) > amax) amax = fabsf(v[j]), max = v[j];
    if (amax == 0.0f) {
      d[b] = 0.0f;
      memset(o, 0, 256);
      memset(bs + b * 16, 0, 32);
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; j++) {
      const long r = lrintf(iscale * v[j]);
      o[j] = (int8_t)(r > 127 ? 127 : r);
    }
    for (int g = 0; g < 16; g++) {
      int s = 0;
      for (int j = 0; j < 16; j++) s += o[g * 16 + j];
      bs[b * 16 + g] = (int16_t)s;
    }
    d[b] = 1.0f / iscale;
  }
}

/* the 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block */
static inline void scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = s[j] & 63, *m = s[j + 4] & 63;
  } else {
    *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

typedef struct {
  int type;
  int64_t m, n, k;
  gq_acts a;
  const uint8_t *w;
  int64_t row_bytes;
  const float *bias;
  float *y;    /* m x n, rows ldy apart (a column block of a wider y: ex_ggml_gemm_multi) */
  int64_t ldy;
  int simd; /* 0 portable, 1 AVX2, 2 AVX-512 VNNI */
  /* prefill: the activations interleaved by lanes_group, or NULL: */
  const int8_t *lq;  /* [G][k / 32][t 8][row L][j 4] = q[L G + row][32b + 4t + j], L = 16 (VNNI) or 8 */
  const float *ld;   /* [G][blocks][row L] scales */
  const void *ls;    /* sums of the codes (lanes_group) */
  const uint8_t *xu; /* one row of Q8_0 x for VNNI: its codes + 128, or NULL */
  const int32_t *xoff; /* one row of x for Q4_0 / Q5_0: -o * the codes' sum per block, or NULL */
  _Atomic int64_t *next; /* the next chunk of rows to claim (over all the weights of a call) */
  int64_t per; /* rows per chunk */
  int64_t chunk0; /* the first chunk of this weight's rows, and the end of its chunks */
  int64_t chunk1;
} gq_ctx;

/* ---- portable: one row of W against one row of x ---- */
static float dot_generic(const gq_ctx *c, const uint8_t *w, int64_t i) {
  const int64_t k = c->k;
  const int8_t *xq = c->a.q + i * k;
  float sum = 0.0f;
  if (block_values(c->type) == 32) {
    const float *xd = c->a.d + i * (k / 32);
    const int64_t bb = block_bytes(c->type);
    for (int64_t b = 0; b < k / 32; b++, w += bb) {
      const int8_t *x = xq + b * 32;
      int32_t s = 0;
      if (c->type == T_Q8_0) {
        for (int j = 0; j < 32; j++) s += (int8_t)w[2 + j] * x[j];
      } else if (c->type == T_Q4_0) {
        for (int j = 0; j < 16; j++) s += ((w[2 + j] & 15) - 8) * x[j] + ((w[2 + j] >> 4) - 8) * x[j + 16];
      } else { /* Q5_0 */
        const uint32_t qh = (uint32_t)w[2] | (uint32_t)w[3] << 8 | (uint32_t)w[4] << 16 | (uint32_t)w[5] << 24;
        for (int j = 0; j < 16; j++) {
          const int lo = (w[6 + j] & 15) | (int)((qh >> j) & 1) << 4, hi = (w[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
          s += (lo - 16) * x[j] + (hi - 16) * x[j + 16];
        }
      }
      sum += (float)s * (gq_half(w) * xd[b]);
    }
    return sum;
  }
  const float *xd = c->a.d + i * (k / 256);
  const int16_t *bs = c->a.bs + i * (k / 16);
  for (int64_t b = 0; b < k / 256; b++, w += block_bytes(c->type)) {
    const int8_t *x = xq + b * 256;
    const int16_t *s16 = bs + b * 16;
    if (c->type == T_Q6_K) {
      const uint8_t *ql = w, *qh = w + 128;
      const int8_t *sc = (const int8_t *)(w + 192);
      int32_t sumi = 0;
      for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++) /* values 128h + 32t + l */
          for (int half = 0; half < 2; half++) {
            int32_t g = 0;
            for (int l = 16 * half; l < 16 * half + 16; l++) {
              const int lo = t & 1 ? ql[64 * h + 32 + l] : ql[64 * h + l];
              const int q = ((t < 2 ? lo & 15 : lo >> 4) | ((qh[32 * h + l] >> (2 * t)) & 3) << 4) - 32;
              g += q * x[128 * h + 32 * t + l];
            }
            sumi += sc[8 * h + 2 * t + half] * g;
          }
      sum += gq_half(w + 208) * xd[b] * (float)sumi;
      continue;
    }
    const uint8_t *qs = w + (c->type == T_Q5_K ? 48 : 16), *qh = w + 16;
    int32_t sumi = 0, summ = 0;
    for (int s = 0; s < 8; s++) { /* sub-block s: values 32s + l */
      uint8_t sc, m;
      scale_min_k4(s, w + 4, &sc, &m);
      int32_t g = 0;
      for (int l = 0; l < 32; l++) {
        int q = s & 1 ? qs[32 * (s / 2) + l] >> 4 : qs[32 * (s / 2) + l] & 15;
        if (c->type == T_Q5_K) q |= ((qh[l] >> s) & 1) << 4;
        g += q * x[32 * s + l];
      }
      sumi += sc * g;
      summ += m * (s16[2 * s] + s16[2 * s + 1]);
    }
    sum += gq_half(w) * xd[b] * (float)sumi - gq_half(w + 2) * xd[b] * (float)summ;
  }
  return sum;
}

static void rows_generic(const gq_ctx *c, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r++)
    for (int64_t i = 0; i < c->m; i++)
      c->y[i * c->ldy + r] = dot_generic(c, c->w + r * c->row_bytes, i) + (c->bias ? c->bias[r] : 0.0f);
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define GQ_VNNI 0
#define GQ(name) name##_avx2
#include "ggml_quant_simd.inc"
#undef GQ
#undef GQ_VNNI
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")
#define GQ_VNNI 1
#define GQ(name) name##_vnni
#include "ggml_quant_simd.inc"
#undef GQ
#undef GQ_VNNI
#pragma GCC pop_options
#endif

/* row i of the activations, quantized for the weight type (Q8_K for the K types, else Q8_0) */
static void quantize_row(int simd, int kt, const float *x, int64_t k, gq_acts *a, int64_t i) {
#if defined(__x86_64__)
  if (simd) {
    if (kt)
      (simd == 2 ? quantize_q8_k_vnni : quantize_q8_k_avx2)(x, k, a->q + i * k, a->d + i * (k / 256), a->bs + i * (k / 16));
    else
      (simd == 2 ? quantize_q8_0_vnni : quantize_q8_0_avx2)(x, k, a->q + i * k, a->d + i * (k / 32));
    return;
  }
#endif
  if (kt)
    quantize_q8_k(x, k, a->q + i * k, a->d + i * (k / 256), a->bs + i * (k / 16));
  else
    quantize_q8_0(x, k, a->q + i * k, a->d + i * (k / 32));
}

/* group G of the activations (rows L G .. L G + L - 1, those past m zero) interleaved for
 * rows_lanes: codes [G][b][t 8][row L][j 4]; scales [G][block][row]; for the 32-blocks the int32
 * sums of each block's codes [G][b][row], for the K types their two int16 bsums [G][b][row][2]. */
static void lanes_group(const gq_acts *a, int kt, int64_t m, int64_t k, int L, int64_t G, int8_t *lq, float *ld,
                        void *ls) {
  const int64_t nb = k / 32, nd = kt ? k / 256 : nb;
  for (int64_t b = 0; b < nb; b++) {
    int8_t *o = lq + (G * nb + b) * 32 * L;
    for (int r = 0; r < L; r++) {
      const int64_t i = L * G + r;
      int32_t s = 0;
      if (i < m) {
        const int8_t *src = a->q + i * k + 32 * b;
        for (int t = 0; t < 8; t++) memcpy(o + t * 4 * L + r * 4, src + 4 * t, 4);
        if (!kt) /* the K types take their bsums */
          for (int j = 0; j < 32; j++) s += src[j];
      } else {
        for (int t = 0; t < 8; t++) memset(o + t * 4 * L + r * 4, 0, 4);
      }
      if (kt) {
        int16_t *bs = (int16_t *)ls + ((G * nb + b) * L + r) * 2;
        bs[0] = i < m ? a->bs[i * (k / 16) + 2 * b] : 0;
        bs[1] = i < m ? a->bs[i * (k / 16) + 2 * b + 1] : 0;
      } else {
        ((int32_t *)ls)[(G * nb + b) * L + r] = s;
      }
    }
  }
  for (int64_t b = 0; b < nd; b++)
    for (int r = 0; r < L; r++) ld[(G * nd + b) * L + r] = L * G + r < m ? a->d[(L * G + r) * nd + b] : 0.0f;
}

/* preparing the activations on the pool: groups of L rows are quantized, then (c->lq) interleaved */
typedef struct {
  gq_ctx *c;
  const float *x;
  int L;
} gq_prep;

static void prep_task(void *ctx, int64_t g0, int64_t g1) {
  const gq_prep *p = ctx;
  gq_ctx *c = p->c;
  const int kt = block_values(c->type) == 256;
  for (int64_t G = g0; G < g1; G++) {
    const int64_t i1 = (G + 1) * p->L < c->m ? (G + 1) * p->L : c->m;
    for (int64_t i = G * p->L; i < i1; i++) quantize_row(c->simd, kt, p->x + i * c->k, c->k, &c->a, i);
    if (c->lq) lanes_group(&c->a, kt, c->m, c->k, p->L, G, (int8_t *)c->lq, (float *)c->ld, (void *)c->ls);
  }
}

/* rows [r0, r1) of y; wq, wd, yb: the scratch of rows_lanes (when c->lq) */
static void rows(const gq_ctx *c, int64_t r0, int64_t r1, uint8_t *wq, float *wd, float *yb) {
#if defined(__x86_64__)
  if (c->lq && wq && wd && yb) {
    (c->simd == 2 ? rows_lanes_vnni : rows_lanes_avx2)(c, r0, r1, wq, wd, yb);
    return;
  }
  if (c->m == 1 && c->xu) {
    rows_q8_0_m1_vnni(c, r0, r1, c->xu);
    return;
  }
  if (c->simd == 1 && c->type == T_Q8_0 && c->m == 1) {
    rows_q8_0_m1_avx2(c, r0, r1);
    return;
  }
  if (c->m == 1 && c->xoff) {
    (c->simd == 2 ? rows_q0u_m1_vnni : rows_q0u_m1_avx2)(c, r0, r1, c->xoff);
    return;
  }
  if (c->simd) {
    for (int64_t rb = r0; rb < r1; rb += GQ_RB) {
      const int64_t re = rb + GQ_RB < r1 ? rb + GQ_RB : r1;
      for (int64_t i0 = 0; i0 < c->m; i0 += GQ_MR) {
        const int mr = (int)(c->m - i0 < GQ_MR ? c->m - i0 : GQ_MR);
        for (int64_t r = rb; r < re; r++) {
          if (c->simd == 2)
            row_vnni(c, r, i0, mr);
          else
            row_avx2(c, r, i0, mr);
        }
      }
    }
    return;
  }
#endif
  (void)wq, (void)wd, (void)yb;
  rows_generic(c, r0, r1);
}

/* One per thread: claims chunks of c->per rows off a shared counter until none are left, so a
 * thread that is preempted or slow holds up the call by one small chunk at most.  ctx: the
 * weights of the call (gq_set), each owning a range of the chunks. */
typedef struct {
  const gq_ctx *c;
  int32_t count;
} gq_set;

static void task(void *ctx, int64_t t0, int64_t t1) {
  (void)t0, (void)t1;
  const gq_set *set = ctx;
  const gq_ctx *c0 = set->c;
  uint8_t *wq = NULL;
  float *wd = NULL, *yb = NULL;
  if (c0->lq) { /* no memory: the paths below rows_lanes need none */
    wq = malloc((size_t)(GQ_RB * c0->k));
    wd = malloc(sizeof(float) * (size_t)(GQ_RB * 3 * (c0->k / 32)));
    yb = malloc(sizeof(float) * (size_t)(c0->m * GQ_LDB));
  }
  for (int32_t j = 0;;) {
    const int64_t t = atomic_fetch_add_explicit(c0->next, 1, memory_order_relaxed);
    while (j < set->count && t >= set->c[j].chunk1) j++; /* chunks are claimed in increasing order */
    if (j == set->count) break;
    const gq_ctx *c = &set->c[j];
    const int64_t r0 = (t - c->chunk0) * c->per;
    rows(c, r0, r0 + c->per < c->n ? r0 + c->per : c->n, wq, wd, yb);
  }
  free(wq), free(wd), free(yb);
}

int64_t ex_ggml_row_bytes(int32_t type, int64_t k) {
  const int64_t bb = block_bytes(type);
  return bb && k > 0 && k % block_values(type) == 0 ? k / block_values(type) * bb : EX_EINVAL;
}

int ex_ggml_gemm_multi(int32_t type, int64_t m, int64_t k, const float *x, int32_t count, const int64_t *ns,
                       const void *const *ws, const float *const *biases, float *y) {
  if (ex_ggml_row_bytes(type, k) < 0 || m < 0 || count < 1 || count > GQ_MULTI_MAX) return EX_EINVAL;
  int64_t n = 0; /* all the weights' rows: y's row stride */
  for (int32_t j = 0; j < count; j++) {
    if (ns[j] < 0) return EX_EINVAL;
    n += ns[j];
  }
  if (m == 0 || n == 0) return EX_OK;
  const int kt = block_values(type) == 256;
  int simd = 0;
#if defined(__x86_64__)
  const int isa = ex_isa();
  simd = isa == EX_ISA_AVX512 && __builtin_cpu_supports("avx512vnni") ? 2 : isa != EX_ISA_GENERIC ? 1 : 0;
#endif
  /* prefill: activation rows in vector lanes (not for Q8_0 without VNNI: its unsigned codes
   * would overflow maddubs' int16 sums) */
  const int lanes = simd && m >= 8 && (simd == 2 || type != T_Q8_0);
  const int L = simd == 2 ? 16 : 8; /* rows of x per vector */
  const int64_t m8 = (m + L - 1) / L * L;
  gq_acts a;
  a.q = malloc((size_t)(m * k));
  a.d = malloc(sizeof(float) * (size_t)(m * k / (kt ? 256 : 32)));
  a.bs = kt ? malloc(sizeof(int16_t) * (size_t)(m * k / 16)) : NULL;
  int8_t *lq = lanes ? malloc((size_t)(m8 * k)) : NULL;
  float *ld = lanes ? malloc(sizeof(float) * (size_t)(2 * m8 * (k / 32))) : NULL;
  uint8_t *xu = simd == 2 && type == T_Q8_0 && m == 1 ? malloc((size_t)k) : NULL;
  int32_t *xoff = simd && (type == T_Q4_0 || type == T_Q5_0) && m == 1 ? calloc((size_t)(k / 32) * 8, sizeof(int32_t)) : NULL;
  if (!a.q || !a.d || (kt && !a.bs)) {
    free(a.q), free(a.d), free(a.bs), free(lq), free(ld), free(xu), free(xoff);
    return EX_ENOMEM;
  }
  gq_ctx c = {.type = type, .m = m, .n = n, .k = k, .a = a, .row_bytes = ex_ggml_row_bytes(type, k), .y = y,
              .ldy = n, .simd = simd};
  if (lq && ld) c.lq = lq, c.ld = ld, c.ls = ld + m8 * (k / 32); /* else the row kernels */
  /* the activations on the pool when there are several rows to quantize */
  gq_prep prep = {&c, x, L};
  const int64_t groups = (m + L - 1) / L;
  ex_parallel_for(groups, m * k >= 16384 ? 1 : groups, prep_task, &prep);
  /* one row of x: its per-call forms for the one-row kernels (the codes + 128 for vpdpbusd's
   * unsigned side; -o * the sum of each block's codes for Q4_0 / Q5_0) */
  if (xu) {
    for (int64_t j = 0; j < k; j++) xu[j] = (uint8_t)(a.q[j] + 128);
    c.xu = xu;
  }
  if (xoff) {
    const int off = type == T_Q5_0 ? 16 : 8;
    for (int64_t b = 0; b < k / 32; b++) {
      int32_t s = 0;
      for (int j = 0; j < 32; j++) s += a.q[32 * b + j];
      xoff[8 * b] = -off * s;
    }
    c.xoff = xoff;
  }
  /* Chunks of rows claimed dynamically: about 16 per thread (a preempted thread holds up the
   * others by one), each at least 128 KB of weights times the rows of x so that claiming one
   * costs little, but at least 4 per thread (balance); in whole tiles of GQ_RB rows, and for
   * prefill whole buffers of GQ_YB rows (a partial one goes out to y with the strided stores
   * the buffer avoids). */
  const int nt = ex_pool_width();
  int64_t per = n;
  if (nt > 1) {
    const int64_t lo = 131072 / (c.row_bytes * m), hi = (n + 4 * nt - 1) / (4 * nt), unit = c.lq ? GQ_YB : GQ_RB;
    per = (n + 16 * nt - 1) / (16 * nt);
    per = per < lo ? lo : per;
    per = per > hi ? hi : per;
    per = (per + unit - 1) / unit * unit;
  }
  /* the counter on a cache line of its own: claiming a chunk must not evict the line of c
   * that the other threads read */
  struct {
    _Alignas(64) _Atomic int64_t v;
    char pad[56];
  } next = {0};
  c.next = &next.v, c.per = per;
  gq_ctx cs[GQ_MULTI_MAX];
  int64_t col = 0, chunks = 0;
  for (int32_t j = 0; j < count; j++) {
    cs[j] = c;
    cs[j].n = ns[j], cs[j].w = ws[j], cs[j].bias = biases ? biases[j] : NULL, cs[j].y = y + col;
    cs[j].chunk0 = chunks, chunks += (ns[j] + per - 1) / per, cs[j].chunk1 = chunks;
    col += ns[j];
  }
  gq_set set = {cs, count};
  ex_parallel_for(nt > 1 ? nt : 1, 1, task, &set);
  free(a.q), free(a.d), free(a.bs), free(lq), free(ld), free(xu), free(xoff);
  return EX_OK;
}

int ex_ggml_gemm(int32_t type, int64_t m, int64_t n, int64_t k, const float *x, const void *w, const float *bias,
                 float *y) {
  return ex_ggml_gemm_multi(type, m, k, x, 1, &n, &w, bias ? &bias : NULL, y);
}
