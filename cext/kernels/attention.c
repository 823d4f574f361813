/* ex_attention: fused scaled-dot-product attention, softmax(q k^T * scale + mask) v.
 * Reference: the definition with max-subtracted softmax.  Optimized: flash-style streaming, so no
 * [Lq, Lk] matrix is stored: a block of BQ rows walks the keys in blocks of bk, keeping a running
 * max, sum and output row per row and rescaling them when the max grows.  Rows are (query, head)
 * pairs of one KV head, so the heads of a GQA group (hq / hk of them) share every K/V load.
 * Causal (PyTorch's top-left alignment: key j is visible to query i when j <= i) stops the walk at
 * the diagonal.
 * Many rows per KV head (prefill, vision): K and V are first packed once per call, K transposed
 * into [D][bk] panels and V into rows padded to whole vectors, so that every query block reads
 * them with aligned vector loads.  Then, per group of AT_MR rows and key block, a register-blocked
 * micro-kernel computes the scaled scores (AT_MR rows x up to AT_SC_NV vectors of keys), one
 * vectorized pass per row does mask/causal/max and exp+sum, and a second micro-kernel adds P @ V
 * (AT_MR rows x up to AT_PV_NV vectors of columns) into the output rows.  Vectors are 16 floats
 * wide in the AVX-512 build, 8 in the AVX2 one, 4 in the generic one.
 * Few rows (decode): K read in place, no packing (it would cost as much as the attention itself);
 * the scores of AT_W keys at a time come from one vector of partial sums per key, reduced together
 * by a transpose-and-add tree, and P @ V uses the packed path's register-blocked micro-kernel.
 * Keys that a row cannot see (past the diagonal when causal, or in the -inf tail of its mask row: a
 * KV cache bucket filled only up to the current position, a causal mask) are never computed: each
 * row's visible end is found once per call, K/V are packed only up to the largest one, and a group
 * of rows stops at the largest end among its rows.  Such keys contribute exactly zero (scores of
 * inf or NaN there are not looked at). */
#include "common.h"

#define BQ 64
#define BK 64     /* key block of the few-rows path */
#define BKMAX 128 /* largest key block of the packed path */
#define AT_MR 4   /* rows per micro-kernel call */
#define AT_PACK_ROWS 16 /* rows per KV head from which K/V are packed */
#if defined(EX_AVX512) /* 32 registers: up to 24 accumulators and their loads */
#define AT_W 16
#define AT_SC_NV 4
#define AT_PV_NV 6
#elif defined(EX_AVX2) /* 16 registers: 12 accumulators, 3 loads, a broadcast */
#define AT_W 8
#define AT_SC_NV 3
#define AT_PV_NV 3
#else /* 128-bit vectors (SSE2, NEON) */
#define AT_W 4
#define AT_SC_NV 3
#define AT_PV_NV 3
#endif

/* exp(x) by a degree-6 polynomial on x - n ln 2, then 2^n (Cephes' expf); exp(-inf) = 0 and NaN
 * stays NaN (min/max return their second operand when either is NaN, so x goes second) */
#ifdef EX_AVX2
static inline __m256 exp256(__m256 x) {
  const __m256 is_ninf = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(is_ninf, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif
#ifdef EX_AVX512
static inline __m512 exp512(__m512 x) {
  const __mmask16 is_ninf = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), _mm512_min_ps(_mm512_set1_ps(88.0f), x));
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(~is_ninf, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}
#endif

/* p[j] = exp(s[j] - m), returns the sum */
static float exp_sum(float *s, int64_t n, float m) {
  int64_t j = 0;
  float t = 0.0f;
#if defined(EX_AVX512)
  __m512 acc = _mm512_setzero_ps();
  const __m512 mv = _mm512_set1_ps(m);
  for (; j + 16 <= n; j += 16) {
    const __m512 p = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
    _mm512_storeu_ps(s + j, p);
    acc = _mm512_add_ps(acc, p);
  }
  t = _mm512_reduce_add_ps(acc);
#elif defined(EX_AVX2)
  __m256 acc = _mm256_setzero_ps();
  const __m256 mv = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, p);
    acc = _mm256_add_ps(acc, p);
  }
  float l[8];
  _mm256_storeu_ps(l, acc);
  t = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
#endif
  for (; j < n; j++) { s[j] = expf(s[j] - m); t += s[j]; }
  return t;
}

