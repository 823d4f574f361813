/* ex_attention: fused scaled-dot-product attention, softmax(q k^T * scale + mask) v.
 * Reference: the definition with max-subtracted softmax.  Optimized: flash-style streaming,
 * so no [Lq, Lk] matrix is stored: a block of BQ query rows walks the keys in blocks of BK
 * (that K/V block stays in L1 for all the rows), keeping a running max, sum and output row per
 * query row and rescaling them when the max grows.  Causal (PyTorch's top-left alignment: key
 * j is visible to query i when j <= i) stops the walk at the diagonal.  GQA: query head h reads
 * key/value head h / (hq / hk).  Work items are (batch, head, query block) on the pool; a
 * single-token decode is one item per head.  exp is a vectorized polynomial in the AVX2 build. */
#include "common.h"

#define BQ 16
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

/* out[0..3] = q . k_c for the 4 rows k + c * ks */
static void dot4(const float *q, const float *k, int64_t ks, int64_t d, float *out) {
  int64_t p = 0;
  float r0 = 0, r1 = 0, r2 = 0, r3 = 0;
#ifdef EX_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (; p + 8 <= d; p += 8) {
    const __m256 qv = _mm256_loadu_ps(q + p);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + p), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + ks + p), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * ks + p), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * ks + p), a3);
  }
  /* transpose-reduce the four accumulators */
  const __m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3);
  const __m256 h = _mm256_hadd_ps(h01, h23);
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  float t[4];
  _mm_storeu_ps(t, s);
  r0 = t[0]; r1 = t[1]; r2 = t[2]; r3 = t[3];
#endif
  for (; p < d; p++) {
    r0 += q[p] * k[p];
    r1 += q[p] * k[ks + p];
    r2 += q[p] * k[2 * ks + p];
    r3 += q[p] * k[3 * ks + p];
  }
  out[0] = r0; out[1] = r1; out[2] = r2; out[3] = r3;
}

typedef struct {
  const float *q, *k, *v, *mask;
  int64_t qs[3], ks[3], vs[3], ms[4];
  float *y;
  int64_t B, Hq, Hk, Lq, Lk, D, Dv, nqb;
  float scale;
  int32_t causal;
  _Atomic int err;
} at_ctx;

static void at_task(void *vctx, int64_t t0, int64_t t1) {
  at_ctx *g = vctx;
  const int64_t Dv = g->Dv, D = g->D;
  float *mem = malloc((size_t)(BQ * Dv + BQ * BK + 8) * sizeof(float));
  if (!mem) { g->err = EX_ENOMEM; return; }
  float *acc = mem, *s = mem + BQ * Dv;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t qb = t % g->nqb, h = t / g->nqb % g->Hq, b = t / (g->nqb * g->Hq);
    const int64_t hk = h / (g->Hq / g->Hk);
    const int64_t i0 = qb * BQ, ni = EX_MIN(BQ, g->Lq - i0);
    const float *qh = g->q + b * g->qs[0] + h * g->qs[1];
    const float *kh = g->k + b * g->ks[0] + hk * g->ks[1];
    const float *vh = g->v + b * g->vs[0] + hk * g->vs[1];
    const float *mh = g->mask ? g->mask + b * g->ms[0] + h * g->ms[1] : NULL;
    float m[BQ], l[BQ];
    for (int64_t r = 0; r < ni; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    memset(acc, 0, (size_t)(ni * Dv) * sizeof(float));
    const int64_t kend = g->causal ? EX_MIN(g->Lk, i0 + ni) : g->Lk;
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      const int64_t nj = EX_MIN(BK, kend - j0);
      for (int64_t r = 0; r < ni; r++) {
        const int64_t i = i0 + r;
        const float *qi = qh + i * g->qs[2];
        float *sr = s;
        int64_t jj = 0;
        for (; jj + 4 <= nj; jj += 4) dot4(qi, kh + (j0 + jj) * g->ks[2], g->ks[2], D, sr + jj);
        for (; jj < nj; jj++) {
          float o4[4];
          dot4(qi, kh + (j0 + jj) * g->ks[2], 0, D, o4);
          sr[jj] = o4[0];
        }
        float mb = -INFINITY;
        const float *mi = mh ? mh + i * g->ms[2] + j0 * g->ms[3] : NULL;
        for (jj = 0; jj < nj; jj++) {
          float v = sr[jj] * g->scale;
          if (mi) v += mi[jj * g->ms[3]];
          if (g->causal && j0 + jj > i) v = -INFINITY;
          sr[jj] = v;
          mb = nan_max(mb, v);
        }
        const float mnew = nan_max(m[r], mb);
        if (mnew == -INFINITY) continue; /* everything masked so far */
        float *ar = acc + r * Dv;
        if (mnew != m[r]) {
          const float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mnew);
          l[r] *= corr;
          for (int64_t e = 0; e < Dv; e++) ar[e] *= corr;
          m[r] = mnew;
        }
        l[r] += exp_sum(sr, nj, mnew);
        for (jj = 0; jj < nj; jj++) {
          const float p = sr[jj];
          if (p == 0.0f) continue;
          const float *vj = vh + (j0 + jj) * g->vs[2];
          for (int64_t e = 0; e < Dv; e++) ar[e] += p * vj[e];
        }
      }
    }
    for (int64_t r = 0; r < ni; r++) {
      float *yr = g->y + ((b * g->Hq + h) * g->Lq + i0 + r) * Dv;
      const float inv = 1.0f / l[r];
      for (int64_t e = 0; e < Dv; e++) yr[e] = acc[r * Dv + e] * inv;
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
  at_ctx g = {q, k, v, mask, {0}, {0}, {0}, {0}, y, b, hq, hk, lq, lk, d, dv,
              (lq + BQ - 1) / BQ, scale, causal, 0};
  for (int i = 0; i < 3; i++) {
    g.qs[i] = q_strides[i];
    g.ks[i] = k_strides[i];
    g.vs[i] = v_strides[i];
  }
  if (mask)
    for (int i = 0; i < 4; i++) g.ms[i] = mask_strides[i];
  const int64_t per = EX_MIN(lq, BQ) * (lk + 1) * (d + dv);
  ex_parallel_for(b * hq * g.nqb, EX_MAX(1, 65536 / EX_MAX(per, 1)), at_task, &g);
  return g.err;
}
