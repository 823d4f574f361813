/* Direct depthwise convolution (one channel per group, NCHW float32) for 3x3 and 5x5 kernels,
 * stride 1 or 2, dilation 1, any padding: conv_depthwise (conv.c) calls dwd_run for those and
 * keeps its padded-plane loop for everything else; the reference is the same definition.
 *
 * Outputs are computed DWD_VL at a time along a row with the kernel's weights held in
 * registers: each tap is one unaligned load of an input row (stride 2: two loads split into even
 * and odd columns), so nothing is copied or padded.  Stride 1 computes two output rows per pass
 * (K + 1 input rows, each load feeding two FMAs), stride 2 too (K + 2 rows, the shared one
 * loaded and split once).  Column chunks that read only inside the rows
 * run in a tight loop, rows outer; chunks over the left/right padding or the row's tail use
 * masked loads (zero outside the row, masks computed once per chunk), and taps on the rows of
 * the top/bottom padding are skipped.  Bias starts the sum; the residual and ReLU/ReLU6 are
 * applied in registers before the store (other activations over the finished row).  Threads
 * claim whole planes, or strips of rows of large planes, as they go; small layers stay on the
 * calling thread.  On AVX-512, outputs of at most 8 x 8 are computed across 16 channels at a time
 * instead (dws_task).  conv_pwdw (conv.c) runs it on bands of rows of the expanded tensor it holds in
 * a buffer: the input plane stride and the rows present are fields of dwd_ctx. */
#include <stdatomic.h>

#ifdef EX_AVX512
typedef float dwd_v __attribute__((vector_size(64)));
#define DWD_VL 16
#elif defined(EX_AVX2)
typedef float dwd_v __attribute__((vector_size(32)));
#define DWD_VL 8
#else
typedef float dwd_v __attribute__((vector_size(16)));
#define DWD_VL 4
#endif
#define DWD_MAXK 5
#define DWD_INLINE static inline __attribute__((always_inline))

DWD_INLINE dwd_v dwd_ld(const float *p) { dwd_v v; memcpy(&v, p, sizeof v); return v; }
DWD_INLINE void dwd_st(float *p, dwd_v v) { memcpy(p, &v, sizeof v); }

/* A lane mask (dwd_m) and the masked load / store: the masked-out lanes' addresses are never
 * read or written (the hardware suppresses their faults), so a masked load may start before
 * or run past the row. */
#ifdef EX_AVX512
typedef __mmask16 dwd_m;
DWD_INLINE dwd_m dwd_mask(int64_t lo, int64_t hi) { /* lanes [lo, hi) */
  lo = EX_MAX(lo, 0);
  hi = EX_MIN(hi, DWD_VL);
  return lo < hi ? (dwd_m)((0xffffu >> (16 - (hi - lo))) << lo) : 0;
}
DWD_INLINE dwd_v dwd_ldk(const float *p, dwd_m m) { return _mm512_maskz_loadu_ps(m, p); }
DWD_INLINE void dwd_stk(float *p, dwd_v v, dwd_m m) { _mm512_mask_storeu_ps(p, m, v); }
#elif defined(EX_AVX2)
typedef __m256i dwd_m;
DWD_INLINE dwd_m dwd_mask(int64_t lo, int64_t hi) {
  lo = EX_MAX(EX_MIN(lo, DWD_VL), 0);
  hi = EX_MAX(EX_MIN(hi, DWD_VL), 0);
  const __m256i l = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)lo), l),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi), l));
}
DWD_INLINE dwd_v dwd_ldk(const float *p, dwd_m m) { return _mm256_maskload_ps(p, m); }
DWD_INLINE void dwd_stk(float *p, dwd_v v, dwd_m m) { _mm256_maskstore_ps(p, m, v); }
#else
typedef unsigned dwd_m; /* lane bits */
DWD_INLINE dwd_m dwd_mask(int64_t lo, int64_t hi) {
  dwd_m m = 0;
  for (int64_t l = EX_MAX(lo, 0); l < EX_MIN(hi, DWD_VL); l++) m |= 1u << l;
  return m;
}
DWD_INLINE dwd_v dwd_ldk(const float *p, dwd_m m) {
  static const float zero = 0.0f;
  dwd_v v;
  for (int l = 0; l < DWD_VL; l++) v[l] = *(m >> l & 1 ? p + l : &zero); /* no branch */
  return v;
}
DWD_INLINE void dwd_stk(float *p, dwd_v v, dwd_m m) {
  for (int l = 0; l < DWD_VL; l++)
    if (m >> l & 1) p[l] = v[l];
}
#endif

