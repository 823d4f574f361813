/* ex_matmul and ex_linear.  Reference: the int64 triple loop (matmul_i64) and gemv's strided dot.
 * Optimized f32 path (Goto/BLIS scheme): B is packed into KC x NR panels, A into MR x KC
 * panels, and an MR x NR register-blocked micro-kernel runs over them with KC/MC/NC cache
 * blocking; 2+ threads claim disjoint column (or row) ranges, about 4 per thread, from the pool
 * (with row ranges they pack each block of B together and share it); constant weights may come
 * pre-packed as A or B.  The AVX2 micro-kernel keeps a
 * 6x16 tile in 12 ymm accumulators with FMA, the AVX-512 one a 14x32 tile in 28 zmm; the
 * portable one uses GNU vector extensions.  B may be f16/bf16 (widened while packing, F16C).
 * An epilogue (bias per row or column, residual add, activation) is applied to each tile right
 * after its last K block, while it is still in L1.  The AVX-512 kernel reads row-major f32 B in
 * place instead of packing it when A has few rows (or B many columns), a small row-major A in
 * place too, and prefetches pre-packed weights ahead: they stream from memory, page by page; each
 * tile also fetches a share of the weights' next panel into L2 (sgemm_range).
 * Each tile prefetches the next one's C rows (a C of 1 MB or more) and residual rows.
 * Skinny products (m <= 16) against a transposed B (weights stored [n, k], as nn.Linear) skip
 * packing: a dot-product kernel streams each weight row once for 4 rows of A at a time.
 * One row of A against float32 weights walks 4 parts of the weight rows side by side (sk_gemv).
 * m == 1 or n == 1 with f32 B goes to a GEMV (dot or axpy form, whichever walks memory
 * contiguously). */
#include "common.h"

/* KC: the B micro-panel (KC x NR) is streamed from L2 with the A micro-panel; a long KC means
 * fewer passes over C.  512 measured best for the AVX-512 kernel on a 48K L1 / 1M L2 core. */
#ifdef EX_AVX512
#define MR 14
#define NR 32
#define KC 512
#define MC 84
#define MG 1
#else
#define MR 6
#define NR 16
#define KC 256
#define MC 144
#define MG 2
#endif
#define NC 4096
#define B_L2 131072 /* floats (512 KB): a block of B that stays in L2 while rows of A reuse it */
/* MG: a product whose C is written once (one K block) walks its MC rows in groups of MG tiles,
 * each group across all its columns before the next: MC rows of C (and of a residual) advancing
 * a tile at a time were too many streams for the hardware prefetcher, and with C past L2 their
 * line fills held up the micro-kernel.  On a 2 MB L2 Intel core, 256 x 3136 x 64 (a 1x1
 * convolution at 56 x 56) into a cold C: 100 -> 135-145 GFLOP/s with AVX-512, 67 -> 86 with
 * AVX2; with a residual added, 63 -> 110-115 and 37 -> 72.  Only while the block of B the groups
 * each walk again stays in L2 (kc x nc at most B_L2): 49 x 2048 x 512 against 4 MB of packed
 * weights (a 1x1 convolution at 7 x 7, transposed) ran 15% slower grouped */
#define ADIR_MAX 24576 /* floats: 96 KB */
#define UK_COLS 4 /* a tile's last vector of at most this many columns goes a column at a time */
/* floats: the skinny GEMVs prefetch their weight stream 16 KB ahead into L2 (into L1, as the
 * AVX2 one once did, 1 x 4096 x 4096 ran at 0.8 of OpenBLAS's speed with AVX-512; into L2 at 1.1).
 * The AVX2 build's float32 GEMV (sk_gemv) does not: on the 2-core Zen 3 machine of
 * docs/benchmarks.rst, 1 x 4096 x 4096 read 16.3 - 17.5 GB/s with it and 20.3 - 21.8 without at
 * one thread (NumPy 18.7 - 20.5), 19.0 - 25.5 and 22.6 - 27.5 at two (medians of 40 calls, both
 * builds in one process); its float16 GEMV (sk_block) keeps it: 9.0 / 14.4 GB/s at one / two
 * threads with it, 7.7 / 13.1 without. */
#define SK_PF 4096
#define ROUND_UP(x, r) (((x) + (r) - 1) / (r) * (r))

/* the K block length for a product of depth k: at most KC, blocks balanced (k = 576 runs as two
 * blocks of 288 rather than 512 + 64); a multiple of 8 but for the last block */
static inline int64_t kc_blocks(int64_t k, int64_t cap) {
  const int64_t nb = (k + cap - 1) / cap;
  return EX_MIN(cap, ROUND_UP((k + nb - 1) / nb, 8));
}
static inline int64_t kc_step(int64_t k) { return kc_blocks(k, KC); }

/* the K block of a product with neither operand pre-packed (pre-packed ones keep kc_step, their
 * format).  C is read and written once per K block, so a deep product whose C (4 MB or more) is
 * past L2 takes blocks of up to 2 KC under the AVX-512 kernel: 2048- and 4096-square products
 * ran 4-5% faster at 1 and 2 threads (1024-square, 2 blocks of 512, ran slower as one of 1024) */
static inline int64_t kc_for(int64_t m, int64_t n, int64_t k) {
#ifdef EX_AVX512
  if (k >= 4 * KC && m * n >= ((int64_t)1 << 20)) return kc_blocks(k, 2 * KC);
#else
  (void)m, (void)n;
#endif
  return kc_step(k);
}

/* columns per block of B packed by sgemm_range for K blocks of kc and `rows` rows of A: with
 * few rows, a packed block of at most about B_L2 floats, whole NR panels,
 * balanced over the n columns; with many, NC (the block is reused by enough rows to pay for
 * its trips through L3, and a narrow one costs large square products 15%) */
static inline int64_t nc_step(int64_t kc, int64_t n, int64_t rows) {
  if (n <= 0 || rows > 4 * MC) return NC;
  const int64_t cap = EX_MAX(NR, EX_MIN(NC, B_L2 / EX_MAX(kc, 1) / NR * NR));
  const int64_t nb = (n + cap - 1) / cap;
  return ROUND_UP((n + nb - 1) / nb, NR);
}

/* ---- epilogue ---- */
typedef struct {
  const float *bias; /* NULL, or per row (bias_rows) / per column of C */
  int bias_rows;
  const float *res;  /* NULL, or a residual laid out like C with row stride res_ld */
  int64_t res_ld;
  int act;           /* ex_act */
} epi_t;

static const epi_t EPI_NONE = {NULL, 0, NULL, 0, EX_ACT_NONE};

static inline float act_f(int act, float v) {
  switch (act) {
  case EX_ACT_RELU: return v < 0.0f ? 0.0f : v;
  case EX_ACT_RELU6: return v < 0.0f ? 0.0f : v > 6.0f ? 6.0f : v;
  case EX_ACT_SILU: return v / (1.0f + expf(-v));
  case EX_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  case EX_ACT_GELU_TANH:
    return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
  case EX_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
  default: return v;
  }
}

static inline void act_row(int act, float *c, int64_t n) {
  switch (act) {
  case EX_ACT_NONE: return;
  case EX_ACT_RELU: for (int64_t j = 0; j < n; j++) c[j] = c[j] < 0.0f ? 0.0f : c[j]; return;
  case EX_ACT_RELU6:
    for (int64_t j = 0; j < n; j++) c[j] = c[j] < 0.0f ? 0.0f : c[j] > 6.0f ? 6.0f : c[j];
    return;
  default: for (int64_t j = 0; j < n; j++) c[j] = act_f(act, c[j]);
  }
}

/* apply the epilogue to C[i0:i0+mr, j0:j0+nr] (c points at C[i0, j0]), one pass per row for a
 * row bias (convolutions) with the common activations */
#define EPI_LOOP(EXPR)                                                                  \
  do {                                                                                  \
    if (r)                                                                              \
      for (int64_t j = 0; j < nr; j++) { const float v = ci[j] + rb + r[j]; ci[j] = (EXPR); } \
    else                                                                                \
      for (int64_t j = 0; j < nr; j++) { const float v = ci[j] + rb; ci[j] = (EXPR); }  \
  } while (0)

