/* ex_attention: fused scaled-dot-product attention, softmax(q k^T * scale + mask) v.
 * Reference: the definition with max-subtracted softmax.  Optimized: flash-style streaming, so no
 * [Lq, Lk] matrix is stored: a block of BQ rows walks the keys in blocks of BK, keeping a running
 * max, sum and output row per row and rescaling them when the max grows.  Rows are (query, head)
 * pairs of one KV head, so the heads of a GQA group (hq / hk of them) share every K/V load and a
 * single-token decode is one block per KV head.  Scores are an outer-product micro-kernel
 * (4 rows x BK keys against the key block transposed once), P @ V a 4-row x 16-column one, both
 * in GNU vectors; exp is a vectorized polynomial in the AVX2 builds.  Causal (PyTorch's top-left
 * alignment: key j is visible to query i when j <= i) stops the walk at the diagonal. */
#include "common.h"

#define BQ 64
#define BK 64

#ifdef EX_AVX2
static inline __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-87.0f);
  const __m256 is_ninf = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
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

/* p[j] = exp(s[j] - m), returns the sum */
static float exp_sum(float *s, int64_t n, float m) {
  int64_t j = 0;
  float t = 0.0f;
#ifdef EX_AVX2
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

typedef float av8 __attribute__((vector_size(32)));

typedef struct {
  const float *q, *k, *v, *mask;
  int64_t qs[3], ks[3], vs[3], ms[4];
  float *y;
  int64_t B, Hq, Hk, Lq, Lk, D, Dv, G, rows, nqb; /* G = hq / hk; rows = G * Lq per kv head */
  float scale;
  int32_t causal;
  _Atomic int err;
} at_ctx;

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

/* S[r][0:BK] = q_r . k_j for 4 rows against a key block stored transposed, kt[d][BK] */
static void at_scores4(const float *const *qr, const float *kt, int64_t d, float (*S)[BK]) {
  av8 acc[4][BK / 8];
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < BK / 8; c++) acc[r][c] = (av8){0};
  for (int64_t p = 0; p < d; p++) {
    av8 kv[BK / 8];
    memcpy(kv, kt + p * BK, sizeof kv);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
      const float qv = qr[r][p];
#pragma GCC unroll 8
      for (int c = 0; c < BK / 8; c++) acc[r][c] += qv * kv[c];
    }
  }
  for (int r = 0; r < 4; r++) memcpy(S[r], acc[r], sizeof acc[r]);
}

/* O[r][e0:e0+16] += sum_j P[r][j] v_j[e0:e0+16] for 4 rows (o: row stride ldo) */
static void at_pv4(const float (*P)[BK], int64_t nj, const float *v, int64_t vs, float *o, int64_t ldo,
                   int64_t e0) {
  av8 acc[4][2];
  for (int r = 0; r < 4; r++) {
    memcpy(&acc[r][0], o + r * ldo + e0, sizeof(av8));
    memcpy(&acc[r][1], o + r * ldo + e0 + 8, sizeof(av8));
  }
  for (int64_t j = 0; j < nj; j++) {
    av8 v0, v1;
    memcpy(&v0, v + j * vs + e0, sizeof v0);
    memcpy(&v1, v + j * vs + e0 + 8, sizeof v1);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
      const float pr = P[r][j];
      acc[r][0] += pr * v0;
      acc[r][1] += pr * v1;
    }
  }
  for (int r = 0; r < 4; r++) {
    memcpy(o + r * ldo + e0, &acc[r][0], sizeof(av8));
    memcpy(o + r * ldo + e0 + 8, &acc[r][1], sizeof(av8));
  }
}

/* one work item: BQ rows of one (batch, kv head); row r is query i = r / G of head hk*G + r % G,
 * so a GQA group shares every K/V load */