DWD_INLINE dwd_v dwd_fma(dwd_v a, dwd_v b, dwd_v c) {
#ifdef EX_AVX512
  return _mm512_fmadd_ps(a, b, c);
#elif defined(EX_AVX2)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

/* the even- and odd-indexed elements of the 2 DWD_VL values a, b */
DWD_INLINE void dwd_split(dwd_v a, dwd_v b, dwd_v *ev, dwd_v *od) {
#ifdef EX_AVX512
  split512(a, b, ev, od);
#elif defined(EX_AVX2)
  split256(a, b, ev, od);
#else
  *ev = (dwd_v){a[0], a[2], b[0], b[2]};
  *od = (dwd_v){a[1], a[3], b[1], b[3]};
#endif
}

/* ReLU (6: ReLU6) as act_row does it: NaN passes through */
DWD_INLINE dwd_v dwd_clamp(dwd_v v, int six) {
#ifdef EX_AVX512
  v = _mm512_max_ps(_mm512_setzero_ps(), v);
  if (six) v = _mm512_min_ps(_mm512_set1_ps(6.0f), v);
  return v;
#elif defined(EX_AVX2)
  v = _mm256_max_ps(_mm256_setzero_ps(), v);
  if (six) v = _mm256_min_ps(_mm256_set1_ps(6.0f), v);
  return v;
#else /* lane selects by comparison masks: a branch per lane mispredicts on real data */
  typedef int32_t dwd_vi __attribute__((vector_size(sizeof(dwd_v))));
  v = (dwd_v)((dwd_vi)v & ~(v < (dwd_v){0}));
  if (six) {
    const dwd_vi hi = v > ((dwd_v){0} + 6.0f);
    v = (dwd_v)(((dwd_vi)v & ~hi) | ((dwd_vi)((dwd_v){0} + 6.0f) & hi));
  }
  return v;
#endif
}

/* bias + sum over taps of w[i][j] * row i at column c0 + S * lane + j, for the rows that exist
 * (rp[i] points at column c0 of row i, or is NULL: a padding row).  m: NULL when every column
 * read is inside the row, else the masks of the loads at offsets 0..K-1 and DWD_VL..DWD_VL+K-1
 * (the columns inside it). */
DWD_INLINE dwd_v dwd_chunk(const float *const *rp, const dwd_v *wv, dwd_v bias, const dwd_m *m,
                           const int K, const int S) {
  dwd_v acc[DWD_MAXK];
  for (int i = 0; i < K; i++) acc[i] = (dwd_v){0};
  acc[0] = bias;
#define DWD_LD(r, o) (m ? dwd_ldk((r) + (o), m[(o) < K ? (o) : K + (o) - DWD_VL]) : dwd_ld((r) + (o)))
#pragma GCC unroll 5
  for (int i = 0; i < K; i++) { /* one accumulator per kernel row: independent FMA chains */
    const float *r = rp[i];
    if (!r) continue;
    if (S == 1) {
#pragma GCC unroll 5
      for (int j = 0; j < K; j++) acc[i] = dwd_fma(wv[i * K + j], DWD_LD(r, j), acc[i]);
    } else {
#pragma GCC unroll 3
      for (int j = 0; j < K; j += 2) {
        dwd_v ev, od;
        dwd_split(DWD_LD(r, j), DWD_LD(r, j + DWD_VL), &ev, &od);
        acc[i] = dwd_fma(wv[i * K + j], ev, acc[i]);
        if (j + 1 < K) acc[i] = dwd_fma(wv[i * K + j + 1], od, acc[i]);
      }
    }
  }
#undef DWD_LD
  for (int i = 1; i < K; i++) acc[0] += acc[i];
  return acc[0];
}

/* stride 1, two output rows at once: rp[0..K] are K + 1 input rows; row r feeds the first
 * output row with kernel row r and the second with kernel row r - 1, so each load serves two
 * FMAs.  Two accumulators per output row keep the FMA chains independent. */
DWD_INLINE void dwd_chunk2(const float *const *rp, const dwd_v *wv, dwd_v bias, const dwd_m *m,
                           const int K, dwd_v *out0, dwd_v *out1) {
  dwd_v a[2] = {bias, (dwd_v){0}}, b[2] = {bias, (dwd_v){0}};
#pragma GCC unroll 6
  for (int r = 0; r <= K; r++) {
    const float *x = rp[r];
    if (!x) continue;
#pragma GCC unroll 5
    for (int j = 0; j < K; j++) {
      const dwd_v v = m ? dwd_ldk(x + j, m[j]) : dwd_ld(x + j);
      if (r < K) a[r & 1] = dwd_fma(wv[r * K + j], v, a[r & 1]);
      if (r > 0) b[r & 1] = dwd_fma(wv[(r - 1) * K + j], v, b[r & 1]);
    }
  }
  *out0 = a[0] + a[1];
  *out1 = b[0] + b[1];
}

/* stride 2, two output rows at once: rp[0..K+1] are K + 2 input rows; row r feeds the first
 * output row with kernel row r and the second with kernel row r - 2, so the shared row is loaded
 * and split once, and the two rows' FMA chains interleave (m: as dwd_chunk's) */
DWD_INLINE void dwd_chunk2s(const float *const *rp, const dwd_v *wv, dwd_v bias, const dwd_m *m, const int K,
                            dwd_v *out0, dwd_v *out1) {
  dwd_v a[2] = {bias, (dwd_v){0}}, b[2] = {bias, (dwd_v){0}};
#pragma GCC unroll 7
  for (int r = 0; r < K + 2; r++) {
    const float *x = rp[r];
    if (!x) continue;
#pragma GCC unroll 3
    for (int j = 0; j < K; j += 2) {
      dwd_v ev, od;
      if (m) dwd_split(dwd_ldk(x + j, m[j]), dwd_ldk(x + j + DWD_VL, m[K + j]), &ev, &od);
      else dwd_split(dwd_ld(x + j), dwd_ld(x + j + DWD_VL), &ev, &od);
      if (r < K) {
        a[r & 1] = dwd_fma(wv[r * K + j], ev, a[r & 1]);
        if (j + 1 < K) a[r & 1] = dwd_fma(wv[r * K + j + 1], od, a[r & 1]);
      }
      if (r >= 2) {
        b[r & 1] = dwd_fma(wv[(r - 2) * K + j], ev, b[r & 1]);
        if (j + 1 < K) b[r & 1] = dwd_fma(wv[(r - 2) * K + j + 1], od, b[r & 1]);
      }
    }
  }
  *out0 = a[0] + a[1];
  *out1 = b[0] + b[1];
}

/* two output rows at once from K + S input rows (S, 1 or 2, a constant in each instance) */
DWD_INLINE void dwd_pair(const float *const *rp, const dwd_v *wv, dwd_v bias, const dwd_m *m, const int K,
                         const int S, dwd_v *out0, dwd_v *out1) {
  if (S == 1)
    dwd_chunk2(rp, wv, bias, m, K, out0, out1);
  else
    dwd_chunk2s(rp, wv, bias, m, K, out0, out1);
}

/* residual, ReLU/ReLU6, then the store of the first n lanes (sm: their mask) */
DWD_INLINE void dwd_out(float *y, const float *r, dwd_v acc, int64_t n, dwd_m sm, int clamp,
                        int six) {
  if (n == DWD_VL) {
    if (r) acc += dwd_ld(r);
    if (clamp) acc = dwd_clamp(acc, six);
    dwd_st(y, acc);
  } else {
    if (r) acc += dwd_ldk(r, sm);
    if (clamp) acc = dwd_clamp(acc, six);
    dwd_stk(y, acc, sm);
  }
}

typedef struct {
  const ex_conv_params *p;
  const float *x, *w, *bias, *res;
  float *y;
  int64_t nstrip, rows; /* strips per plane, output rows per strip */
  int64_t units, claim; /* plane strips in all, taken `claim` at a time */
  int64_t oyb, oye;     /* the output rows of each plane computed: [oyb, oye) */
  /* input planes xplane floats apart holding rows [ia, ib) of the h (row ia first); the rest
   * reads as padding: a band of rows (conv_pwdw) or, normally, the whole plane */
  int64_t xplane, ia, ib;
  _Atomic int64_t next; /* the next unclaimed strip */
  _Atomic int err;      /* EX_ENOMEM from a task that found no buffer (dws_blocks) */
  void (*fn)(void *, int64_t, int64_t); /* the task for this kernel size and stride */
} dwd_ctx;

/* input rows oy * S - ph + i, i in [0, nr), of plane xq, offset by column c (NULL: padding) */
DWD_INLINE void dwd_row_ptrs(const dwd_ctx *g, const float *xq, int64_t oy, int64_t c, int nr,
                             const int S, const float **rp) {
  for (int i = 0; i < nr; i++) {
    const int64_t iy = oy * S - g->p->ph + i;
    rp[i] = iy >= g->ia && iy < g->ib ? xq + (iy - g->ia) * g->p->w + c : NULL;
  }
}

/* prefetch the input rows [r0, r0 + nr) of plane xq that exist */
DWD_INLINE void dwd_prefetch(const dwd_ctx *g, const float *xq, int64_t r0, int nr) {
  const int64_t w = g->p->w;
  for (int64_t r = EX_MAX(r0, g->ia); r < EX_MIN(r0 + nr, g->ib); r++)
    for (int64_t c = 0; c < w; c += 16) __builtin_prefetch(xq + (r - g->ia) * w + c, 0, 3);
}

/* output rows [oy0, oy1) of plane q.  The column chunks that read only inside the rows run
 * rows outer, chunks inner (nothing but loads, FMAs and stores); the edge chunks run one chunk
 * at a time down the rows, with their load masks computed once. */

DWD_INLINE void dwd_rows(const dwd_ctx *g, int64_t q, int64_t oy0, int64_t oy1, const int K,
                         const int S) {
  const ex_conv_params *p = g->p;
  const int64_t ch = q % p->c, w = p->w, ow = p->ow, pw = p->pw, span = S * DWD_VL + K - 1;
  const float *xq = g->x + q * g->xplane, *wc = g->w + ch * K * K;
  float *const y = g->y + q * p->oh * ow;
  const float *const res = g->res ? g->res + q * p->oh * ow : NULL;
  dwd_v wv[DWD_MAXK * DWD_MAXK];
  for (int t = 0; t < K * K; t++) wv[t] = (dwd_v){0} + wc[t];
  const dwd_v bv = (dwd_v){0} + (g->bias ? g->bias[ch] : 0.0f);
  const int clamp = p->act == EX_ACT_RELU || p->act == EX_ACT_RELU6, six = p->act == EX_ACT_RELU6;
  const dwd_m full = dwd_mask(0, DWD_VL);
  /* fast chunks: [xa, xb) */
  int64_t xa = 0, xb;
  while (xa < ow && xa * S - pw < 0) xa += DWD_VL;
  for (xb = xa; xb + DWD_VL <= ow && xb * S - pw + span <= w;) xb += DWD_VL;
  if (xb > xa) {
    int64_t oy = oy0;
    for (; oy + 2 <= oy1; oy += 2) {
      const float *rp[DWD_MAXK + 2], *r[DWD_MAXK + 2];
      dwd_row_ptrs(g, xq, oy, -pw, K + S, S, rp);
      /* stride 2 streams through twice the input per output: fetch two output rows ahead */
      if (S == 2) dwd_prefetch(g, xq, oy * S - p->ph + K + 2 * S, 2 * S);
      float *y0 = y + oy * ow, *y1 = y0 + ow;
      const float *r0 = res ? res + oy * ow : NULL, *r1 = res ? r0 + ow : NULL;
      for (int64_t ox = xa; ox < xb; ox += DWD_VL) {
        for (int i = 0; i < K + S; i++) r[i] = rp[i] ? rp[i] + ox * S : NULL;
        dwd_v a0, a1;
        dwd_pair(r, wv, bv, NULL, K, S, &a0, &a1);
        dwd_out(y0 + ox, r0 ? r0 + ox : NULL, a0, DWD_VL, full, clamp, six);
        dwd_out(y1 + ox, r1 ? r1 + ox : NULL, a1, DWD_VL, full, clamp, six);
      }
    }
    for (; oy < oy1; oy++) {
      const float *rp[DWD_MAXK], *r[DWD_MAXK];
      dwd_row_ptrs(g, xq, oy, -pw, K, S, rp);
      /* stride 2 streams through twice the input per output: fetch two output rows ahead */
      if (S == 2) dwd_prefetch(g, xq, oy * S - p->ph + K + S, S);
      float *y0 = y + oy * ow;
      const float *r0 = res ? res + oy * ow : NULL;
      for (int64_t ox = xa; ox < xb; ox += DWD_VL) {
        for (int i = 0; i < K; i++) r[i] = rp[i] ? rp[i] + ox * S : NULL;
        const dwd_v a0 = dwd_chunk(r, wv, bv, NULL, K, S);
        dwd_out(y0 + ox, r0 ? r0 + ox : NULL, a0, DWD_VL, full, clamp, six);
      }
    }
  }
  for (int64_t ox = 0; ox < ow; ox += DWD_VL) {
    if (ox == xa && xb > xa) ox = xb;
    if (ox >= ow) break;
    const int64_t n = EX_MIN(DWD_VL, ow - ox), c0 = ox * S - pw;
    const dwd_m sm = dwd_mask(0, n);
    dwd_m m[2 * DWD_MAXK];
    for (int o = 0; o < K; o++) {
      m[o] = dwd_mask(-(c0 + o), w - (c0 + o));
      m[K + o] = dwd_mask(-(c0 + o + DWD_VL), w - (c0 + o + DWD_VL));
    }
    int64_t oy = oy0;
    for (; oy + 2 <= oy1; oy += 2) {
      const float *rp[DWD_MAXK + 2];
      dwd_row_ptrs(g, xq, oy, c0, K + S, S, rp);
      const int64_t yo = oy * ow + ox;
      dwd_v a0, a1;
      dwd_pair(rp, wv, bv, m, K, S, &a0, &a1);
      dwd_out(y + yo, res ? res + yo : NULL, a0, n, sm, clamp, six);
      dwd_out(y + yo + ow, res ? res + yo + ow : NULL, a1, n, sm, clamp, six);
    }
    for (; oy < oy1; oy++) {
      const float *rp[DWD_MAXK];
      dwd_row_ptrs(g, xq, oy, c0, K, S, rp);
      const int64_t yo = oy * ow + ox;
      dwd_out(y + yo, res ? res + yo : NULL, dwd_chunk(rp, wv, bv, m, K, S), n, sm, clamp, six);
    }
  }
  if (!clamp && p->act != EX_ACT_NONE)
    for (int64_t oy = oy0; oy < oy1; oy++) act_row(p->act, y + oy * ow, ow);
}

/* Strips [u0, u1) of the plane/strip sequence; a pool task (u1 < 0) instead claims `claim`
 * strips at a time from g->next until none are left, so a thread the system preempts holds up
 * at most the strips it has claimed, while the others take the rest. */
#define DWD_TASK(K, S)                                                                 \
  static void dwd_task_##K##S(void *vctx, int64_t u0, int64_t u1) {                    \
    dwd_ctx *g = vctx;                                                                 \
    const int pool = u1 < 0;                                                           \
    for (;;) {                                                                         \
      if (pool) {                                                                      \
        u0 = atomic_fetch_add(&g->next, g->claim);                                     \
        if (u0 >= g->units) return;                                                    \
        u1 = EX_MIN(u0 + g->claim, g->units);                                          \
      }                                                                                \
      for (int64_t u = u0; u < u1; u++) {                                              \
        const int64_t oy0 = g->oyb + u % g->nstrip * g->rows;                          \
        dwd_rows(g, u / g->nstrip, oy0, EX_MIN(oy0 + g->rows, g->oye), K, S);          \
      }                                                                                \
      if (!pool) return;                                                               \
    }                                                                                  \
  }