static void epi_tile(const epi_t *e, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t mr,
                     int64_t nr) {
  if (!e->bias && !e->res && e->act == EX_ACT_NONE) return;
  for (int64_t i = 0; i < mr; i++) {
    float *ci = c + i * ldc;
    const float rb = e->bias && e->bias_rows ? e->bias[i0 + i] : 0.0f;
    const float *r = e->res ? e->res + (i0 + i) * e->res_ld + j0 : NULL;
    if (e->bias && !e->bias_rows) {
      const float *cb = e->bias + j0;
      for (int64_t j = 0; j < nr; j++) ci[j] += cb[j];
    }
    switch (e->act) {
    case EX_ACT_NONE: EPI_LOOP(v); break;
    case EX_ACT_RELU: EPI_LOOP(v < 0.0f ? 0.0f : v); break;
    case EX_ACT_RELU6: EPI_LOOP(v < 0.0f ? 0.0f : v > 6.0f ? 6.0f : v); break;
    default: EPI_LOOP(v); act_row(e->act, ci, nr);
    }
  }
}
#undef EPI_LOOP

/* ap <- A[0:mc, 0:kc] as MR-row panels, each kc columns of MR values (zero padded) */
static void pack_a(int64_t mc, int64_t kc, const float *a, int64_t rs, int64_t cs, float *ap) {
  for (int64_t i0 = 0; i0 < mc; i0 += MR, ap += kc * MR) {
    const int64_t mr = EX_MIN(MR, mc - i0);
    const float *s = a + i0 * rs;
    if (mr == MR && cs == 1) {
      for (int i = 0; i < MR; i++)
        for (int64_t p = 0; p < kc; p++) ap[p * MR + i] = s[i * rs + p];
    } else if (mr == MR && rs == 1) {
      for (int64_t p = 0; p < kc; p++) memcpy(ap + p * MR, s + p * cs, MR * sizeof(float));
    } else {
      for (int64_t p = 0; p < kc; p++)
        for (int i = 0; i < MR; i++) ap[p * MR + i] = i < mr ? s[i * rs + p * cs] : 0.0f;
    }
  }
}

static inline float ld_w(const void *b, int32_t dt, int64_t i) {
  if (dt == EX_F32) return ((const float *)b)[i];
  if (dt == EX_F16) return f16_to_f32(((const uint16_t *)b)[i]);
  return bf16_to_f32(((const uint16_t *)b)[i]);
}

/* bp <- B[0:kc, 0:nc] as NR-column panels, each kc rows of NR values (zero padded); B of
 * dtype dt (f32, f16, bf16), element offset of B[0, 0] = off */
static void pack_b(int64_t kc, int64_t nc, const void *b, int32_t dt, int64_t off, int64_t rs,
                   int64_t cs, float *bp) {
  for (int64_t j0 = 0; j0 < nc; j0 += NR, bp += kc * NR) {
    const int64_t nr = EX_MIN(NR, nc - j0), o = off + j0 * cs;
    if (dt == EX_F32) {
      const float *s = (const float *)b + o;
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
    } else if (nr == NR && cs == 1 && dt == EX_F16) {
      const uint16_t *s = (const uint16_t *)b + o;
      for (int64_t p = 0; p < kc; p++) f16_load(bp + p * NR, s + p * rs, 1, NR);
    } else {
      for (int64_t p = 0; p < kc; p++)
        for (int j = 0; j < NR; j++) bp[p * NR + j] = j < nr ? ld_w(b, dt, o + j * cs + p * rs) : 0.0f;
    }
  }
}

/* C[0:MR, 0:NR] (row stride ldc) = or += packed A panel x B panel (packed, or rows bs apart
 * read in place); pf: the prefetches (uk_body's notes) */
enum { UK_PF_A = 1, UK_PF_B = 2, UK_PF_BROW = 4, UK_PF_BFAR = 8 };
#if defined(EX_AVX512)
/* The tile's epilogue as the AVX-512 micro-kernel applies it in registers, before the store:
 * bias per row (rb) or per column (cb), residual rows, ReLU / ReLU6.  Other activations are
 * applied by epi_tile after the store. */
typedef struct {
  const float *rb, *cb, *res; /* at the tile's first row / column, or NULL */
  int64_t res_ld;
  int act;
} uk_epi;

/* the first `rows` rows (rows <= MR) and nv 16-column vectors of the tile, the last vector
 * stored under mask mk (a narrow last panel: B's zero padding is not computed); A an MR-row
 * packed panel (adir 0), rows `as` apart read in place (1), or row i of step p read in place at
 * a + ko[p] + i (2).  e: NULL, or the epilogue (last K block only).  pf: pre-packed weights
 * stream from memory (UK_PF_A: A is them, UK_PF_B: B), prefetched further ahead, since the
 * hardware prefetcher restarts at every 4 KB page of a panel; otherwise A just a little ahead.
 * far: NULL, or a share of the weights' next panel, fetched into L2 a line every 64 / fstep
 * steps. */
static inline __attribute__((always_inline)) void uk_body(const int rows, const int nv, const int adir,
                                                           __mmask16 mk, int64_t kc, const float *a,
                                                           int64_t as, const float *b, int64_t bs, float *c,
                                                           int64_t ldc, int acc, const uk_epi *e, int pf,
                                                           const char *far, int64_t fstep, const int32_t *ko) {
  const int64_t da = pf & UK_PF_A ? 64 * MR : 4 * MR;
  /* the last vector's columns: B loads (B may be unpacked, rows bs apart, ending at the panel's
   * last column), C loads and stores under mk */
  const __mmask16 m0 = nv == 2 ? (__mmask16)0xFFFF : mk, m1 = mk;
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 14
  for (int i = 0; i < rows; i++) { c0[i] = _mm512_setzero_ps(); c1[i] = c0[i]; }
  for (int64_t p = 0; p < kc; p++) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, b); /* pre-packed B may be unaligned */
    const __m512 b1 = nv == 2 ? _mm512_maskz_loadu_ps(m1, b + 16) : b0;
    const float *ap = adir == 2 ? a + ko[p] : a;
    if (!adir) _mm_prefetch((const char *)(a + da), _MM_HINT_T0);
    if (adir == 2) { /* both lines of the step 8 on: 14 floats past the start of one often span two */
      _mm_prefetch((const char *)(a + ko[p + 8]), _MM_HINT_T0);
      _mm_prefetch((const char *)(a + ko[p + 8] + rows - 1), _MM_HINT_T0);
    }
    if (pf & UK_PF_B) { /* both lines of the B row 32 iterations ahead */
      _mm_prefetch((const char *)(b + 32 * NR), _MM_HINT_T0);
      _mm_prefetch((const char *)(b + 32 * NR + 16), _MM_HINT_T0);
    }
    if (far) {
      _mm_prefetch(far, _MM_HINT_T1);
      far += fstep;
    }
    if (pf & UK_PF_BROW) { /* unpacked B: this row's next panel */
      _mm_prefetch((const char *)(b + NR), _MM_HINT_T0);
      _mm_prefetch((const char *)(b + NR + 16), _MM_HINT_T0);
    } else if (pf & UK_PF_BFAR) { /* or this panel's row 8 steps on, and the next panel's into L2 */
      _mm_prefetch((const char *)(b + 8 * bs), _MM_HINT_T0);
      _mm_prefetch((const char *)(b + 8 * bs + 16), _MM_HINT_T0);
      _mm_prefetch((const char *)(b + NR), _MM_HINT_T1);
      _mm_prefetch((const char *)(b + NR + 16), _MM_HINT_T1);
    }
#pragma GCC unroll 14
    for (int i = 0; i < rows; i++) {
      const __m512 av = _mm512_set1_ps(adir == 1 ? a[i * as] : ap[i]);
      c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
      if (nv == 2) c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
    }
    a += adir == 1 ? 1 : adir ? 0 : MR;
    b += bs;
  }
  __m512 cb0 = _mm512_setzero_ps(), cb1 = cb0;
  if (e && e->cb) {
    cb0 = _mm512_maskz_loadu_ps(m0, e->cb);
    if (nv == 2) cb1 = _mm512_maskz_loadu_ps(m1, e->cb + 16);
  }