static void at_task(void *vctx, int64_t t0, int64_t t1) {
  at_ctx *g = vctx;
  const int64_t Dv = g->Dv, D = g->D, Dvp = (Dv + 15) / 16 * 16;
  float *mem = aligned_alloc(64, (size_t)(BQ * Dvp + BQ * BK + D * BK + 16) * sizeof(float));
  if (!mem) { g->err = EX_ENOMEM; return; }
  float *acc = mem, (*S)[BK] = (float (*)[BK])(mem + BQ * Dvp), *kt = mem + BQ * Dvp + BQ * BK;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t qb = t % g->nqb, hk = t / g->nqb % g->Hk, b = t / (g->nqb * g->Hk);
    const int64_t r0 = qb * BQ, nr = EX_MIN(BQ, g->rows - r0);
    const float *kh = g->k + b * g->ks[0] + hk * g->ks[1];
    const float *vh = g->v + b * g->vs[0] + hk * g->vs[1];
    const float *qrow[BQ + 3];
    int64_t qi[BQ], hh[BQ];
    float m[BQ], l[BQ];
    int64_t imax = 0;
    for (int64_t r = 0; r < nr; r++) {
      qi[r] = (r0 + r) / g->G;
      hh[r] = hk * g->G + (r0 + r) % g->G;
      qrow[r] = g->q + b * g->qs[0] + hh[r] * g->qs[1] + qi[r] * g->qs[2];
      m[r] = -INFINITY;
      l[r] = 0.0f;
      imax = EX_MAX(imax, qi[r]);
    }
    for (int64_t r = nr; r < BQ + 3; r++) qrow[r] = qrow[nr - 1];
    memset(acc, 0, (size_t)(BQ * Dvp) * sizeof(float));
    const int64_t kend = g->causal ? EX_MIN(g->Lk, imax + 1) : g->Lk;
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      const int64_t nj = EX_MIN(BK, kend - j0);
      if (nr > 8) {
        for (int64_t jj = 0; jj < BK; jj++) { /* K block transposed (zero keys past the end) */
          const float *kj = kh + (j0 + EX_MIN(jj, nj - 1)) * g->ks[2];
          for (int64_t p = 0; p < D; p++) kt[p * BK + jj] = jj < nj ? kj[p] : 0.0f;
        }
        for (int64_t r = 0; r < nr; r += 4) at_scores4(qrow + r, kt, D, S + r);
      } else { /* few rows (decode): dot products, K read in place */
        for (int64_t r = 0; r < nr; r++)
          for (int64_t jj = 0; jj < nj; jj++) S[r][jj] = at_dot(qrow[r], kh + (j0 + jj) * g->ks[2], D);
      }
      int any = 0;
      for (int64_t r = 0; r < nr; r++) {
        float *sr = S[r];
        const float *mi = g->mask ? g->mask + b * g->ms[0] + hh[r] * g->ms[1] + qi[r] * g->ms[2] + j0 * g->ms[3]
                                  : NULL;
        const float sc = g->scale;
        for (int64_t jj = 0; jj < nj; jj++) sr[jj] *= sc;
        if (mi && g->ms[3] == 1)
          for (int64_t jj = 0; jj < nj; jj++) sr[jj] += mi[jj];
        else if (mi)
          for (int64_t jj = 0; jj < nj; jj++) sr[jj] += mi[jj * g->ms[3]];
        if (g->causal)
          for (int64_t jj = EX_MAX(0, qi[r] + 1 - j0); jj < nj; jj++) sr[jj] = -INFINITY;
        float mb = -INFINITY;
        for (int64_t jj = 0; jj < nj; jj++) mb = sr[jj] > mb ? sr[jj] : mb;
        const float mnew = nan_max(m[r], mb);
        if (mnew == -INFINITY) { /* everything masked so far: contributes nothing */
          for (int64_t jj = 0; jj < nj; jj++) sr[jj] = 0.0f;
          continue;
        }
        any = 1;
        if (mnew != m[r]) {
          const float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mnew);
          l[r] *= corr;
          float *ar = acc + r * Dvp;
          for (int64_t e = 0; e < Dv; e++) ar[e] *= corr;
          m[r] = mnew;
        }
        l[r] += exp_sum(sr, nj, mnew);
      }
      if (!any) continue;
      for (int64_t r = nr; r < ((nr + 3) & ~3); r++) memset(S[r], 0, sizeof S[r]);
      for (int64_t r = 0; r < nr; r += 4)
        for (int64_t e0 = 0; e0 < Dv; e0 += 16) {
          if (e0 + 16 <= Dv) {
            at_pv4((const float (*)[BK])(S + r), nj, vh + j0 * g->vs[2], g->vs[2], acc + r * Dvp, Dvp, e0);
          } else { /* tail columns */
            for (int64_t rr = r; rr < EX_MIN(r + 4, nr); rr++)
              for (int64_t jj = 0; jj < nj; jj++) {
                const float pr = S[rr][jj], *vj = vh + (j0 + jj) * g->vs[2];
                for (int64_t e = e0; e < Dv; e++) acc[rr * Dvp + e] += pr * vj[e];
              }
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
              (hq / hk * lq + BQ - 1) / BQ, scale, causal, 0};
  for (int i = 0; i < 3; i++) {
    g.qs[i] = q_strides[i];
    g.ks[i] = k_strides[i];
    g.vs[i] = v_strides[i];
  }
  if (mask)
    for (int i = 0; i < 4; i++) g.ms[i] = mask_strides[i];
  const int64_t per = EX_MIN(g.rows, BQ) * (lk + 1) * (d + dv);
  ex_parallel_for(b * hk * g.nqb, EX_MAX(1, 65536 / EX_MAX(per, 1)), at_task, &g);
  return g.err;
}