DWD_TASK(3, 1)
DWD_TASK(3, 2)
DWD_TASK(5, 1)
DWD_TASK(5, 2)
#undef DWD_TASK

/* the pool's entry: every thread claims strips (see DWD_TASK) */
static void dwd_pool_task(void *vctx, int64_t t0, int64_t t1) { ((dwd_ctx *)vctx)->fn(vctx, 0, -1); }

/* the task for p's kernel size and stride (dwd_ok) */
static void (*dwd_fn(const ex_conv_params *p))(void *, int64_t, int64_t) {
  return p->kh == 3 ? (p->sh == 1 ? dwd_task_31 : dwd_task_32) : (p->sh == 1 ? dwd_task_51 : dwd_task_52);
}

static int dwd_ok(const ex_conv_params *p) {
  return p->kh == p->kw && (p->kh == 3 || p->kh == 5) && p->sh == p->sw && p->sh <= 2 &&
         p->dh == 1 && p->dw == 1;
}

#ifdef EX_AVX2
/* Small planes (output at most DWS_MAX x DWS_MAX: MobileNetV2's 28 x 28 to 7 x 7 layers) leave
 * lanes of a row-wise vector idle and take many loads and stores under a mask.  Here
 * DWD_VL planes at a time are transposed (DWD_VL x DWD_VL blocks in registers) into a
 * zero-padded [row][column][DWD_VL planes] block, so that every tap of every output is one
 * aligned vector of the planes times a vector of their weights; the outputs, [position][DWD_VL],
 * are transposed back with the residual and ReLU/ReLU6 applied before the store.  AVX-512, 960
 * channels at 7 x 7: 54 -> 16 us.  AVX2 (8 planes, up to 28 x 28; on Zen 3 a masked store is
 * slow), at one thread in the network: 192 at 28 x 28 206 -> 170 us, 384 at 14 x 14 140 -> 93,
 * 960 at 7 x 7 132 -> 77. */