#pragma GCC unroll 14
  for (int i = 0; i < rows; i++) {
    float *ci = c + i * ldc;
    if (acc) {
      c0[i] = _mm512_add_ps(c0[i], _mm512_maskz_loadu_ps(m0, ci));
      if (nv == 2) c1[i] = _mm512_add_ps(c1[i], _mm512_maskz_loadu_ps(m1, ci + 16));
    }
    if (e) {
      if (e->rb) {
        const __m512 bv = _mm512_set1_ps(e->rb[i]);
        c0[i] = _mm512_add_ps(c0[i], bv);
        c1[i] = _mm512_add_ps(c1[i], bv);
      }
      if (e->cb) { c0[i] = _mm512_add_ps(c0[i], cb0); c1[i] = _mm512_add_ps(c1[i], cb1); }
      if (e->res) {
        const float *ri = e->res + i * e->res_ld;
        c0[i] = _mm512_add_ps(c0[i], _mm512_maskz_loadu_ps(m0, ri));
        if (nv == 2) c1[i] = _mm512_add_ps(c1[i], _mm512_maskz_loadu_ps(m1, ri + 16));
      }
      c0[i] = relu512(c0[i], e->act);
      c1[i] = relu512(c1[i], e->act);
    }
    if (nv == 2) {
      _mm512_storeu_ps(ci, c0[i]);
      _mm512_mask_storeu_ps(ci + 16, m1, c1[i]);
    } else {
      _mm512_mask_storeu_ps(ci, m0, c0[i]);
    }
  }
}

static int ukernel(int64_t kc, const float *a, const float *b, int64_t bs, float *c, int64_t ldc, int acc,
                   int pf, const char *far, int64_t fstep, const epi_t *e, int64_t i0, int64_t j0, int64_t rows) {
  (void)e, (void)i0, (void)j0, (void)rows; /* not reached: uk_tile takes every tile */
  uk_body(MR, 2, 0, 0xFFFF, kc, a, 0, b, bs, c, ldc, acc, NULL, pf, far, fstep, NULL);
  return 0;
}

/* columns [j0, j0 + ncol) of a tile with a packed A panel, one column at a time: the rows of A
 * as one vector against each value of the column broadcast.  A last vector of a few columns
 * costs uk_body as much as a full one (a Winograd GEMM of 49 tiles computes 64 columns); this
 * costs each column about 1/16 of that. */
static void uk_cols(int rows, int j0, int ncol, int64_t kc, const float *a, const float *b, int64_t bs, float *c,
                    int64_t ldc, int acc, const uk_epi *e) {
  const __mmask16 mr = (__mmask16)((1u << rows) - 1);
  for (int j = j0; j < j0 + ncol; j++) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0; /* four chains: the FMA latency */
    const float *bj = b + j;
    int64_t p = 0;
    for (; p + 4 <= kc; p += 4) {
      s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mr, a + p * MR), _mm512_set1_ps(bj[p * bs]), s0);
      s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mr, a + (p + 1) * MR), _mm512_set1_ps(bj[(p + 1) * bs]), s1);
      s2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mr, a + (p + 2) * MR), _mm512_set1_ps(bj[(p + 2) * bs]), s2);
      s3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mr, a + (p + 3) * MR), _mm512_set1_ps(bj[(p + 3) * bs]), s3);
    }
    for (; p < kc; p++) s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mr, a + p * MR), _mm512_set1_ps(bj[p * bs]), s0);
    float v[16];
    _mm512_storeu_ps(v, _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    for (int i = 0; i < rows; i++) {
      float *ci = c + i * ldc + j, r = acc ? *ci + v[i] : v[i];
      if (e) {
        if (e->rb) r += e->rb[i];
        if (e->cb) r += e->cb[j];
        if (e->res) r += e->res[i * e->res_ld + j];
        r = act_f(e->act, r);
      }
      *ci = r;
    }
  }
}

/* one instance per row count, width and A form (packed panel, or rows `as` apart read in place):
 * a partial panel (m not a multiple of MR, or n of NR) computes only its rows and (to 16
 * columns) its width */
typedef void (*uk_fn)(int64_t, const float *, int64_t, const float *, int64_t, float *, int64_t, int,
                      const uk_epi *, __mmask16, int, const char *, int64_t);
#define UK_FN(NAME, R, NV, AD)                                                                   \
  static void NAME(int64_t kc, const float *a, int64_t as, const float *b, int64_t bs, float *c, \
                   int64_t ldc, int acc, const uk_epi *e, __mmask16 mk, int pf, const char *far,  \
                   int64_t fstep) {                                                              \
    uk_body(R, NV, AD, mk, kc, a, as, b, bs, c, ldc, acc, e, pf, far, fstep, NULL);              \
  }
#define UK_ROWS(R) UK_FN(uk_half##R, R, 1, 0) UK_FN(uk_rows##R, R, 2, 0) \
                   UK_FN(uk_dhalf##R, R, 1, 1) UK_FN(uk_drows##R, R, 2, 1)
UK_ROWS(1) UK_ROWS(2) UK_ROWS(3) UK_ROWS(4) UK_ROWS(5) UK_ROWS(6) UK_ROWS(7)
UK_ROWS(8) UK_ROWS(9) UK_ROWS(10) UK_ROWS(11) UK_ROWS(12) UK_ROWS(13) UK_ROWS(14)
#undef UK_ROWS
#undef UK_FN
/* the rows of A read in place at per-step offsets: row i of step p at a[ko[p] + i] (ko has 8
 * entries past kc, for the prefetch), B a packed panel that streams (conv_s2's implicit GEMM) */
typedef void (*uk_ko_fn)(int64_t, const float *, const int32_t *, const float *, float *, int64_t, int, __mmask16,
                         const char *, int64_t);
#define UK_KO(NAME, R, NV)                                                                          \
  static void NAME(int64_t kc, const float *a, const int32_t *ko, const float *b, float *c, int64_t ldc, \
                   int acc, __mmask16 mk, const char *far, int64_t fstep) {                        \
    uk_body(R, NV, 2, mk, kc, a, 1, b, NR, c, ldc, acc, NULL, UK_PF_B, far, fstep, ko);             \
  }
#define UK_ROWS(R) UK_KO(uk_khalf##R, R, 1) UK_KO(uk_krows##R, R, 2)
UK_ROWS(1) UK_ROWS(2) UK_ROWS(3) UK_ROWS(4) UK_ROWS(5) UK_ROWS(6) UK_ROWS(7)
UK_ROWS(8) UK_ROWS(9) UK_ROWS(10) UK_ROWS(11) UK_ROWS(12) UK_ROWS(13) UK_ROWS(14)
#undef UK_ROWS
#undef UK_KO
#define UK_ALL(P) {NULL, P##1, P##2, P##3, P##4, P##5, P##6, P##7, P##8, P##9, P##10, P##11, P##12, P##13, P##14}
static const uk_fn UK_TAB[2][2][MR + 1] = {{UK_ALL(uk_half), UK_ALL(uk_rows)}, {UK_ALL(uk_dhalf), UK_ALL(uk_drows)}};
static const uk_ko_fn UK_KO_TAB[2][MR + 1] = {UK_ALL(uk_khalf), UK_ALL(uk_krows)};
#undef UK_ALL

/* an mr x nr tile straight into C, with the epilogue in registers when it is one the kernel
 * knows (*fused: the caller then skips epi_tile); 0 if it must go the generic way */
static int uk_tile(const epi_t *ep, int last, int64_t i0, int64_t j0, int64_t mr, int64_t nr, int64_t kc,
                   const float *a, int64_t as, const float *b, int64_t bs, float *c, int64_t ldc, int acc,
                   int pf, const char *far, int64_t fstep, int *fused) {
  uk_epi e = {NULL, NULL, NULL, 0, EX_ACT_NONE};
  const int reg = ep->act == EX_ACT_NONE || ep->act == EX_ACT_RELU || ep->act == EX_ACT_RELU6;
  *fused = 0;
  if (last && reg && (ep->bias || ep->res || ep->act != EX_ACT_NONE)) {
    e.rb = ep->bias && ep->bias_rows ? ep->bias + i0 : NULL;
    e.cb = ep->bias && !ep->bias_rows ? ep->bias + j0 : NULL;
    e.res = ep->res ? ep->res + i0 * ep->res_ld + j0 : NULL;
    e.res_ld = ep->res_ld;
    e.act = ep->act;
    *fused = 1;
  }
  const int nv = nr > 16 ? 2 : 1, w = (int)nr - 16 * (nv - 1); /* columns of the last vector */
  if (!as && w <= UK_COLS) { /* a packed A panel and a last vector of a few columns */
    if (nv == 2) UK_TAB[0][0][mr](kc, a, 0, b, bs, c, ldc, acc, *fused ? &e : NULL, 0xFFFF, pf, far, fstep);
    uk_cols((int)mr, 16 * (nv - 1), w, kc, a, b, bs, c, ldc, acc, *fused ? &e : NULL);
    return 1;
  }
  const __mmask16 mk = (__mmask16)((1u << w) - 1);
  /* as: 0 for a packed A panel, else A's row stride read in place, negative for a flipped A */
  UK_TAB[as != 0][nv - 1][mr](kc, a, as, b, bs, c, ldc, acc, *fused ? &e : NULL, mk, pf, far, fstep);
  return 1;
}
#elif defined(EX_AVX2)
/* pf: UK_PF_BROW (B read in place: each row's next panel into L1 as this one is read) or
 * UK_PF_BFAR (rows far apart: this panel's row 8 steps on into L1, the next panel's into L2),
 * one instance each */
static inline __attribute__((always_inline)) void uk_body(int64_t kc, const float *a, const float *b, int64_t bs,
                                                           float *c, int64_t ldc, int acc, const int pf,
                                                           const char *far, int64_t fstep, const epi_t *e,
                                                           int64_t i0, int64_t j0, int64_t rows) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  /* both ends of each C row: a row not 64-byte aligned spans two lines, and a second line left to
   * a demand miss at the end cost 2048-square products a quarter of their speed */
  for (int i = 0; i < rows; i++) {
    _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);
  }
