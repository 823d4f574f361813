/* ex_matmul.  Reference: the int64 triple loop (matmul_i64) and gemv's strided dot.
 * Optimized f32 path (Goto/BLIS scheme): B is packed into KC x NR panels, A into MR x KC
 * panels, and an MR x NR register-blocked micro-kernel runs over them with KC/MC/NC cache
 * blocking; 2+ threads take disjoint column (or row) ranges.  The AVX2 micro-kernel keeps the
 * 6x16 tile in 12 ymm accumulators with FMA; the portable one uses GNU vector extensions.
 * m == 1 or n == 1 goes to a GEMV (dot or axpy form, whichever walks memory contiguously). */
#include "common.h"

#define MR 6
#define NR 16
#define KC 256
#define MC 144
#define NC 4096
#define ROUND_UP(x, r) (((x) + (r) - 1) / (r) * (r))

/* ap <- A[0:mc, 0:kc] as MR-row panels, each kc columns of MR values (zero padded) */
static void pack_a(int64_t mc, int64_t kc, const float *a, int64_t rs, int64_t cs, float *ap) {
  for (int64_t i0 = 0; i0 < mc; i0 += MR, ap += kc * MR) {
    const int64_t mr = EX_MIN(MR, mc - i0);
    const float *s = a + i0 * rs;
    if (mr == MR && cs == 1) {
      for (int i = 0; i < MR; i++)
        for (int64_t p = 0; p < kc; p++) ap[p * MR + i] = s[i * rs + p];
    } else {
      for (int64_t p = 0; p < kc; p++)
        for (int i = 0; i < MR; i++) ap[p * MR + i] = i < mr ? s[i * rs + p * cs] : 0.0f;
    }
  }
}

/* bp <- B[0:kc, 0:nc] as NR-column panels, each kc rows of NR values (zero padded) */
static void pack_b(int64_t kc, int64_t nc, const float *b, int64_t rs, int64_t cs, float *bp) {
  for (int64_t j0 = 0; j0 < nc; j0 += NR, bp += kc * NR) {
    const int64_t nr = EX_MIN(NR, nc - j0);
    const float *s = b + j0 * cs;
    if (nr == NR && cs == 1) {
      for (int64_t p = 0; p < kc; p++)
        for (int j = 0; j < NR; j++) bp[p * NR + j] = s[p * rs + j];
    } else if (nr == NR && rs == 1) {
      for (int j = 0; j < NR; j++)
        for (int64_t p = 0; p < kc; p++) bp[p * NR + j] = s[j * cs + p];
    } else {
      for (int64_t p = 0; p < kc; p++)
        for (int j = 0; j < NR; j++) bp[p * NR + j] = j < nr ? s[j * cs + p * rs] : 0.0f;
    }
  }
}

/* C[0:MR, 0:NR] (row stride ldc) = or += packed A panel x packed B panel */
#ifdef EX_AVX2
static void ukernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int acc) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int i = 0; i < MR; i++) _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
#define ROW(i, r0, r1)                                   \
  av = _mm256_broadcast_ss(a + i);                       \
  r0 = _mm256_fmadd_ps(av, b0, r0);                      \
  r1 = _mm256_fmadd_ps(av, b1, r1)
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; p++) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    __m256 av;
    _mm_prefetch((const char *)(a + 8 * MR), _MM_HINT_T0);
    ROW(0, c00, c01); ROW(1, c10, c11); ROW(2, c20, c21);
    ROW(3, c30, c31); ROW(4, c40, c41); ROW(5, c50, c51);
    a += MR;
    b += NR;
  }
#undef ROW
#define OUT(i, r0, r1)                                                                   \
  if (acc) {                                                                             \
    r0 = _mm256_add_ps(r0, _mm256_loadu_ps(c + i * ldc));                                \
    r1 = _mm256_add_ps(r1, _mm256_loadu_ps(c + i * ldc + 8));                            \
  }                                                                                      \
  _mm256_storeu_ps(c + i * ldc, r0);                                                     \
  _mm256_storeu_ps(c + i * ldc + 8, r1)
  OUT(0, c00, c01); OUT(1, c10, c11); OUT(2, c20, c21);
  OUT(3, c30, c31); OUT(4, c40, c41); OUT(5, c50, c51);
#undef OUT
}
#else
/* Portable: GNU vector extensions (lowered to whatever SIMD the baseline has, e.g. SSE2), one
 * 6x8 half of the tile at a time so the 6 accumulators fit in 16 registers. */
typedef float v8f __attribute__((vector_size(32)));
static void ukernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int acc) {
  for (int h = 0; h < NR; h += 8) {
    v8f t[MR] = {{0}};
    const float *pa = a, *pb = b + h;
    for (int64_t p = 0; p < kc; p++, pa += MR, pb += NR) {
      v8f bv;
      memcpy(&bv, pb, sizeof bv);
      for (int i = 0; i < MR; i++) t[i] += pa[i] * bv;
    }
    for (int i = 0; i < MR; i++) {
      v8f cv;
      if (acc) {
        memcpy(&cv, c + i * ldc + h, sizeof cv);
        t[i] += cv;
      }
      memcpy(c + i * ldc + h, &t[i], sizeof cv);
    }
  }
}
#endif