#ifdef EX_AVX512
#define DWS_MAX 8
#define dws_tr tr16
#else
#define DWS_MAX 28
#define dws_tr tr8
#endif
#define DWS_PAD ((DWS_MAX - 1) * 2 + DWD_MAXK) /* padded rows / columns at most */
/* one output position of the planes (tw: its window's first tap in t, rows PW positions apart)
 * and, with `two`, the same position in the next output row: input row i feeds the first with
 * kernel row i and the second with row i - S, so a tap is loaded once for both (stride 1: 12 loads
 * for 18 FMAs at 3 x 3, not 18).  Two chains an output, rows alternating, for the FMA latency */
DWD_INLINE void dws_out(const float *tw, int64_t PW, const dwd_v *wv, dwd_v bv, const int K, const int S,
                        const int two, float *out0, float *out1) {
  const int rows = two ? K + S : K; /* input rows read */
  dwd_v a0 = bv, a1 = {0}, b0 = bv, b1 = {0};
#pragma GCC unroll 7
  for (int i = 0; i < rows; i++)
#pragma GCC unroll 5
    for (int j = 0; j < K; j++) {
      const dwd_v v = dwd_ld(tw + (i * PW + j) * DWD_VL);
      if (i < K) {
        if (i & 1) a1 = dwd_fma(wv[i * K + j], v, a1);
        else a0 = dwd_fma(wv[i * K + j], v, a0);
      }
      if (two && i >= S) {
        if ((i - S) & 1) b1 = dwd_fma(wv[(i - S) * K + j], v, b1);
        else b0 = dwd_fma(wv[(i - S) * K + j], v, b0);
      }
    }
  dwd_st(out0, a0 + a1);
  if (two) dwd_st(out1, b0 + b1);
}
DWD_INLINE void dws_blocks(dwd_ctx *g, int64_t b0, int64_t b1, const int K, const int S) {
  enum { L = DWD_VL };
  const ex_conv_params *p = g->p;
  const int64_t planes = p->n * p->c, HW = p->h * p->w, OHW = p->oh * p->ow;
  const int64_t PH = (p->oh - 1) * S + K, PW = (p->ow - 1) * S + K;
  const int clamp = p->act == EX_ACT_RELU || p->act == EX_ACT_RELU6, six = p->act == EX_ACT_RELU6;
  /* t and o (about 140 KB with AVX2) per thread, kept between calls: not on the stack of a thread
   * that may have a small one */
  static _Thread_local float *tl_buf;
  if (!tl_buf && !(tl_buf = aligned_alloc(64, (DWS_PAD * DWS_PAD + DWS_MAX * DWS_MAX) * L * sizeof(float)))) {
    atomic_store(&g->err, EX_ENOMEM);
    return;
  }
  float *const t = tl_buf, *const o = tl_buf + DWS_PAD * DWS_PAD * L;
  int32_t toff[DWS_PAD * DWS_PAD]; /* input position -> its offset in t, or -1: never read */
  memset(t, 0, (size_t)(PH * PW * L) * sizeof(float));
  for (int64_t j = 0; j < HW; j++) {
    const int64_t ty = j / p->w + p->ph, tx = j % p->w + p->pw;
    toff[j] = ty < PH && tx < PW ? (int32_t)((ty * PW + tx) * L) : -1;
  }
  for (int64_t bk = b0; bk < b1; bk++) {
    const int64_t q0 = bk * L, nq = EX_MIN(L, planes - q0);
    dwd_v wv[DWD_MAXK * DWD_MAXK], bv;
    float wt[DWD_MAXK * DWD_MAXK][L], lane[L];
    memset(wt, 0, sizeof wt);
    memset(lane, 0, sizeof lane);
    for (int64_t l = 0, ch = q0 % p->c; l < nq; l++, ch = ch + 1 == p->c ? 0 : ch + 1) {
      for (int k = 0; k < K * K; k++) wt[k][l] = g->w[ch * K * K + k];
      lane[l] = g->bias ? g->bias[ch] : 0.0f;
    }
    for (int k = 0; k < K * K; k++) wv[k] = dwd_ld(wt[k]);
    bv = dwd_ld(lane);
    /* in: input position j of the planes to (iy + ph, ix + pw) of t, where the taps read */
    for (int64_t j0 = 0; j0 < HW; j0 += L) {
      const dwd_m mj = dwd_mask(0, HW - j0);
      dwd_v r[L];
      for (int l = 0; l < L; l++) { /* whole vectors unmasked: an AVX2 masked load or store is slower */
        const float *xl = g->x + (q0 + l) * HW + j0;
        r[l] = l >= nq ? (dwd_v){0} : j0 + L <= HW ? dwd_ld(xl) : dwd_ldk(xl, mj);
      }
      dws_tr(r);
      for (int64_t j = j0; j < EX_MIN(HW, j0 + L); j++)
        if (toff[j] >= 0) dwd_st(t + toff[j], r[j - j0]);
    }
    const int64_t OH = p->oh, OW = p->ow;
    int64_t oy = 0;
    for (; oy + 2 <= OH; oy += 2) /* two output rows a pass: each loaded tap serves both */
      for (int64_t ox = 0; ox < OW; ox++) {
        float *o0 = o + (oy * OW + ox) * L;
        dws_out(t + (oy * S * PW + ox * S) * L, PW, wv, bv, K, S, 1, o0, o0 + OW * L);
      }
    for (; oy < OH; oy++)
      for (int64_t ox = 0; ox < OW; ox++)
        dws_out(t + (oy * S * PW + ox * S) * L, PW, wv, bv, K, S, 0, o + (oy * OW + ox) * L, NULL);
    /* out: position blocks of L transposed back to the planes */
    for (int64_t j0 = 0; j0 < OHW; j0 += L) {
      const int64_t nj = EX_MIN(L, OHW - j0);
      const dwd_m mj = dwd_mask(0, nj);
      dwd_v r[L];
      for (int l = 0; l < L; l++) r[l] = l < nj ? dwd_ld(o + (j0 + l) * L) : (dwd_v){0};
      dws_tr(r);
      for (int64_t l = 0; l < nq; l++) {
        float *y = g->y + (q0 + l) * OHW + j0;
        dwd_v v = r[l];
        dwd_out(y, g->res ? g->res + (q0 + l) * OHW + j0 : NULL, v, nj, mj, clamp, six);
      }
    }
    if (!clamp && p->act != EX_ACT_NONE)
      for (int64_t l = 0; l < nq; l++) act_row(p->act, g->y + (q0 + l) * OHW, OHW);
  }
}