#define ROW(i, r0, r1)                                   \
  av = _mm256_broadcast_ss(a + i);                       \
  r0 = _mm256_fmadd_ps(av, b0, r0);                      \
  r1 = _mm256_fmadd_ps(av, b1, r1)
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; p++) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 av;
    _mm_prefetch((const char *)(a + 8 * MR), _MM_HINT_T0);
    if (far) {
      _mm_prefetch(far, _MM_HINT_T1);
      far += fstep;
    }
    if (pf == UK_PF_BROW) {
      _mm_prefetch((const char *)(b + NR), _MM_HINT_T0);
      _mm_prefetch((const char *)(b + 2 * NR - 1), _MM_HINT_T0);
    } else if (pf == UK_PF_BFAR) {
      _mm_prefetch((const char *)(b + 8 * bs), _MM_HINT_T0);
      _mm_prefetch((const char *)(b + 8 * bs + NR - 1), _MM_HINT_T0);
      _mm_prefetch((const char *)(b + NR), _MM_HINT_T1);
      _mm_prefetch((const char *)(b + 2 * NR - 1), _MM_HINT_T1);
    }
    ROW(0, c00, c01); ROW(1, c10, c11); ROW(2, c20, c21);
    ROW(3, c30, c31); ROW(4, c40, c41); ROW(5, c50, c51);
    a += MR;
    b += bs;
  }
#undef ROW
  /* the epilogue in registers, in epi_tile's order: column bias, row bias, residual, ReLU(6) as one
   * max and one min whatever the activation (relu256's branches, per row, made MobileNetV2's
   * small-K layers 4-13% slower); the constant first, so NaN passes */
  const float *rb = e && e->bias && e->bias_rows ? e->bias + i0 : NULL,
              *rs = e && e->res ? e->res + i0 * e->res_ld + j0 : NULL;
  const int cbias = e && e->bias && !e->bias_rows, relu = e && e->act != EX_ACT_NONE;
  const __m256 cb0 = cbias ? _mm256_loadu_ps(e->bias + j0) : _mm256_setzero_ps(),
               cb1 = cbias ? _mm256_loadu_ps(e->bias + j0 + 8) : cb0,
               six = _mm256_set1_ps(e && e->act == EX_ACT_RELU6 ? 6.0f : INFINITY);
#define OUT(i, r0, r1)                                                                   \
  if (i >= rows) return;                                                                 \
  if (acc) {                                                                             \
    r0 = _mm256_add_ps(r0, _mm256_loadu_ps(c + i * ldc));                                \
    r1 = _mm256_add_ps(r1, _mm256_loadu_ps(c + i * ldc + 8));                            \
  }                                                                                      \
  if (e) {                                                                               \
    if (cbias) { r0 = _mm256_add_ps(r0, cb0); r1 = _mm256_add_ps(r1, cb1); }             \
    if (rb) {                                                                            \
      const __m256 bv = _mm256_broadcast_ss(rb + i);                                     \
      r0 = _mm256_add_ps(r0, bv);                                                        \
      r1 = _mm256_add_ps(r1, bv);                                                        \
    }                                                                                    \
    if (rs) {                                                                            \
      r0 = _mm256_add_ps(r0, _mm256_loadu_ps(rs + i * e->res_ld));                       \
      r1 = _mm256_add_ps(r1, _mm256_loadu_ps(rs + i * e->res_ld + 8));                   \
    }                                                                                    \
    if (relu) {                                                                          \
      r0 = _mm256_min_ps(six, _mm256_max_ps(_mm256_setzero_ps(), r0));                   \
      r1 = _mm256_min_ps(six, _mm256_max_ps(_mm256_setzero_ps(), r1));                   \
    }                                                                                    \
  }                                                                                      \
  _mm256_storeu_ps(c + i * ldc, r0);                                                     \
  _mm256_storeu_ps(c + i * ldc + 8, r1)
  OUT(0, c00, c01); OUT(1, c10, c11); OUT(2, c20, c21);
  OUT(3, c30, c31); OUT(4, c40, c41); OUT(5, c50, c51);
#undef OUT
}

/* the first `rows` rows of the tile (the panel's zero rows past them are computed, not stored);
 * e: NULL, or the epilogue of the tile at C[i0, j0], which it applies (returning 1) when it is one
 * the registers take: biases, residual, ReLU / ReLU6 */
static int ukernel(int64_t kc, const float *a, const float *b, int64_t bs, float *c, int64_t ldc, int acc,
                   int pf, const char *far, int64_t fstep, const epi_t *e, int64_t i0, int64_t j0, int64_t rows) {
  if (e && (e->act > EX_ACT_RELU6 || (!e->bias && !e->res && e->act == EX_ACT_NONE))) e = NULL;
  if (pf & UK_PF_BROW) uk_body(kc, a, b, bs, c, ldc, acc, UK_PF_BROW, far, fstep, e, i0, j0, rows);
  else if (pf & UK_PF_BFAR) uk_body(kc, a, b, bs, c, ldc, acc, UK_PF_BFAR, far, fstep, e, i0, j0, rows);
  else uk_body(kc, a, b, NR, c, ldc, acc, 0, far, fstep, e, i0, j0, rows);
  return e != NULL;
}
#else
/* Portable: GNU vector extensions (lowered to whatever SIMD the baseline has, e.g. SSE2), one
 * 6x8 half of the tile at a time so the 6 accumulators fit in 16 registers. */
typedef float v8f __attribute__((vector_size(32)));
static int ukernel(int64_t kc, const float *a, const float *b, int64_t bs, float *c, int64_t ldc, int acc,
                   int pf, const char *far, int64_t fstep, const epi_t *e, int64_t i0, int64_t j0, int64_t rows) {
  (void)pf, (void)far, (void)fstep, (void)e, (void)i0, (void)j0;
  for (int h = 0; h < NR; h += 8) {
    v8f t[MR] = {{0}};
    const float *pa = a, *pb = b + h;
    for (int64_t p = 0; p < kc; p++, pa += MR, pb += bs) {
      v8f bv;
      memcpy(&bv, pb, sizeof bv);
      for (int i = 0; i < MR; i++) t[i] += pa[i] * bv;
    }
    for (int i = 0; i < rows; i++) {
      v8f cv;
      if (acc) {
        memcpy(&cv, c + i * ldc + h, sizeof cv);
        t[i] += cv;
      }
      memcpy(c + i * ldc + h, &t[i], sizeof cv);
    }
  }
  return 0;
}
#endif

#if defined(EX_AVX2) && !defined(EX_AVX512)
/* a tile of at most UK_COLS columns (the last of a product whose width leaves a few past a
 * 16-column panel: 49 Winograd tiles), a column at a time as uk_cols does with AVX-512, instead
 * of a whole 6 x 16 kernel into the edge buffer; the caller applies the epilogue */