/* the largest of s[0:n], NaN ignored (as x > m ? x : m does) */
static float row_max(const float *s, int64_t n) {
  int64_t j = 0;
  float mb = -INFINITY;
#if defined(EX_AVX512)
  __m512 acc = _mm512_set1_ps(-INFINITY);
  for (; j + 16 <= n; j += 16) acc = _mm512_max_ps(_mm512_loadu_ps(s + j), acc);
  mb = _mm512_reduce_max_ps(acc);
#elif defined(EX_AVX2)
  __m256 acc = _mm256_set1_ps(-INFINITY);
  for (; j + 8 <= n; j += 8) acc = _mm256_max_ps(_mm256_loadu_ps(s + j), acc);
  float l[8];
  _mm256_storeu_ps(l, acc);
  for (int i = 0; i < 8; i++) mb = l[i] > mb ? l[i] : mb;
#endif
  for (; j < n; j++) mb = s[j] > mb ? s[j] : mb;
  return mb;
}

/* ---- packed path: vectors of AT_W floats, explicit FMA (the build does not contract a*b+c) ---- */
typedef float avf __attribute__((vector_size(AT_W * sizeof(float))));
#define AT_INLINE static inline __attribute__((always_inline))
AT_INLINE avf av_splat(float x) {
#if defined(EX_AVX512)
  return (avf)_mm512_set1_ps(x);
#elif defined(EX_AVX2)
  return (avf)_mm256_set1_ps(x);
#else
  return (avf){x, x, x, x};
#endif
}
AT_INLINE avf av_load(const float *p) {
#if defined(EX_AVX512)
  return (avf)_mm512_loadu_ps(p);
#elif defined(EX_AVX2)
  return (avf)_mm256_loadu_ps(p);
#else
  avf v;
  memcpy(&v, p, sizeof v);
  return v;
#endif
}
AT_INLINE void av_store(float *p, avf v) {
#if defined(EX_AVX512)
  _mm512_storeu_ps(p, (__m512)v);
#elif defined(EX_AVX2)
  _mm256_storeu_ps(p, (__m256)v);
#else
  memcpy(p, &v, sizeof v);
#endif
}
#if defined(EX_AVX512)
#define AV_FMA(a, b, c) ((avf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif defined(EX_AVX2)
#define AV_FMA(a, b, c) ((avf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#else
#define AV_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* S[r][0:nv*AT_W] = scale * (q_r . k_j) for AT_MR rows against nv vectors of a K panel kp[d][ldk] */
AT_INLINE void at_sc_tile(const float *const *qr, const float *kp, int64_t d, int64_t ldk, float *s,
                          int64_t lds, float scale, const int nv) {
  avf acc[AT_MR][AT_SC_NV];
  for (int r = 0; r < AT_MR; r++)
    for (int c = 0; c < nv; c++) acc[r][c] = av_splat(0.0f);
  for (int64_t p = 0; p < d; p++) {
    avf kv[AT_SC_NV];
    for (int c = 0; c < nv; c++) kv[c] = av_load(kp + p * ldk + c * AT_W);
    for (int r = 0; r < AT_MR; r++) {
      const avf qv = av_splat(qr[r][p]);
      for (int c = 0; c < nv; c++) acc[r][c] = AV_FMA(qv, kv[c], acc[r][c]);
    }
  }
  const avf sc = av_splat(scale);
  for (int r = 0; r < AT_MR; r++)
    for (int c = 0; c < nv; c++) {
      av_store(s + r * lds + c * AT_W, acc[r][c] * sc);
    }
}

static void at_scores(const float *const *qr, const float *kp, int64_t d, int64_t ldk, int64_t nvec,
                      float *s, int64_t lds, float scale) {
  for (int64_t c = 0; c < nvec; c += AT_SC_NV) {
    const float *kc = kp + c * AT_W;
    float *sc = s + c * AT_W;
    switch (EX_MIN(AT_SC_NV, nvec - c)) { /* constant nv: the tile unrolls into registers */
    case 1: at_sc_tile(qr, kc, d, ldk, sc, lds, scale, 1); break;
    case 2: at_sc_tile(qr, kc, d, ldk, sc, lds, scale, 2); break;
#if AT_SC_NV >= 3
    case 3: at_sc_tile(qr, kc, d, ldk, sc, lds, scale, 3); break;
#endif
#if AT_SC_NV >= 4
    case 4: at_sc_tile(qr, kc, d, ldk, sc, lds, scale, 4); break;
#endif
    }
  }
}