/* one instance per kernel size and stride: the tap loops unrolled, the weights in registers (with
 * a run-time K they stayed on the stack, a loop counter between FMAs: 960 channels at 7 x 7
 * 39 -> 29 us, 576 at 14 -> 7 stride 2 37 -> 29 us) */
static void dws_task(void *vctx, int64_t b0, int64_t b1) {
  dwd_ctx *g = vctx;
  if (g->p->kh == 3) {
    if (g->p->sh == 1) dws_blocks(g, b0, b1, 3, 1);
    else dws_blocks(g, b0, b1, 3, 2);
  } else {
    if (g->p->sh == 1) dws_blocks(g, b0, b1, 5, 1);
    else dws_blocks(g, b0, b1, 5, 2);
  }
}
#endif

/* Work below DWD_SERIAL multiply-adds stays on the calling thread: waking the pool and sharing
 * the caches costs more than it saves.  Above it, threads claim about DWD_GRAIN multiply-adds
 * at a time: whole planes, or strips of (an even number of) rows where the planes are large and
 * too few (under 8 a thread) to balance.  Each claim is an atomic add on a line both cores
 * write: on the 2-core Intel guest, claims of 16K multiply-adds (two 28 x 28 planes) left
 * 192 channels at 28 x 28 no faster at two threads than at one (55 - 58 us in a chain of three),
 * claims of 64K 38 - 45 us; MobileNetV2's depthwise layers 0.52 -> 0.45 ms at two threads. */