static int uk_tile(const epi_t *ep, int last, int64_t i0, int64_t j0, int64_t mr, int64_t nr, int64_t kc,
                   const float *a, int64_t as, const float *b, int64_t bs, float *c, int64_t ldc, int acc,
                   int pf, const char *far, int64_t fstep, int *fused) {
  (void)ep; (void)last; (void)i0; (void)j0; (void)as; (void)pf; (void)far; (void)fstep;
  *fused = 0;
  if (nr > UK_COLS) return 0;
  const __m256i rows = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)mr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int64_t j = 0; j < nr; j++) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0; /* four chains: the FMA latency */
    const float *bj = b + j;
    int64_t p = 0;
    for (; p + 4 <= kc; p += 4) {
      s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + p * MR, rows), _mm256_set1_ps(bj[p * bs]), s0);
      s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + (p + 1) * MR, rows), _mm256_set1_ps(bj[(p + 1) * bs]), s1);
      s2 = _mm256_fmadd_ps(_mm256_maskload_ps(a + (p + 2) * MR, rows), _mm256_set1_ps(bj[(p + 2) * bs]), s2);
      s3 = _mm256_fmadd_ps(_mm256_maskload_ps(a + (p + 3) * MR, rows), _mm256_set1_ps(bj[(p + 3) * bs]), s3);
    }
    for (; p < kc; p++) s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + p * MR, rows), _mm256_set1_ps(bj[p * bs]), s0);
    float v[8];
    _mm256_storeu_ps(v, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (int64_t i = 0; i < mr; i++) c[i * ldc + j] = acc ? c[i * ldc + j] + v[i] : v[i];
  }
  return 1;
}
#elif !defined(EX_AVX512)
static int uk_tile(const epi_t *ep, int last, int64_t i0, int64_t j0, int64_t mr, int64_t nr, int64_t kc,
                   const float *a, int64_t as, const float *b, int64_t bs, float *c, int64_t ldc, int acc,
                   int pf, const char *far, int64_t fstep, int *fused) {
  (void)ep; (void)last; (void)i0; (void)j0; (void)mr; (void)nr; (void)kc; (void)a; (void)as; (void)b; (void)bs;
  (void)c; (void)ldc; (void)acc; (void)pf; (void)far; (void)fstep;
  *fused = 0;
  return 0;
}
#endif

typedef struct {
  const float *a;
  const void *b;
  int32_t bdt;
  float *c;
  int64_t ars, acs, brs, bcs, ldc, m, n, k;
  const epi_t *ep;
  const float *apk; /* NULL, or all of A pre-packed (gemm_pack_a) */
  const float *bpk; /* NULL, or all of B pre-packed (gemm_pack_b) */
  int64_t parts; /* ranges the work was split into */
  int split_n;   /* ranges are of columns (else of rows) */
  int64_t rg;    /* row ranges are whole multiples of rg rows (MR, or MC: no partial MC blocks) */
  const float *bsh; /* NULL, or one packed (sh_jc, sh_pc) block of B shared by the threads */
  int64_t sh_jc, sh_nc, sh_pc;
  int64_t ks;    /* the K block length */
  int far;       /* the pre-packed weights that stream from memory (see sgemm_range): 0, 'a' or 'b' */
  _Atomic int err;
} sg_ctx;

#ifdef EX_AVX2
/* row-major f32 B is read in place by the micro-kernel, each row's next panel prefetched, rather
 * than packed: with up to 12 panels of A rows (a range of `rows` rows), or many columns, packing B
 * cost as much as 10-30% of the products (measured on 1x1 convolutions, whose B is the input).
 * Not when a K block's rows fall into too few cache sets: rows a whole number of lines apart land
 * in 1024 / gcd(lines, 1024) sets of a 1024-set L2, and kc rows need kc / 2 of them (rows a
 * multiple of 4 KB apart: on an Intel core with a 2 MB L2, 1024- and 2048-square products ran at
 * 0.6 of the packed speed, and 80-160 x 4096 x 4096 at 0.65-0.8; rows 6 KB apart on Zen 3:
 * 1536-square products at 0.56-0.63x OpenBLAS against 0.93x packed) */
static inline int b_in_place(const sg_ctx *g, int64_t rows) {
  const int64_t kc = EX_MIN(g->ks, g->k);
  int64_t sets = 1024;
  if (g->brs % 16 == 0)
    for (int64_t l = g->brs / 16; l % 2 == 0 && sets > 1; l /= 2) sets /= 2;
  return !g->bpk && g->bdt == EX_F32 && g->bcs == 1 && (rows <= 12 * MR || g->n >= 1024) && kc <= 2 * sets;
}
#endif

/* tile t of the T tiles that reuse a panel of kc steps its share of the weights' next panel
 * (kc steps of `floats` each, from next): where it starts, and the bytes a step (*fstep) */
static inline const char *far_share(const float *next, int64_t floats, int64_t kc, int64_t T, int64_t t,
                                    int64_t *fstep) {
  *fstep = (floats * (int64_t)sizeof(float) + T - 1) / T;
  return (const char *)next + t * *fstep * kc;
}