/* O[r][0:nv*AT_W] += sum_j P[r][j] v_j for AT_MR rows, v rows of ldv floats */
AT_INLINE void at_pv_tile(const float *pm, int64_t ldp, int64_t nj, const float *v, int64_t ldv, float *o,
                          int64_t ldo, const int nv) {
  avf acc[AT_MR][AT_PV_NV];
  for (int r = 0; r < AT_MR; r++)
    for (int c = 0; c < nv; c++) acc[r][c] = av_load(o + r * ldo + c * AT_W);
  for (int64_t j = 0; j < nj; j++) {
    avf vv[AT_PV_NV];
    for (int c = 0; c < nv; c++) vv[c] = av_load(v + j * ldv + c * AT_W);
    for (int r = 0; r < AT_MR; r++) {
      const avf pr = av_splat(pm[r * ldp + j]);
      for (int c = 0; c < nv; c++) acc[r][c] = AV_FMA(pr, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < AT_MR; r++)
    for (int c = 0; c < nv; c++) av_store(o + r * ldo + c * AT_W, acc[r][c]);
}

static void at_pv(const float *pm, int64_t ldp, int64_t nj, const float *v, int64_t ldv, int64_t nvec, float *o,
                  int64_t ldo) {
  /* column chunks of equal size: 5 vectors as 3 + 2, not a lone 1 */
  const int64_t nch = (nvec + AT_PV_NV - 1) / AT_PV_NV, per = (nvec + nch - 1) / nch;
  for (int64_t c = 0; c < nvec; c += per) {
    const float *vc = v + c * AT_W;
    float *oc = o + c * AT_W;
    switch (EX_MIN(per, nvec - c)) {
    case 1: at_pv_tile(pm, ldp, nj, vc, ldv, oc, ldo, 1); break;
    case 2: at_pv_tile(pm, ldp, nj, vc, ldv, oc, ldo, 2); break;
#if AT_PV_NV >= 3
    case 3: at_pv_tile(pm, ldp, nj, vc, ldv, oc, ldo, 3); break;
#endif
#if AT_PV_NV >= 6
    case 4: at_pv_tile(pm, ldp, nj, vc, ldv, oc, ldo, 4); break;
    case 5: at_pv_tile(pm, ldp, nj, vc, ldv, oc, ldo, 5); break;
    case 6: at_pv_tile(pm, ldp, nj, vc, ldv, oc, ldo, 6); break;
#endif
    }
  }
}

typedef float av8 __attribute__((vector_size(32)));

typedef struct {
  const float *q, *k, *v, *mask;
  int64_t qs[3], ks[3], vs[3], ms[4];
  float *y;
  int64_t B, Hq, Hk, Lq, Lk, D, Dv, G, rows, nqb; /* G = hq / hk; rows = G * Lq per kv head */
  float scale;
  int32_t causal;
  /* packed path: key blocks of bk (a whole number of vectors), nkb of them per kv head;
   * kp [b][hk][kb][D][bk], vp [b][hk][kb * bk][dvp], zero past the ends */
  float *kp, *vp;
  int64_t bk, nkb, dvp;
  /* visible end of each row: keys [end, Lk) are masked; end[b * eb + h * eh + qi * eq] (zero strides
   * where the mask broadcasts) */
  int64_t *end, eb, eh, eq;
  _Atomic int err;
} at_ctx;

/* the end of row (b, h, qi)'s visible keys: causal, then the -inf tail of its mask row */
static int64_t at_row_end(const at_ctx *g, int64_t b, int64_t h, int64_t qi) {
  int64_t e = g->causal ? EX_MIN(g->Lk, qi + 1) : g->Lk;
  if (g->mask) {
    const float *mi = g->mask + b * g->ms[0] + h * g->ms[1] + qi * g->ms[2];
    while (e > 0 && mi[(e - 1) * g->ms[3]] == -INFINITY) e--;
  }
  return e;
}

/* query row r of a block: query qi = r / G of head hh = hk * G + r % G */
static void at_rows(const at_ctx *g, int64_t b, int64_t hk, int64_t r0, int64_t n, int64_t npad,
                    const float **qrow, int64_t *qi, int64_t *hh, int64_t *ke) {
  for (int64_t r = 0; r < npad; r++) {
    const int64_t rr = r0 + EX_MIN(r, n - 1); /* padding rows repeat the last one */
    qi[r] = rr / g->G;
    hh[r] = hk * g->G + rr % g->G;
    qrow[r] = g->q + b * g->qs[0] + hh[r] * g->qs[1] + qi[r] * g->qs[2];
    ke[r] = g->end[b * g->eb + hh[r] * g->eh + qi[r] * g->eq];
  }
}

/* the largest of ke[0:n] */
static int64_t at_max_end(const int64_t *ke, int64_t n) {
  int64_t e = 0;
  for (int64_t r = 0; r < n; r++) e = EX_MAX(e, ke[r]);
  return e;
}

/* scores sr[0:nj] of one row for keys j0.. (scaled): adds the mask, applies causal, then the
 * online-softmax step: new max, rescale of the row's sum and output ar[0:dv], p = exp(s - max) in
 * place; sr[nj:npad] is set to -inf first so that whole vectors can be used.  Returns 0 when every
 * key so far is masked (sr[0:nj] is then zero, contributing nothing). */
static int at_softmax_row(const at_ctx *g, float *sr, int64_t nj, int64_t npad, int64_t j0, int64_t b,
                          int64_t h, int64_t qi, float *m, float *l, float *ar, int64_t dv) {
  if (g->mask) {
    const float *mi = g->mask + b * g->ms[0] + h * g->ms[1] + qi * g->ms[2] + j0 * g->ms[3];
    if (g->ms[3] == 1)
      for (int64_t j = 0; j < nj; j++) sr[j] += mi[j];
    else
      for (int64_t j = 0; j < nj; j++) sr[j] += mi[j * g->ms[3]];
  }
  if (g->causal)
    for (int64_t j = EX_MAX(0, qi + 1 - j0); j < nj; j++) sr[j] = -INFINITY;
  for (int64_t j = nj; j < npad; j++) sr[j] = -INFINITY;
  const float mnew = nan_max(*m, row_max(sr, npad));
  if (mnew == -INFINITY) {
    memset(sr, 0, (size_t)npad * sizeof(float));
    return 0;
  }
  if (mnew != *m) {
    const float corr = *m == -INFINITY ? 0.0f : expf(*m - mnew);
    *l *= corr;
    for (int64_t e = 0; e < dv; e++) ar[e] *= corr;
    *m = mnew;
  }
  *l += exp_sum(sr, npad, mnew);
  return 1;
}

/* the packed path's work item: BQ rows of one (batch, kv head) against the packed K/V */
static void at_task_packed(void *vctx, int64_t t0, int64_t t1) {
  at_ctx *g = vctx;
  const int64_t D = g->D, Dv = g->Dv, dvp = g->dvp, bk = g->bk;
  float *mem = aligned_alloc(64, (size_t)(BQ * dvp + AT_MR * bk) * sizeof(float));
  if (!mem) { g->err = EX_ENOMEM; return; }
  float *acc = mem, *S = mem + BQ * dvp;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t qb = t % g->nqb, hk = t / g->nqb % g->Hk, b = t / (g->nqb * g->Hk);
    const int64_t r0 = qb * BQ, nr = EX_MIN(BQ, g->rows - r0), nrp = (nr + AT_MR - 1) / AT_MR * AT_MR;
    const float *kph = g->kp + (b * g->Hk + hk) * g->nkb * D * bk;
    const float *vph = g->vp + (b * g->Hk + hk) * g->nkb * bk * dvp;
    const float *qrow[BQ];
    int64_t qi[BQ], hh[BQ], ke[BQ];
    float m[BQ], l[BQ];
    at_rows(g, b, hk, r0, nr, nrp, qrow, qi, hh, ke);
    for (int64_t r = 0; r < nrp; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    memset(acc, 0, (size_t)(nrp * dvp) * sizeof(float));
    const int64_t kend = at_max_end(ke, nrp);
    for (int64_t j0 = 0; j0 < kend; j0 += bk) {
      for (int64_t r = 0; r < nrp; r += AT_MR) {
        /* this group's keys of the block: up to its rows' largest visible end */
        const int64_t nj = EX_MIN(bk, at_max_end(ke + r, AT_MR) - j0), nvec = (nj + AT_W - 1) / AT_W;
        if (nj <= 0) continue;
        float *ar = acc + r * dvp;
        at_scores(qrow + r, kph + j0 * D, D, bk, nvec, S, bk, g->scale);
        int any = 0;
        for (int64_t i = 0; i < AT_MR; i++) {
          const int64_t nji = EX_MAX(0, EX_MIN(nj, ke[r + i] - j0));
          any |= at_softmax_row(g, S + i * bk, nji, nvec * AT_W, j0, b, hh[r + i], qi[r + i], m + r + i,
                                l + r + i, ar + i * dvp, dvp);
        }
        if (any) at_pv(S, bk, nj, vph + j0 * dvp, dvp, dvp / AT_W, ar, dvp);
      }
    }
    for (int64_t r = 0; r < nr; r++) {
      float *yr = g->y + ((b * g->Hq + hh[r]) * g->Lq + qi[r]) * Dv;
      const float inv = 1.0f / l[r];
      for (int64_t e = 0; e < Dv; e++) yr[e] = acc[r * dvp + e] * inv;
    }
  }
  free(mem);
}

/* one key block of one (batch, kv head): K transposed into its panel, V rows padded */
static void at_pack(void *vctx, int64_t t0, int64_t t1) {
  at_ctx *g = vctx;
  const int64_t D = g->D, Dv = g->Dv, bk = g->bk, dvp = g->dvp;
  for (int64_t t = t0; t < t1; t++) { /* t = (b * Hk + hk) * nkb + kb */
    const int64_t kb = t % g->nkb, hk = t / g->nkb % g->Hk, b = t / (g->nkb * g->Hk);
    const int64_t j0 = kb * bk, nj = EX_MIN(bk, g->Lk - j0);
    const float *kh = g->k + b * g->ks[0] + hk * g->ks[1] + j0 * g->ks[2];
    const float *vh = g->v + b * g->vs[0] + hk * g->vs[1] + j0 * g->vs[2];
    float *kp = g->kp + t * D * bk, *vp = g->vp + t * bk * dvp;
    for (int64_t p = 0; p < D; p++) {
      for (int64_t j = 0; j < nj; j++) kp[p * bk + j] = kh[j * g->ks[2] + p];
      for (int64_t j = nj; j < bk; j++) kp[p * bk + j] = 0.0f;
    }
    for (int64_t j = 0; j < bk; j++) {
      if (j < nj) memcpy(vp + j * dvp, vh + j * g->vs[2], (size_t)Dv * sizeof(float));
      memset(vp + j * dvp + (j < nj ? Dv : 0), 0, (size_t)(j < nj ? dvp - Dv : dvp) * sizeof(float));
    }
  }
}

static float at_dot(const float *a, const float *b, int64_t d) {
  av8 s0 = {0}, s1 = {0};
  int64_t p = 0;
  for (; p + 16 <= d; p += 16) {
    av8 a0, a1, b0, b1;
    memcpy(&a0, a + p, sizeof a0);
    memcpy(&a1, a + p + 8, sizeof a1);
    memcpy(&b0, b + p, sizeof b0);
    memcpy(&b1, b + p + 8, sizeof b1);
    s0 += a0 * b0;
    s1 += a1 * b1;
  }
  s0 += s1;
  float t = ((s0[0] + s0[4]) + (s0[1] + s0[5])) + ((s0[2] + s0[6]) + (s0[3] + s0[7]));
  for (; p < d; p++) t += a[p] * b[p];
  return t;
}

/* one vector of the AT_W sums of v[0..AT_W-1] (v[i]'s lanes summed into lane i): a transpose-and-add
 * tree, log2(AT_W) levels of shuffles instead of AT_W horizontal sums */
#if defined(EX_AVX512)
static inline __m512 at_hsum(const __m512 *v) {
  __m512 a[8], c[4], e[2];
  for (int i = 0; i < 8; i++) /* per 128-bit lane: [v0 v1 v0 v1] partial sums */
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; i++) { /* per 128-bit lane: [v0 v1 v2 v3] */
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int i = 0; i < 2; i++) /* lanes: [v0-3, v0-3, v4-7, v4-7] */
    e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#elif defined(EX_AVX2)
static inline __m256 at_hsum(const __m256 *v) {
  __m256 a[4], c[2];
  for (int i = 0; i < 4; i++)
    a[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; i++) {
    const __m256d x = _mm256_castps_pd(a[2 * i]), y = _mm256_castps_pd(a[2 * i + 1]);
    c[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(c[0], c[1], 0x20), _mm256_permute2f128_ps(c[0], c[1], 0x31));
}
#endif

/* s[0:nj] = scale * (q . k_j), k_j = k + j * ks */
static void at_row_scores(const float *q, const float *k, int64_t ks, int64_t nj, int64_t d, float scale,
                          float *s) {
  int64_t j = 0;
#if defined(EX_AVX512) || defined(EX_AVX2)
  if (d % AT_W == 0) /* AT_W keys at a time: one vector of partial sums per key */
    for (; j + AT_W <= nj; j += AT_W) {
      avf v[AT_W];
#pragma GCC unroll 16
      for (int i = 0; i < AT_W; i++) {
        const float *kj = k + (j + i) * ks;
        avf t = av_load(q) * av_load(kj);
        for (int64_t p = AT_W; p < d; p += AT_W) t = AV_FMA(av_load(q + p), av_load(kj + p), t);
        v[i] = t;
      }
#if defined(EX_AVX512)
      av_store(s + j, (avf)at_hsum((const __m512 *)v) * av_splat(scale));
#else
      av_store(s + j, (avf)at_hsum((const __m256 *)v) * av_splat(scale));
#endif
    }
#endif
  for (; j < nj; j++) s[j] = at_dot(q, k + j * ks, d) * scale;
}

/* the few-rows path's work item (fewer than AT_PACK_ROWS rows per kv head, so one block):
 * K and V read in place */
static void at_task_small(void *vctx, int64_t t0, int64_t t1) {
  at_ctx *g = vctx;
  const int64_t Dv = g->Dv, D = g->D, Dvp = (Dv + AT_W - 1) / AT_W * AT_W, nfull = Dv / AT_W;
  float *mem = aligned_alloc(64, (size_t)(AT_PACK_ROWS * (Dvp + BK)) * sizeof(float));
  if (!mem) { g->err = EX_ENOMEM; return; }
  float *acc = mem, (*S)[BK] = (float (*)[BK])(mem + AT_PACK_ROWS * Dvp);
  for (int64_t t = t0; t < t1; t++) {
    const int64_t hk = t % g->Hk, b = t / g->Hk, nr = g->rows, nrp = (nr + AT_MR - 1) / AT_MR * AT_MR;
    const float *kh = g->k + b * g->ks[0] + hk * g->ks[1];
    const float *vh = g->v + b * g->vs[0] + hk * g->vs[1];
    const float *qrow[AT_PACK_ROWS];
    int64_t qi[AT_PACK_ROWS], hh[AT_PACK_ROWS], ke[AT_PACK_ROWS];
    float m[AT_PACK_ROWS], l[AT_PACK_ROWS];
    at_rows(g, b, hk, 0, nr, nr, qrow, qi, hh, ke);
    for (int64_t r = 0; r < nr; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    memset(acc, 0, (size_t)(AT_PACK_ROWS * Dvp) * sizeof(float));
    memset(S, 0, (size_t)(nrp * BK) * sizeof(float)); /* padding rows stay zero */
    const int64_t kend = at_max_end(ke, nr);
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      const int64_t nj = EX_MIN(BK, kend - j0);
      int any = 0;
      for (int64_t r = 0; r < nr; r++) {
        const int64_t njr = EX_MAX(0, EX_MIN(nj, ke[r] - j0));
        at_row_scores(qrow[r], kh + j0 * g->ks[2], g->ks[2], njr, D, g->scale, S[r]);
        any |= at_softmax_row(g, S[r], njr, nj, j0, b, hh[r], qi[r], m + r, l + r, acc + r * Dvp, Dv);
      }
      if (!any) continue;
      const float *vj = vh + j0 * g->vs[2];
      for (int64_t r = 0; r < nr; r += AT_MR) {
        if (nfull) at_pv(S[r], BK, nj, vj, g->vs[2], nfull, acc + r * Dvp, Dvp);
        for (int64_t rr = r; rr < EX_MIN(r + AT_MR, nr); rr++) /* tail columns */
          for (int64_t jj = 0; jj < nj; jj++) {
            const float pr = S[rr][jj], *vr = vj + jj * g->vs[2];
            for (int64_t e = nfull * AT_W; e < Dv; e++) acc[rr * Dvp + e] += pr * vr[e];
          }
      }
    }
    for (int64_t r = 0; r < nr; r++) {
      float *yr = g->y + ((b * g->Hq + hh[r]) * g->Lq + qi[r]) * Dv;
      const float inv = 1.0f / l[r];
      for (int64_t e = 0; e < Dv; e++) yr[e] = acc[r * Dvp + e] * inv;
    }
  }
  free(mem);
}

static int attention(const float *q, const int64_t *q_strides, const float *k,
                     const int64_t *k_strides, const float *v, const int64_t *v_strides,
                     const float *mask, const int64_t *mask_strides, float *y, int64_t b,
                     int64_t hq, int64_t hk, int64_t lq, int64_t lk, int64_t d, int64_t dv,
                     float scale, int32_t causal) {
  if (b < 0 || hq < 1 || hk < 1 || hq % hk || lq < 0 || lk < 0 || d < 0 || dv < 0) return EX_EINVAL;
  if (b * lq * dv == 0) return EX_OK;
  if (!q || !k || !v || !y || !q_strides || !k_strides || !v_strides || (mask && !mask_strides))
    return EX_EINVAL;
  at_ctx g = {q, k, v, mask, {0}, {0}, {0}, {0}, y, b, hq, hk, lq, lk, d, dv, hq / hk, hq / hk * lq,
              (hq / hk * lq + BQ - 1) / BQ, scale, causal, NULL, NULL, 0, 0, 0, NULL, 0, 0, 0, 0};
  for (int i = 0; i < 3; i++) {
    g.qs[i] = q_strides[i];
    g.ks[i] = k_strides[i];
    g.vs[i] = v_strides[i];
  }
  if (mask)
    for (int i = 0; i < 4; i++) g.ms[i] = mask_strides[i];
  /* visible ends, one per distinct mask row (per query only without a mask); keys past the
   * largest are seen by no row */
  const int64_t nb = mask && g.ms[0] ? b : 1, nh = mask && g.ms[1] ? hq : 1, nq = mask && !g.ms[2] && !causal ? 1 : lq;
  g.end = malloc((size_t)(nb * nh * nq) * sizeof(int64_t));
  if (!g.end) return EX_ENOMEM;
  g.eb = nb > 1 ? nh * nq : 0;
  g.eh = nh > 1 ? nq : 0;
  g.eq = nq > 1;
  int64_t lke = 0;
  for (int64_t i = 0; i < nb * nh * nq; i++)
    lke = EX_MAX(lke, g.end[i] = at_row_end(&g, i / (nh * nq), i / nq % nh, i % nq));
  g.Lk = lk = lke;
  const int64_t per = EX_MIN(g.rows, BQ) * (lk + 1) * (d + dv);
  if (g.rows < AT_PACK_ROWS || lk == 0) {
    ex_parallel_for(b * hk, EX_MAX(1, 65536 / EX_MAX(per, 1)), at_task_small, &g);
    free(g.end);
    return g.err;
  }
  /* equal key blocks of at most BKMAX, each a whole number of vectors (77 keys: one block of 80) */
  g.nkb = (lk + BKMAX - 1) / BKMAX;
  g.bk = ((lk + g.nkb - 1) / g.nkb + AT_W - 1) / AT_W * AT_W;
  g.nkb = (lk + g.bk - 1) / g.bk;
  g.dvp = (dv + AT_W - 1) / AT_W * AT_W;
  const int64_t blocks = b * hk * g.nkb;
  g.kp = aligned_alloc(64, (size_t)(blocks * g.bk * (d + g.dvp)) * sizeof(float));
  if (!g.kp) {
    free(g.end);
    return EX_ENOMEM;
  }
  g.vp = g.kp + blocks * g.bk * d;
  ex_parallel_for(blocks, EX_MAX(1, 16384 / (g.bk * (d + g.dvp))), at_pack, &g);
  ex_parallel_for(b * hk * g.nqb, EX_MAX(1, 65536 / EX_MAX(per, 1)), at_task_packed, &g);
  free(g.kp);
  free(g.end);
  return g.err;
}