typedef struct {
  const float *a, *b;
  float *c;
  int64_t ars, acs, brs, bcs, m, n, k;
  int64_t parts; /* ranges the work was split into */
  int split_n;   /* ranges are of columns (else of rows) */
  _Atomic int err;
} sg_ctx;

/* C[i0:i1, j0:j1] = A[i0:i1, :] @ B[:, j0:j1] */
static int sgemm_range(const sg_ctx *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t k = g->k, ldc = g->n;
  const int64_t kmax = EX_MIN(KC, k), mmax = EX_MIN(MC, ROUND_UP(i1 - i0, MR)),
                nmax = EX_MIN(NC, ROUND_UP(j1 - j0, NR));
  float *ap = aligned_alloc(64, (size_t)ROUND_UP(mmax * kmax * 4, 64));
  float *bp = aligned_alloc(64, (size_t)ROUND_UP(nmax * kmax * 4, 64));
  if (!ap || !bp) { free(ap); free(bp); return EX_ENOMEM; }
  float edge[MR * NR];
  for (int64_t jc = j0; jc < j1; jc += NC) {
    const int64_t nc = EX_MIN(NC, j1 - jc);
    for (int64_t pc = 0; pc < k; pc += KC) {
      const int64_t kc = EX_MIN(KC, k - pc);
      pack_b(kc, nc, g->b + pc * g->brs + jc * g->bcs, g->brs, g->bcs, bp);
      for (int64_t ic = i0; ic < i1; ic += MC) {
        const int64_t mc = EX_MIN(MC, i1 - ic);
        pack_a(mc, kc, g->a + ic * g->ars + pc * g->acs, g->ars, g->acs, ap);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int64_t nr = EX_MIN(NR, nc - jr);
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int64_t mr = EX_MIN(MR, mc - ir);
            float *c = g->c + (ic + ir) * ldc + jc + jr;
            const float *pa = ap + ir * kc, *pb = bp + jr * kc;
            if (mr == MR && nr == NR) {
              ukernel(kc, pa, pb, c, ldc, pc > 0);
            } else { /* partial tile through a buffer */
              ukernel(kc, pa, pb, edge, NR, 0);
              for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < nr; j++)
                  c[i * ldc + j] = pc > 0 ? c[i * ldc + j] + edge[i * NR + j] : edge[i * NR + j];
            }
          }
        }
      }
    }
  }
  free(ap);
  free(bp);
  return EX_OK;
}

static void sgemm_task(void *vctx, int64_t b, int64_t e) {
  sg_ctx *g = vctx;
  for (int64_t t = b; t < e; t++) {
    int err;
    if (g->split_n) { /* ranges in whole NR panels */
      const int64_t nb = (g->n + NR - 1) / NR;
      err = sgemm_range(g, 0, g->m, EX_MIN(g->n, nb * t / g->parts * NR),
                        EX_MIN(g->n, nb * (t + 1) / g->parts * NR));
    } else {
      const int64_t mb = (g->m + MR - 1) / MR;
      err = sgemm_range(g, EX_MIN(g->m, mb * t / g->parts * MR),
                        EX_MIN(g->m, mb * (t + 1) / g->parts * MR), 0, g->n);
    }
    if (err) g->err = err;
  }
}

/* ---- GEMV: y[j] = sum_p M[j*so + p*sr] * x[p*xs], j in [0, n) ---- */
typedef struct {
  float *y;
  const float *M, *x;
  int64_t so, sr, xs, k;
} gv_ctx;

static float dot(const float *m, int64_t sr, const float *x, int64_t xs, int64_t k) {
  if (sr == 1 && xs == 1) {
    float acc[16] = {0};
    int64_t p = 0;
    for (; p + 16 <= k; p += 16)
      for (int l = 0; l < 16; l++) acc[l] += m[p + l] * x[p + l];
    for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; p < k; p++) s += m[p] * x[p];
    return s;
  }
  float s = 0.0f;
  for (int64_t p = 0; p < k; p++) s += m[p * sr] * x[p * xs];
  return s;
}

static void gemv_task(void *vctx, int64_t j0, int64_t j1) {
  const gv_ctx *g = vctx;
  if (g->so == 1 && g->sr != 1) { /* axpy form: stream rows of M, y block stays in L1 */
    for (int64_t jb = j0; jb < j1; jb += 2048) {
      const int64_t je = EX_MIN(j1, jb + 2048);
      float *y = g->y;
      for (int64_t j = jb; j < je; j++) y[j] = 0.0f;
      for (int64_t p = 0; p < g->k; p++) {
        const float xv = g->x[p * g->xs], *row = g->M + p * g->sr;
        for (int64_t j = jb; j < je; j++) y[j] += xv * row[j];
      }
    }
  } else {
    for (int64_t j = j0; j < j1; j++) g->y[j] = dot(g->M + j * g->so, g->sr, g->x, g->xs, g->k);
  }
}