/* C[i0:i1, j0:j1] = A[i0:i1, :] @ B[:, j0:j1] (+ epilogue) */
static int sgemm_range(const sg_ctx *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t k = g->k, ldc = g->ldc;
  const int64_t ks = g->ks, kmax = EX_MIN(ks, k), mmax = EX_MIN(MC, ROUND_UP(i1 - i0, MR)),
                nmax = EX_MIN(NC, ROUND_UP(j1 - j0, NR));
  /* packing buffers: per thread, kept between calls (small products pay no allocation) */
  static _Thread_local float *tl_ap, *tl_bp;
  static _Thread_local size_t tl_an, tl_bn;
  const size_t an = (size_t)ROUND_UP(mmax * kmax * 4, 64), bn = (size_t)ROUND_UP(nmax * kmax * 4, 64);
  if (an > tl_an) { free(tl_ap); tl_ap = aligned_alloc(64, an); tl_an = tl_ap ? an : 0; }
  if (bn > tl_bn) { free(tl_bp); tl_bp = aligned_alloc(64, bn); tl_bn = tl_bp ? bn : 0; }
  float *ap = tl_ap, *bp = tl_bp;
  if (!ap || !bp) return EX_ENOMEM;
  float edge[MR * NR] __attribute__((aligned(64)));
  /* C may start out as the residual (a convolution writing over a residual that dies there, which
   * spares the stores their reads of fresh lines): the products then add onto it from the first K
   * block, and the epilogue adds no residual */
  const int ip = g->ep->res == g->c && g->ep->res_ld == ldc;
  epi_t epl = *g->ep;
  if (ip) epl.res = NULL;
  const epi_t *ep = &epl;
  /* shared mode: just the one block of B the caller packed */
  const int64_t jb = g->bsh ? g->sh_jc : j0, je = g->bsh ? g->sh_jc + g->sh_nc : j1;
  const int64_t pb = g->bsh ? g->sh_pc : 0, pe = g->bsh ? EX_MIN(k, g->sh_pc + ks) : k;
#ifdef EX_AVX2
  const int bdir = !g->bsh && b_in_place(g, i1 - i0);
  /* B read in place: rows 2 KB or more apart are a stride the core's prefetchers do not follow, so
   * with panels of 96 rows or more the micro-kernel fetches them itself, 8 steps ahead, and the
   * next panel goes to L2 only: with the current one it overflowed L1 (1x1 convolutions at 56x56
   * and 28x28 with K 144 - 512 10-15% faster; with K 32, 15% slower).  Otherwise the next panel
   * comes into L1 */
  const int bpf = bdir ? (g->brs >= 512 && kmax >= 96 ? UK_PF_BFAR : UK_PF_BROW) : 0;
#else
  const int bdir = 0, bpf = 0;
#endif
#ifdef EX_AVX512
  const int pf = (g->apk ? UK_PF_A : 0) | (g->bpk ? UK_PF_B : 0) | bpf;
  /* a small row-major A (its MC x KC block within L2, rows not a multiple of 2 KB apart, which
   * would alias in L1) is read in place too: packing it cost square products of 32..256 7-25% */
  const int adir = !g->apk && g->acs == 1 && mmax * kmax <= ADIR_MAX && g->ars % 512;
#else
  const int pf = bpf, adir = 0;
#endif
  /* B packed here: blocks of columns whose packed form (kc x nc) stays in L2, since with few rows
   * of A each B element is used only m / MR times and a block round-tripping through L3 costs
   * as much as the micro-kernel */
  const int64_t ncs = g->bsh || g->bpk ? NC : nc_step(kmax, j1 - j0, i1 - i0);
  const int pf_c = g->m * g->n >= ((int64_t)1 << 18) || ip; /* C of 1 MB or more, or the residual */
  for (int64_t jc = jb; jc < je; jc += ncs) {
    const int64_t nc = EX_MIN(ncs, je - jc);
    for (int64_t pc = pb; pc < pe; pc += ks) {
      const int64_t kc = EX_MIN(ks, k - pc);
      const int last = pc + kc >= k, acc = pc > 0 || ip;
      const float *bpc = bp;
      if (g->bsh) bpc = g->bsh;
      else if (g->bpk) bpc = g->bpk + pc * ROUND_UP(g->n, NR) + jc * kc;
      else if (bdir) bpc = (const float *)g->b + pc * g->brs + jc;
      else pack_b(kc, nc, g->b, g->bdt, pc * g->brs + jc * g->bcs, g->brs, g->bcs, bp);
      for (int64_t ic = i0; ic < i1; ic += MC) {
        const int64_t mc = EX_MIN(MC, i1 - ic);
        const float *apc = ap;
        if (g->apk) apc = g->apk + pc * ROUND_UP(g->m, MR) + ic * kc;
        else if (adir) apc = g->a + ic * g->ars + pc;
        else pack_a(mc, kc, g->a + ic * g->ars + pc * g->acs, g->ars, g->acs, ap);
        const int64_t gr = kc == k && kc * nc <= B_L2 ? MG * MR : mc; /* rows per group (above) */
        for (int64_t ig = 0; ig < mc; ig += gr)
        for (int64_t jr = 0, ge = EX_MIN(mc, ig + gr); jr < nc; jr += NR) {
          const int64_t nr = EX_MIN(NR, nc - jr);
          for (int64_t ir = ig; ir < ge; ir += MR) {
            const int64_t mr = EX_MIN(MR, mc - ir);
            float *c = g->c + (ic + ir) * ldc + jc + jr;
            const float *pa = adir ? apc + ir * g->ars : apc + ir * kc, *pb = bdir ? bpc + jr : bpc + jr * kc;
            /* the next tile's C rows (a C past L2 is not still in cache: written by the first K
             * block, read and written by the later ones; fetching them for the later ones too ran
             * 2048/4096-square products 3-5% faster) and residual rows, fetched while the
             * micro-kernel runs: its mr rows are too many streams for the hardware prefetcher */
            if (pf_c || (last && ep->res)) {
              int64_t nir = ir + MR < ge ? ir + MR : ig, njr = ir + MR < ge ? jr : jr + NR;
              if (njr >= nc && ge < mc) nir = ge, njr = 0; /* the next group's first tile */
              if (njr < nc)
                for (int64_t i = 0, nmr = EX_MIN(MR, mc - nir), nnr = EX_MIN(NR, nc - njr); i < nmr; i++) {
                  const float *cn = g->c + (ic + nir + i) * ldc + jc + njr;
                  if (pf_c) {
                    __builtin_prefetch(cn, 1, 3);
                    __builtin_prefetch(cn + nnr - 1, 1, 3);
                  }
                  if (last && ep->res) {
                    const float *rr = ep->res + (ic + nir + i) * ep->res_ld + jc + njr;
                    __builtin_prefetch(rr, 0, 3);
                    __builtin_prefetch(rr + nnr - 1, 0, 3);
                  }
                }
            }
            /* the weights' next panel (or the next group's panels of A) into L2, each tile that
             * reuses the current one fetching its share: left to the tile that reads it first,
             * a panel's misses came as one burst (64 KB of B for a 1x1 convolution at 7 x 7,
             * then reused by 3 more tiles) and held it up.  ResNet-50's 7 x 7 layers with their
             * weights coming from L3 / memory ran 17-23% faster, at one thread and at two */
            const char *far = NULL;
            int64_t fstep = 0;
            if (g->far == 'a') {
              const int64_t R = ROUND_UP(ge - ig, MR), tr = R / MR;
              far = far_share(apc + (ig + R) * kc, R, kc, tr * ((nc + NR - 1) / NR),
                              jr / NR * tr + (ir - ig) / MR, &fstep);
            } else if (g->far == 'b') {
              far = far_share(pb + kc * NR, NR, kc, (ge - ig + MR - 1) / MR, (ir - ig) / MR, &fstep);
            }
            int fused = 0;
            if (uk_tile(ep, last, ic + ir, jc + jr, mr, nr, kc, pa, adir ? g->ars : 0, pb, bdir ? g->brs : NR, c,
                        ldc, acc, pf, far, fstep, &fused)) {
              /* done in place, every tile shape (the AVX-512 kernel) */
            } else if (nr == NR) { /* whole columns: straight into C, however many rows */
              fused = ukernel(kc, pa, pb, bdir ? g->brs : NR, c, ldc, acc, pf, far, fstep, last ? ep : NULL, ic + ir,
                              jc + jr, mr);
            } else { /* a partial column panel through a buffer; B read in place: this panel
                      * packed (a full-width read would run past B's rows) */
              if (bdir && ir == ig) pack_b(kc, nr, g->b, g->bdt, pc * g->brs + jc + jr, g->brs, 1, bp);
              ukernel(kc, pa, bdir ? bp : pb, NR, edge, NR, 0, bdir ? 0 : pf, far, fstep, NULL, 0, 0, MR);
              for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < nr; j++)
                  c[i * ldc + j] = acc ? c[i * ldc + j] + edge[i * NR + j] : edge[i * NR + j];
            }
            if (last && !fused) epi_tile(ep, c, ldc, ic + ir, jc + jr, mr, nr);
          }
        }
      }
    }
  }
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
      const int64_t mb = (g->m + g->rg - 1) / g->rg;
      err = sgemm_range(g, EX_MIN(g->m, mb * t / g->parts * g->rg),
                        EX_MIN(g->m, mb * (t + 1) / g->parts * g->rg), 0, g->n);
    }
    if (err) g->err = err;
  }
}

/* packing of NR panels [p0, p1) of the shared B block */
typedef struct {
  const sg_ctx *g;
  float *bp;
  int64_t jc, nc, pc, kc;
} pk_ctx;

static void packb_task(void *vctx, int64_t p0, int64_t p1) {
  const pk_ctx *c = vctx;
  const sg_ctx *g = c->g;
  pack_b(c->kc, EX_MIN(c->nc, p1 * NR) - p0 * NR, g->b, g->bdt, c->pc * g->brs + (c->jc + p0 * NR) * g->bcs,
         g->brs, g->bcs, c->bp + p0 * NR * c->kc);
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

/* ---- skinny: C[i, j] = sum_p A[i, p] * W[j, p], A rows and W rows contiguous ---- */
typedef struct {
  const float *a;
  int64_t lda;
  const void *w;
  int32_t wdt;
  int64_t ldw;
  float *c;
  int64_t ldc, m, n, k;
  const epi_t *ep;
} sk_ctx;

#ifdef EX_AVX2
static inline __m256 ld8_w(const void *w, int32_t dt, int64_t i) {
  if (dt == EX_F32) return _mm256_loadu_ps((const float *)w + i);
  const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
  if (dt == EX_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

/* 4 rows of A (ai) against 4 rows of W (starting at element offsets wo), out[i][j] */
static void sk_block(const sk_ctx *g, const float *const *ai, const int64_t *wo, float out[4][4], int64_t ni) {
  const int64_t k = g->k;
  int64_t p = 0;
#ifdef EX_AVX512
  if (ni == 1 && g->wdt == EX_F32) { /* GEMV: as below, in zmm, prefetched into L2 */
    const float *x = ai[0];
    for (int j = 0; j < 4; j++) {
      const float *w = (const float *)g->w + wo[j];
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (p = 0; p + 64 <= k; p += 64) {
        for (int l = 0; l < 64; l += 16) _mm_prefetch((const char *)(w + p + SK_PF + l), _MM_HINT_T1);
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + p), _mm512_loadu_ps(w + p), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + p + 16), _mm512_loadu_ps(w + p + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + p + 32), _mm512_loadu_ps(w + p + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + p + 48), _mm512_loadu_ps(w + p + 48), s3);
      }
      for (; p + 16 <= k; p += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + p), _mm512_loadu_ps(w + p), s0);
      float t = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
      for (; p < k; p++) t += x[p] * w[p];
      out[0][j] = t;
    }
    return;
  }