#define DWD_SERIAL 200000
#define DWD_GRAIN 65536

/* Rows of at most 8 outputs fill under half of a 16-lane vector: the AVX-512 variant runs small
 * planes by dws_task and hands taller ones to the AVX2 variant's kernel (8 lanes, the same CPU),
 * which is about a quarter faster there. */
int ex_depthwise_avx2(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                      const float *res, float *y);

static int dwd_run(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                   const float *res, float *y) {
  const int64_t planes = p->n * p->c, per_row = p->ow * p->kh * p->kw;
  const int64_t total = planes * p->oh * per_row, nt = ex_pool_width();
#ifdef EX_AVX2
  if (p->oh <= DWS_MAX && p->ow <= DWS_MAX && p->h <= DWS_PAD && p->w <= DWS_PAD) {
    dwd_ctx g = {.p = p, .x = x, .w = w, .bias = bias, .res = res, .y = y};
    const int64_t nb = (planes + DWD_VL - 1) / DWD_VL;
    if (nt == 1 || total < DWD_SERIAL) dws_task(&g, 0, nb);
    else ex_parallel_for(nb, EX_MAX(1, DWD_GRAIN / EX_MAX(DWD_VL * p->oh * per_row, 1)), dws_task, &g);
    return g.err;
  }
#endif
#ifdef EX_AVX512
  if (p->ow <= 8) return ex_depthwise_avx2(p, x, w, bias, res, y);
#endif
  void (*fn)(void *, int64_t, int64_t) = dwd_fn(p);
  dwd_ctx g = {.p = p, .x = x, .w = w, .bias = bias, .res = res, .y = y, .nstrip = 1, .rows = p->oh,
               .units = planes, .claim = 1, .fn = fn, .oyb = 0, .oye = p->oh, .xplane = p->h * p->w,
               .ia = 0, .ib = p->h};
  if (nt == 1 || total < DWD_SERIAL) {
    fn(&g, 0, planes);
    return EX_OK;
  }
  /* large planes, too few to share by whole planes: strips of rows (with 32 planes of 112 x 112 at
   * two threads, strips of 16 rows claimed in turn ran 0.12 - 0.15 ms, whole planes 0.09) */
  if (p->oh * per_row > 2 * DWD_GRAIN && planes < 8 * nt) {
    g.rows = EX_MIN(p->oh, ROUND_UP(EX_MAX(1, DWD_GRAIN / EX_MAX(per_row, 1)), 2));
    g.nstrip = (p->oh + g.rows - 1) / g.rows;
    g.units = planes * g.nstrip;
  } else {
    g.claim = EX_MAX(1, DWD_GRAIN / EX_MAX(p->oh * per_row, 1));
  }
  ex_parallel_for(nt, 1, dwd_pool_task, &g);
  return EX_OK;
}

#if defined(EX_AVX2) && !defined(EX_AVX512)
int ex_depthwise_avx2(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                      const float *res, float *y) {
  return dwd_run(p, x, w, bias, res, y);
}
#endif