static int sgemm(const float *a, int64_t ars, int64_t acs, const float *b, int64_t brs,
                 int64_t bcs, float *c, int64_t m, int64_t n, int64_t k) {
  if (k == 0) {
    memset(c, 0, (size_t)(m * n) * sizeof(float));
    return EX_OK;
  }
  if (m == 1 || n == 1) {
    gv_ctx g = m == 1 ? (gv_ctx){c, b, a, bcs, brs, acs, k} : (gv_ctx){c, a, b, ars, acs, brs, k};
    const int64_t nout = m == 1 ? n : m;
    ex_parallel_for(nout, EX_MAX(16, 65536 / k), gemv_task, &g);
    return EX_OK;
  }
  sg_ctx g = {a, b, c, ars, acs, brs, bcs, m, n, k, 1, 1, 0};
  const int nt = ex_pool_width();
  if (nt > 1 && (double)m * n * k >= 262144.0) {
    const int64_t nb = (n + NR - 1) / NR, mb = (m + MR - 1) / MR;
    g.split_n = nb >= mb;
    g.parts = EX_MIN(nt, g.split_n ? nb : mb);
    ex_parallel_for(g.parts, 1, sgemm_task, &g);
    return g.err;
  }
  return sgemm_range(&g, 0, m, 0, n);
}

static void matmul_i64(const int64_t *a, int64_t ars, int64_t acs, const int64_t *b, int64_t brs,
                       int64_t bcs, int64_t *c, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; i++) {
    uint64_t *ci = (uint64_t *)c + i * n;
    for (int64_t j = 0; j < n; j++) ci[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      const uint64_t av = (uint64_t)a[i * ars + p * acs];
      for (int64_t j = 0; j < n; j++) ci[j] += av * (uint64_t)b[p * brs + j * bcs];
    }
  }
}

/* ---- batching ---- */
typedef struct {
  int32_t dtype, nbd;
  const char *a, *b;
  char *c;
  int64_t ars, acs, brs, bcs, m, n, k;
  const int64_t *shape, *abs_, *bbs;
  _Atomic int err;
} mm_ctx;

static void mm_batches(void *vctx, int64_t b0, int64_t b1) {
  mm_ctx *g = vctx;
  const int es = g->dtype == EX_F32 ? 4 : 8;
  for (int64_t bi = b0; bi < b1; bi++) {
    int64_t aoff = 0, boff = 0;
    for (int64_t d = g->nbd - 1, r = bi; d >= 0; d--) {
      const int64_t ix = r % g->shape[d];
      r /= g->shape[d];
      aoff += ix * g->abs_[d];
      boff += ix * g->bbs[d];
    }
    const char *a = g->a + aoff * es, *b = g->b + boff * es;
    char *c = g->c + bi * g->m * g->n * es;
    if (g->dtype == EX_F32) {
      int err = sgemm((const float *)a, g->ars, g->acs, (const float *)b, g->brs, g->bcs,
                      (float *)c, g->m, g->n, g->k);
      if (err) g->err = err;
    } else {
      matmul_i64((const int64_t *)a, g->ars, g->acs, (const int64_t *)b, g->brs, g->bcs,
                 (int64_t *)c, g->m, g->n, g->k);
    }
  }
}

static int matmul(int32_t dtype, const void *a, int64_t a_rs, int64_t a_cs,
                  const void *b, int64_t b_rs, int64_t b_cs, void *c,
                  int64_t m, int64_t n, int64_t k,
                  int32_t nbatch_dims, const int64_t *batch_shape,
                  const int64_t *a_bs, const int64_t *b_bs) {
  if (dtype != EX_F32 && dtype != EX_I64) return EX_EDTYPE;
  if (m < 0 || n < 0 || k < 0 || nbatch_dims < 0 || nbatch_dims > 6) return EX_EINVAL;
  if (nbatch_dims && (!batch_shape || !a_bs || !b_bs)) return EX_EINVAL;
  int64_t nb = 1;
  for (int d = 0; d < nbatch_dims; d++) {
    if (batch_shape[d] < 0) return EX_EINVAL;
    nb *= batch_shape[d];
  }
  if (nb * m * n == 0) return EX_OK;
  if (!c || (k > 0 && (!a || !b))) return EX_EINVAL;
  mm_ctx g = {dtype, nbatch_dims, a, b, c, a_rs, a_cs, b_rs, b_cs, m, n, k,
              batch_shape, a_bs, b_bs, 0};
  /* many small products: one per task; otherwise each product uses the pool itself */
  const double flops = (double)m * n * (k + 1);
  if (nb > 1 && flops < 2097152.0) ex_parallel_for(nb, (int64_t)(262144.0 / flops) + 1, mm_batches, &g);
  else mm_batches(&g, 0, nb);
  return g.err;
}