#endif
#ifdef EX_AVX2
  if (ni == 1) {
    /* one row of A (half-precision weights with m = 1, or the last of m = 4i + 1 rows; float32
     * weights with m = 1 go to sk_gemv): the 4 weight rows one after another, so that the weights
     * stream from memory as one run (the 4 adjacent rows side by side took longer: 1280 x 1000
     * with cold weights 385 against 276 us, 2048 x 1000 567 against 375, warm alike), prefetched
     * 16 KB ahead into L2 as the AVX-512 GEMV (SK_PF): 1024 elements ahead into L1 read 4096 x
     * 4096 float16 weights at 19 - 24 GB/s from memory at one thread on a Zen 4 core, 16 KB into
     * L2 at 25 - 29 (float32 weights 16 - 22 and 18 - 24); four accumulators for latency */
    const float *x0 = ai[0];
    const char *wb = g->w;
    const int es = g->wdt == EX_F32 ? 4 : 2;
    for (int j = 0; j < 4; j++) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (p = 0; p + 32 <= k; p += 32) {
        for (int l = 0; l < 32 * es; l += 64) _mm_prefetch(wb + (wo[j] + p) * es + 4 * SK_PF + l, _MM_HINT_T1);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + p), ld8_w(g->w, g->wdt, wo[j] + p), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + p + 8), ld8_w(g->w, g->wdt, wo[j] + p + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + p + 16), ld8_w(g->w, g->wdt, wo[j] + p + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + p + 24), ld8_w(g->w, g->wdt, wo[j] + p + 24), a3);
      }
      float sj = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      for (; p < k; p++) sj += x0[p] * ld_w(g->w, g->wdt, wo[j] + p);
      out[0][j] = sj;
    }
    return;
  }
  __m256 acc[4][4];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
  for (; p + 8 <= k; p += 8) {
    const __m256 w0 = ld8_w(g->w, g->wdt, wo[0] + p), w1 = ld8_w(g->w, g->wdt, wo[1] + p),
                 w2 = ld8_w(g->w, g->wdt, wo[2] + p), w3 = ld8_w(g->w, g->wdt, wo[3] + p);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
      const __m256 x = _mm256_loadu_ps(ai[i] + p);
      acc[i][0] = _mm256_fmadd_ps(x, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(x, w1, acc[i][1]);
      acc[i][2] = _mm256_fmadd_ps(x, w2, acc[i][2]);
      acc[i][3] = _mm256_fmadd_ps(x, w3, acc[i][3]);
    }
  }
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) out[i][j] = hsum8(acc[i][j]);
#else
  float acc[4][4][8] = {{{0}}};
  for (; p + 8 <= k; p += 8)
    for (int j = 0; j < 4; j++) {
      float wv[8];
      for (int l = 0; l < 8; l++) wv[l] = ld_w(g->w, g->wdt, wo[j] + p + l);
      for (int i = 0; i < 4; i++)
        for (int l = 0; l < 8; l++) acc[i][j][l] += ai[i][p + l] * wv[l];
    }
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      const float *v = acc[i][j];
      out[i][j] = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
    }
#endif
  for (; p < k; p++)
    for (int j = 0; j < 4; j++) {
      const float wv = ld_w(g->w, g->wdt, wo[j] + p);
      for (int i = 0; i < 4; i++) out[i][j] += ai[i][p] * wv;
    }
}

#ifdef EX_AVX2
/* one row of A against float32 weight rows start[q] + i (i < count) of S streams side by side, 32
 * values of each a step with x's loaded once for all, each stream prefetched 16 KB ahead in the
 * AVX-512 build */
static inline __attribute__((always_inline)) void sk_gemv_rows(const sk_ctx *g, const int64_t *start,
                                                               int64_t count, const int S) {
  const int64_t k = g->k;
  const float *x = g->a;
  for (int64_t i = 0; i < count; i++) {
    const float *w[EX_PARTS];
    __m256 acc[EX_PARTS][2];
    for (int q = 0; q < S; q++) {
      w[q] = (const float *)g->w + (start[q] + i) * g->ldw;
      acc[q][0] = acc[q][1] = _mm256_setzero_ps();
    }
    int64_t p = 0;
    for (; p + 32 <= k; p += 32) {
      const __m256 x0 = _mm256_loadu_ps(x + p), x1 = _mm256_loadu_ps(x + p + 8), x2 = _mm256_loadu_ps(x + p + 16),
                   x3 = _mm256_loadu_ps(x + p + 24);
      for (int q = 0; q < S; q++) {
#ifdef EX_AVX512 /* the AVX2 build leaves the streams to the hardware prefetcher: see SK_PF */
        _mm_prefetch((const char *)(w[q] + p + SK_PF), _MM_HINT_T1);
        _mm_prefetch((const char *)(w[q] + p + SK_PF + 16), _MM_HINT_T1);
#endif
        acc[q][0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w[q] + p), acc[q][0]);
        acc[q][1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w[q] + p + 8), acc[q][1]);
        acc[q][0] = _mm256_fmadd_ps(x2, _mm256_loadu_ps(w[q] + p + 16), acc[q][0]);
        acc[q][1] = _mm256_fmadd_ps(x3, _mm256_loadu_ps(w[q] + p + 24), acc[q][1]);
      }
    }
    for (int q = 0; q < S; q++) {
      float t = hsum8(_mm256_add_ps(acc[q][0], acc[q][1]));
      for (int64_t pp = p; pp < k; pp++) t += x[pp] * w[q][pp];
      g->c[start[q] + i] = t;
    }
  }
}

/* one row of A against float32 weight rows [r0, r1) as EX_WALK_PARTS' streams: a single stream
 * (sk_block's) left a core short of the memory's rate.  4096 x 4096 weights from memory at one
 * thread on a Zen 4 core: 20 - 25 -> 24 - 28 GB/s (AVX2 and AVX-512 builds alike; at two threads
 * 31 - 37 either way, the memory's rate).  Half-precision weights stay one stream: as four they
 * read 22 - 26 GB/s against 28 - 35. */
static void sk_gemv(const sk_ctx *g, int64_t r0, int64_t r1) {
  EX_WALK_PARTS(r0, r1, sk_gemv_rows, g);
  epi_tile(g->ep, g->c + r0, g->ldc, 0, r0, 1, r1 - r0);
}
#endif

static void skinny_task(void *vctx, int64_t b0, int64_t b1) {
  const sk_ctx *g = vctx;
#ifdef EX_AVX2
  if (g->m == 1 && g->wdt == EX_F32) {
    sk_gemv(g, b0 * 4, EX_MIN(g->n, b1 * 4));
    return;
  }
#endif
  for (int64_t jb = b0 * 4; jb < EX_MIN(g->n, b1 * 4); jb += 4) {
    const int64_t nj = EX_MIN(4, g->n - jb);
    int64_t wo[4];
    for (int j = 0; j < 4; j++) wo[j] = (jb + EX_MIN(j, nj - 1)) * g->ldw;
    for (int64_t ib = 0; ib < g->m; ib += 4) {
      const int64_t ni = EX_MIN(4, g->m - ib);
      const float *ai[4];
      for (int i = 0; i < 4; i++) ai[i] = g->a + (ib + EX_MIN(i, ni - 1)) * g->lda;
      float out[4][4];
      sk_block(g, ai, wo, out, ni);
      for (int64_t i = 0; i < ni; i++)
        for (int64_t j = 0; j < nj; j++) g->c[(ib + i) * g->ldc + jb + j] = out[i][j];
      epi_tile(g->ep, g->c + ib * g->ldc + jb, g->ldc, ib, jb, ni, nj);
    }
  }
}

static int sgemm_run(const float *a, const float *apk, int64_t ars, int64_t acs, const void *b,
                     const float *bpk, int32_t bdt, int64_t brs, int64_t bcs, float *c, int64_t ldc,
                     int64_t m, int64_t n, int64_t k, const epi_t *ep);

/* A [m, k] (row stride lda) packed for sgemm_run: per K block (kc_step), all MR-row panels;
 * after a 16-float header (MR, KC, m, k) that tells whether this variant packed it */
#define PACK_HDR 16
static int64_t packed_a_floats(int64_t m, int64_t k) { return PACK_HDR + ROUND_UP(m, MR) * k; }
static void gemm_pack_a(const float *a, int64_t lda, int64_t m, int64_t k, float *out) {
  memset(out, 0, PACK_HDR * sizeof(float));
  out[0] = MR; out[1] = KC; out[2] = (float)m; out[3] = (float)k;
  float *dst = out + PACK_HDR;
  const int64_t ks = kc_step(k);
  for (int64_t pc = 0; pc < k; pc += ks) {
    const int64_t kc = EX_MIN(ks, k - pc);
    pack_a(m, kc, a + pc, lda, 1, dst);
    dst += ROUND_UP(m, MR) * kc;
  }
}
static const float *packed_a_for(const float *pk, int64_t m, int64_t k) {
  return pk && pk[0] == MR && pk[1] == KC && pk[2] == (float)m && pk[3] == (float)k && pk[4] == 0
             ? pk + PACK_HDR : NULL;
}

/* B [k, n] (strides rs, cs) packed likewise: per K block, all NR-column panels; header
 * (NR, KC, k, n, 1) */
static int64_t packed_b_floats(int64_t k, int64_t n) { return PACK_HDR + ROUND_UP(n, NR) * k; }
static void gemm_pack_b(const float *b, int64_t rs, int64_t cs, int64_t k, int64_t n, float *out) {
  memset(out, 0, PACK_HDR * sizeof(float));
  out[0] = NR; out[1] = KC; out[2] = (float)k; out[3] = (float)n; out[4] = 1;
  float *dst = out + PACK_HDR;
  const int64_t ks = kc_step(k);
  for (int64_t pc = 0; pc < k; pc += ks) {
    const int64_t kc = EX_MIN(ks, k - pc);
    pack_b(kc, n, b, EX_F32, pc * rs, rs, cs, dst);
    dst += ROUND_UP(n, NR) * kc;
  }
}
static const float *packed_b_for(const float *pk, int64_t k, int64_t n) {
  return pk && pk[0] == NR && pk[1] == KC && pk[2] == (float)k && pk[3] == (float)n && pk[4] == 1
             ? pk + PACK_HDR : NULL;
}

/* C (row stride ldc) = A @ B (+ epilogue); B of dtype bdt (f32/f16/bf16) */
static int sgemm_ep(const float *a, int64_t ars, int64_t acs, const void *b, int32_t bdt,
                    int64_t brs, int64_t bcs, float *c, int64_t ldc, int64_t m, int64_t n,
                    int64_t k, const epi_t *ep) {
  if (k == 0) {
    for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < m; i++) epi_tile(ep, c + i * ldc, ldc, i, 0, 1, n);
    return EX_OK;
  }
  if (m <= 16 && acs == 1 && brs == 1) {
    sk_ctx g = {a, ars, b, bdt, bcs, c, ldc, m, n, k, ep};
    const int64_t nb = (n + 3) / 4;
    ex_parallel_for(nb, EX_MAX(1, 16384 / (k * EX_MIN(m, 4))), skinny_task, &g);
    return EX_OK;
  }
  if (bdt == EX_F32 && (m == 1 || n == 1) && ldc == n) {
    gv_ctx g = m == 1 ? (gv_ctx){c, b, a, bcs, brs, acs, k} : (gv_ctx){c, a, b, ars, acs, brs, k};
    const int64_t nout = m == 1 ? n : m;
    ex_parallel_for(nout, EX_MAX(16, 65536 / k), gemv_task, &g);
    epi_tile(ep, c, ldc, 0, 0, m, n);
    return EX_OK;
  }
  return sgemm_run(a, NULL, ars, acs, b, NULL, bdt, brs, bcs, c, ldc, m, n, k, ep);
}

/* the packed path; apk / bpk: A / B pre-packed by gemm_pack_a / gemm_pack_b, or NULL */
static int sgemm_run(const float *a, const float *apk, int64_t ars, int64_t acs, const void *b,
                     const float *bpk, int32_t bdt, int64_t brs, int64_t bcs, float *c, int64_t ldc,
                     int64_t m, int64_t n, int64_t k, const epi_t *ep) {
  sg_ctx g = {a, b, bdt, c, ars, acs, brs, bcs, ldc, m, n, k, ep, apk, bpk, 1, 1, MR, NULL, 0, 0, 0,
              apk || bpk ? kc_step(k) : kc_for(m, n, k), apk ? 'a' : bpk ? 'b' : 0, 0};
  const int nt = ex_pool_width();
  const double work = (double)m * n * k;
  if (nt > 1 && work >= 1048576.0) {
    const int64_t nb = (n + NR - 1) / NR, mb = (m + MR - 1) / MR;
    g.split_n = nb >= mb;
    /* one range per thread: each range streams all of the other operand (a convolution's
     * pre-packed weights for each range of positions, its input for each range of channels),
     * which 4 ranges a thread did 4 times.  At two threads on the Intel core, ResNet-50's GEMM
     * layers 5% faster in all (1024 -> 256 at 14x14 17%, 512 -> 2048 at 7x7 21%; two 1x1 layers
     * at 28x28 2-8% slower), 1000- and 1536-square products 25-30%.  Under 8M multiply-adds a
     * thread (about 45 us), about 4 ranges per thread, claimed dynamically, so that a worker that
     * wakes late holds up less (MobileNetV2's small layers went 5-10% either way with one).  Each
     * range at least ~1M multiply-adds, and a column range packs all of A itself unless A is
     * pre-packed, so those stay at least 8 panels wide */
    /* (pre-packed A is not packed per MC block: its ranges stay in MR panels, finer to balance) */
    if (!g.split_n && m >= 2 * nt * MC && !apk) g.rg = MC;
    const int64_t rb = (m + g.rg - 1) / g.rg, units = g.split_n ? nb / (apk ? 1 : 8) : rb;
    g.parts = work >= 8388608.0 * nt ? nt : EX_MIN(4 * (int64_t)nt, (int64_t)(work / 1048576.0));
    g.parts = EX_MIN(g.parts, units);
    g.parts = EX_MIN(EX_MAX(g.parts, nt), g.split_n ? nb : rb);
    /* a whole number of ranges per thread: 7 ranges on 2 threads run as 4 + 3 */
    if (g.parts % nt && ROUND_UP(g.parts, nt) <= (g.split_n ? nb : rb)) g.parts = ROUND_UP(g.parts, nt);
#ifdef EX_AVX2
    /* B that every range's micro-kernel reads in place (sgemm_range's bdir) is not packed at all:
     * on Zen 4 at two threads, 128- and 256-square products 125 -> 160 and 143-165 -> 189-193
     * GFLOP/s, a 1024 -> 256 1x1 convolution at 14x14 0.61-0.63 -> 0.55-0.57 ms */
    const int bdir = b_in_place(&g, (rb + g.parts - 1) / g.parts * g.rg); /* a range's most rows */
#else
    const int bdir = 0;
#endif
    if (!g.split_n && !bpk && nb >= 4 && !bdir) {
      /* rows split: the threads pack each block of B together and share it, rather than each
       * packing (and streaming) all of B */
      static _Thread_local float *sh;
      static _Thread_local size_t shn;
      const int64_t ks = g.ks;
      const size_t need = (size_t)ROUND_UP(EX_MIN(NC, ROUND_UP(n, NR)) * EX_MIN(ks, k) * 4, 64);
      if (need > shn) { free(sh); sh = aligned_alloc(64, need); shn = sh ? need : 0; }
      if (!sh) return EX_ENOMEM;
      for (int64_t jc = 0; jc < n && !g.err; jc += NC)
        for (int64_t pc = 0; pc < k && !g.err; pc += ks) {
          pk_ctx pk = {&g, sh, jc, EX_MIN(NC, n - jc), pc, EX_MIN(ks, k - pc)};
          ex_parallel_for((pk.nc + NR - 1) / NR, EX_MAX(1, 2048 / pk.kc), packb_task, &pk);
          g.bsh = sh;
          g.sh_jc = jc;
          g.sh_nc = pk.nc;
          g.sh_pc = pc;
          ex_parallel_for(g.parts, 1, sgemm_task, &g);
        }
      return g.err;
    }
    ex_parallel_for(g.parts, 1, sgemm_task, &g);
    return g.err;
  }
  return sgemm_range(&g, 0, m, 0, n);
}

static int sgemm(const float *a, int64_t ars, int64_t acs, const float *b, int64_t brs,
                 int64_t bcs, float *c, int64_t m, int64_t n, int64_t k) {
  return sgemm_ep(a, ars, acs, b, EX_F32, brs, bcs, c, n, m, n, k, &EPI_NONE);
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

static int act_ok(int32_t act) { return act >= EX_ACT_NONE && act <= EX_ACT_SIGMOID; }

/* y[m, n] = act(x[m, k] @ w[n, k]^T + bias + res) */
static int linear(const float *x, const void *w, int32_t w_dtype, const float *bias,
                  const float *res, float *y, int64_t m, int64_t n, int64_t k, int32_t act) {
  if (w_dtype != EX_F32 && w_dtype != EX_F16 && w_dtype != EX_BF16) return EX_EDTYPE;
  if (m < 0 || n < 0 || k < 0 || !act_ok(act)) return EX_EINVAL;
  if (m * n == 0) return EX_OK;
  if (!y || (k > 0 && (!x || !w))) return EX_EINVAL;
  const epi_t ep = {bias, 0, res, n, act};
  return sgemm_ep(x, k, 1, w, w_dtype, 1, k, y, n, m, n, k, &ep);
}
