/* ex_conv2d, ex_winograd_weights, ex_conv_transpose2d: NCHW float32 convolution.
 * Reference: the definition (sum over input channels and taps, zero padding) — the im2col path
 * is exactly that, written as a GEMM.
 * Algorithms (chosen by the caller, EX_CONV_AUTO picks depthwise or GEMM):
 *   GEMM       per image and group: W[oc, c*kh*kw] @ col[c*kh*kw, oh*ow] with the packed sgemm
 *              and its fused epilogue, col built a chunk of output rows at a time (for kernels
 *              over 1x1 directly in the GEMM's packed-B layout); a 1x1 stride-1 unpadded conv
 *              reads x itself as col.  Few output positions (7x7, 14x14) run transposed,
 *              col^T @ W^T, then a transpose with the epilogue (on AVX-512 a 1x1 layer's col^T
 *              read in place from x: conv_1x1_tr).
 *              At most 4 input channels (the stems) run a direct kernel instead (AVX2 and
 *              AVX-512), and on AVX-512 stride 2 with kernels past 1x1 an implicit transposed
 *              GEMM (conv_s2).
 *   DEPTHWISE  groups == c == oc: 3x3 and 5x5 at stride 1 or 2 by the direct kernel of
 *              depthwise.c, other shapes per output row of a zero-padded copy of each plane.
 *   WINOGRAD   F(4x4, 3x3), stride 1, dilation 1: weights pre-transformed to U[36][oc][c]
 *              (ex_winograd_weights), optionally pre-packed as GEMM A (ex_conv_pack_weights);
 *              tiles in blocks of up to WT (input transform vectorized across 8 tiles, written
 *              straight in packed-B form), 36 GEMMs per block, output transform + epilogue.
 *              Blocks run on the pool (each block single-threaded) when there are at least two
 *              per thread; otherwise each block is shared by the pool in three phases (input
 *              transform by channel, the 36 GEMMs in halves, output transform by channel).
 *   WINOGRAD2  F(2x2, 3x3) for small planes (14x14), the GEMMs transposed (see below).
 * ex_conv_pwdw: a 1x1 expansion and the direct depthwise convolution reading it, fused by bands
 * of output rows so the expanded tensor stays in L2 (see conv_pwdw). */
#include "common.h"

typedef float cv8 __attribute__((vector_size(32)));
/* the header slot (within gemm.c's PACK_HDR) that marks pre-packed Winograd weights with their
 * number of transform points, 36 or 16, so neither Winograd form takes the other's */
#define WG_MARK 5

static int conv_check(const ex_conv_params *p) {
  if (!p) return EX_EINVAL;
  if (p->n < 0 || p->c < 1 || p->h < 0 || p->w < 0 || p->oc < 1 || p->oh < 0 || p->ow < 0 ||
      p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1 || p->ph < 0 || p->pw < 0 || p->dh < 1 ||
      p->dw < 1 || p->groups < 1 || p->c % p->groups || p->oc % p->groups || !act_ok(p->act))
    return EX_EINVAL;
  return EX_OK;
}

/* Per-thread scratch buffers kept between calls (on huge pages from 1 MB: ex_aligned_alloc): a
 * fresh multi-megabyte malloc is mmap'ed and page-faulted again on every call, which costs as much
 * as a small convolution.  Buffers over SCRATCH_KEEP are allocated and freed each time. */
enum { SC_COL, SC_XD, SC_TR, SC_WG_X, SC_WG_V, SC_ROW, SC_PWDW, SC_SLOTS };
#define SCRATCH_KEEP ((size_t)64 << 20)
static _Thread_local float *sc_buf[SC_SLOTS];
static _Thread_local size_t sc_cap[SC_SLOTS];

static float *sc_take(int slot, size_t nfloats) {
  const size_t nb = ROUND_UP(EX_MAX(nfloats, 1) * sizeof(float), 64);
  if (nb > SCRATCH_KEEP) return aligned_alloc(64, nb);
  if (nb > sc_cap[slot]) {
    ex_aligned_free(sc_buf[slot], sc_cap[slot], 1);
    sc_buf[slot] = ex_aligned_alloc(nb, 1);
    sc_cap[slot] = sc_buf[slot] ? nb : 0;
  }
  return sc_buf[slot];
}
static void sc_give(int slot, float *b) {
  if (b && b != sc_buf[slot]) free(b);
}

/* ---- im2col + GEMM ---- */
typedef struct {
  const ex_conv_params *p;
  const float *x; /* the group's first input channel */
  float *col;     /* [K, (oy1 - oy0) * ow]: output rows [oy0, oy1), or packed (below) */
  const float *xd; /* stride 2: each input row split into even then odd columns (or NULL) */
  int64_t oy0, oy1;
  int packed;      /* col in the GEMM's packed-B layout (K blocks, NR-column panels) */
  _Atomic int *err;
} i2c_ctx;

/* row r of col (output rows [oy0, oy1)) to dst */
static void i2c_row(const i2c_ctx *g, int64_t r, float *dst) {
  const ex_conv_params *p = g->p;
  const int64_t kk = p->kh * p->kw;
  const int64_t ci = r / kk, i = r % kk / p->kw, j = r % p->kw;
  const float *xc = g->x + ci * p->h * p->w;
  /* ox range whose input column is inside [0, w) */
  const int64_t off = j * p->dw - p->pw;
  int64_t lo = off < 0 ? (-off + p->sw - 1) / p->sw : 0;
  int64_t hi = p->w - off <= 0 ? 0 : (p->w - off - 1) / p->sw + 1;
  lo = EX_MIN(lo, p->ow);
  hi = EX_MAX(EX_MIN(hi, p->ow), lo);
  for (int64_t oy = g->oy0; oy < g->oy1; oy++, dst += p->ow) {
    const int64_t iy = oy * p->sh - p->ph + i * p->dh;
    if (iy < 0 || iy >= p->h) {
      memset(dst, 0, (size_t)p->ow * sizeof(float));
      continue;
    }
    const float *src = xc + iy * p->w + off;
    for (int64_t ox = 0; ox < lo; ox++) dst[ox] = 0.0f;
    if (p->sw == 1) {
      memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
    } else if (g->xd && hi > lo) { /* column 2 ox + off of the row: even or odd half */
      const float *row = g->xd + (ci * p->h + iy) * p->w;
      const int64_t start = lo * 2 + off; /* >= 0 */
      const float *half = start & 1 ? row + (p->w + 1) / 2 + start / 2 : row + start / 2;
      memcpy(dst + lo, half, (size_t)(hi - lo) * sizeof(float));
#ifdef EX_AVX512
    } else if (p->sw == 2) { /* a 1x1 convolution's stride 2: the even columns, split in registers */
      for (int64_t ox = lo; ox < hi; ox += 16) {
        const int64_t n = EX_MIN(16, hi - ox), m = 2 * n - 1; /* src[2 ox, 2 ox + m) is read */
        const __mmask16 m0 = (__mmask16)(0xFFFFu >> (16 - EX_MIN(16, m))),
                        m1 = m > 16 ? (__mmask16)(0xFFFFu >> (32 - m)) : 0;
        __m512 ev, od;
        split512(_mm512_maskz_loadu_ps(m0, src + 2 * ox), _mm512_maskz_loadu_ps(m1, src + 2 * ox + 16), &ev, &od);
        _mm512_mask_storeu_ps(dst + ox, (__mmask16)(0xFFFFu >> (16 - n)), ev);
      }
#endif
    } else {
      for (int64_t ox = lo; ox < hi; ox++) dst[ox] = src[ox * p->sw];
    }
    for (int64_t ox = hi; ox < p->ow; ox++) dst[ox] = 0.0f;
  }
}

static void im2col_task(void *vctx, int64_t r0, int64_t r1) {
  const i2c_ctx *g = vctx;
  const int64_t K = g->p->c / g->p->groups * g->p->kh * g->p->kw, N = (g->oy1 - g->oy0) * g->p->ow;
  if (!g->packed) {
    for (int64_t r = r0; r < r1; r++) i2c_row(g, r, g->col + r * N);
    return;
  }
  /* packed: each row built in a small buffer, then cut into its NR-column panel pieces, so the
   * GEMM reads col as pre-packed B instead of packing a copy of it */
  float *row = sc_take(SC_ROW, (size_t)ROUND_UP(N, NR));
  if (!row) { *g->err = EX_ENOMEM; return; }
  const int64_t np = ROUND_UP(N, NR), ks = kc_step(K);
  for (int64_t r = r0; r < r1; r++) {
    i2c_row(g, r, row);
    for (int64_t n = N; n < np; n++) row[n] = 0.0f;
    const int64_t pc = r / ks * ks, kc = EX_MIN(ks, K - pc);
    float *dst = g->col + pc * np + (r - pc) * NR;
    for (int64_t n0 = 0; n0 < np; n0 += NR) memcpy(dst + n0 * kc, row + n0, NR * sizeof(float));
  }
}

/* rows [r0, r1) of x (w floats each) split into their even then odd columns, into xd */
typedef struct {
  const float *x;
  float *xd;
  int64_t w;
} dei_ctx;

static void dei_task(void *vctx, int64_t r0, int64_t r1) {
  const dei_ctx *g = vctx;
  for (int64_t r = r0; r < r1; r++) {
    float *ev = g->xd + r * g->w;
    deinterleave(g->x + r * g->w, g->w, ev, ev + (g->w + 1) / 2);
  }
}

/* Few output positions (7x7, 14x14) and many channels: T[N, ocg] = col^T @ W^T fills the
 * MR x NR tiles better than W @ col (N = 49 fills 49 of 64 NR columns, but 49 of 56 MR rows);
 * the weights are then pre-packed as B, and the result is transposed with the epilogue.
 * At most 256 positions with a depth of at least twice the output channels run transposed too,
 * whatever the fill: on an Intel core (2 MB L2), with the weights from L3 as in a network,
 * 1024 -> 256 1x1 at 14x14 took 0.69-0.80 -> 0.64-0.71 ms at one thread and 0.41-0.42 -> 0.36 at
 * two, 3x3 stride 2 256 -> 256 at 28x28 1.99-2.04 -> 1.86-1.90 and 1.32 -> 1.15-1.18 (AVX2:
 * 2.68-2.77 -> 2.51-2.57 and 1.58-1.63 -> 1.51); 256 -> 1024 at 14x14 ran 10-40% slower
 * transposed, and so did 784 positions (col^T, 3.6 MB for 128 -> 128 3x3, past L2). */
static int conv_s2_ok(const ex_conv_params *p);
static int conv_tr(const ex_conv_params *p) {
  const int64_t N = p->oh * p->ow, ocg = p->oc / p->groups, K = p->c / p->groups * p->kh * p->kw;
  if (conv_s2_ok(p) || (N > 16 && N <= 256 && ocg >= 64 && K >= 2 * ocg)) return 1;
#ifdef EX_AVX512
  /* this micro-kernel computes a partial panel only to its rows, and a narrow last column panel
   * at 16 columns: the transpose (and its extra pass) pays only where W @ col wastes many
   * columns (N = 49: 64 computed) */
  const int64_t r = N % NR;
  const double fill_n = (double)N / (double)(N - r + (r == 0 ? 0 : r <= 16 ? 16 : NR));
  return N <= 1024 && N > 16 && ocg >= 64 && fill_n < 0.85;
#else
  const double fill_n = (double)N / (double)ROUND_UP(N, NR), fill_t = (double)N / (double)ROUND_UP(N, MR);
  return N <= 1024 && N > 16 && ocg >= 64 && fill_t > fill_n + 0.05;
#endif
}

/* y[o, j] = act(T[j, o] + bias[o] (+ res[o, j])) for 16-channel blocks [q0, q1) of the
 * transposed form's result */
typedef struct {
  const ex_conv_params *p;
  const float *tr, *bias, *res;
  float *y;
  int64_t N, ocg;
} ctr_ctx;


static void ctr_task(void *vctx, int64_t q0, int64_t q1) {
  const ctr_ctx *c = vctx;
  const int64_t N = c->N, ocg = c->ocg;
#ifdef EX_AVX512
  /* 16 x 16 blocks transposed in registers, the epilogue applied before the store (the
   * element-wise transpose and its extra passes cost 7-20% of a 7x7 convolution) */
  const int act = c->p->act, clamp = act == EX_ACT_RELU || act == EX_ACT_RELU6;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t q = q0 * 16; q < EX_MIN(ocg, q1 * 16); q += 16) {
    const int64_t no = EX_MIN(16, ocg - q);
    const __mmask16 mo = (__mmask16)(0xFFFFu >> (16 - no));
    for (int64_t j0 = 0; j0 < N; j0 += 16) {
      const int64_t nj = EX_MIN(16, N - j0);
      const __mmask16 mj = (__mmask16)(0xFFFFu >> (16 - nj));
      __m512 r[16];
      for (int64_t l = 0; l < 16; l++)
        r[l] = l < nj ? _mm512_maskz_loadu_ps(mo, c->tr + (j0 + l) * ocg + q) : zero;
      tr16(r);
      for (int64_t o = 0; o < no; o++) {
        float *yr = c->y + (q + o) * N + j0;
        __m512 v = r[o];
        if (c->bias) v = _mm512_add_ps(v, _mm512_set1_ps(c->bias[q + o]));
        if (c->res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mj, c->res + (q + o) * N + j0));
        v = relu512(v, act);
        _mm512_mask_storeu_ps(yr, mj, v);
      }
    }
    if (!clamp && act != EX_ACT_NONE)
      for (int64_t o = q; o < q + no; o++) act_row(act, c->y + o * N, N);
  }
  return;
#endif
  /* a row of y at a time, each element written once, after its residual is read (y may be the
   * residual's buffer); a block's 16 rows read the same lines of T */
  for (int64_t o = q0 * 16; o < EX_MIN(ocg, q1 * 16); o++) {
    float *yr = c->y + o * N;
    const float bv = c->bias ? c->bias[o] : 0.0f, *rr = c->res ? c->res + o * N : NULL;
    for (int64_t j = 0; j < N; j++) yr[j] = rr ? c->tr[j * ocg + o] + bv + rr[j] : c->tr[j * ocg + o] + bv;
    act_row(c->p->act, yr, N);
  }
}

#define I2C_PK 524288
/* ---- a zero-padded copy of the input, for kernels that read every tap in place ----
 * xq[n][c][hq][stride][wq]: each input row with its padding around it (hq rows, the padding as p
 * gives it at the top and left), at stride 2 split into its even columns then its odd ones
 * (padded column 2 m + pw + q holds x[2 m + q]), so that a tap of consecutive outputs of a row
 * reads consecutive floats.  Used by the Winograd tiles, the stem kernel and conv_s2; on the
 * pool (one thread took a tenth of a 64-channel 56 x 56 Winograd layer's time at two threads). */
typedef struct {
  const ex_conv_params *p;
  const float *x;
  float *xq;
  int64_t hq, wq;
} xq_ctx;

/* padded rows per channel (hq) and floats per row, or half row (wq): every tap of ow_read outputs
 * of every row in bounds, and every input column */
static inline void xq_dims(const ex_conv_params *p, int64_t ow_read, int64_t *hq, int64_t *wq) {
  const int64_t S = p->sw;
  *hq = EX_MAX(p->h + 2 * p->ph, S * (p->oh - 1) + p->kh);
  *wq = EX_MAX(ow_read + (p->kw - 1) / S, (p->w + p->pw) / S + 1);
}

/* rows [r0, r1) of xq, over images and channels; at stride 1 each float written once (the
 * input's columns past wq left out: the Winograd tiles' padded width may be narrower), at stride
 * 2 the row zeroed first */
static void xq_task(void *vctx, int64_t r0, int64_t r1) {
  const xq_ctx *g = vctx;
  const ex_conv_params *p = g->p;
  const int64_t S = p->sw, wq = g->wq, pw = p->pw;
  const int64_t left = EX_MIN(pw, wq), ncopy = EX_MAX(0, EX_MIN(p->w, wq - left));
  for (int64_t r = r0; r < r1; r++) {
    const int64_t bc = r / g->hq, iy = r % g->hq - p->ph;
    float *row = g->xq + r * S * wq;
    const float *src = g->x + (bc * p->h + iy) * p->w;
    if (iy < 0 || iy >= p->h) {
      memset(row, 0, (size_t)(S * wq) * sizeof(float));
    } else if (S == 1) {
      memset(row, 0, (size_t)left * sizeof(float));
      memcpy(row + left, src, (size_t)ncopy * sizeof(float));
      memset(row + left + ncopy, 0, (size_t)(wq - left - ncopy) * sizeof(float));
    } else {
      memset(row, 0, (size_t)(2 * wq) * sizeof(float));
      if (pw % 2 == 0) deinterleave(src, p->w, row + pw / 2, row + wq + pw / 2);
      else deinterleave(src, p->w, row + wq + (pw - 1) / 2, row + (pw + 1) / 2);
    }
  }
}

/* the padded copy (hq x wq a row, stride p->sw) in the given scratch slot; NULL if out of memory */
static float *xq_padded(const ex_conv_params *p, const float *x, int64_t hq, int64_t wq, int slot) {
  float *xq = sc_take(slot, (size_t)(p->n * p->c * hq * p->sw * wq));
  if (!xq) return NULL;
  xq_ctx c = {p, x, xq, hq, wq};
  ex_parallel_for(p->n * p->c * hq, EX_MAX(1, 16384 / (p->sw * wq)), xq_task, &c);
  return xq;
}
/* ---- stride 2, kernels past 1x1 (ResNet's 3x3 downsampling): implicit GEMM, transposed ----
 * T[pixel, oc] = col^T @ W^T as conv_tr computes it, with W^T pre-packed as B, but A read from the
 * input itself instead of from an im2col copy: the zero-padded input is split once into its even
 * and odd columns (xq), so for every tap (c, i, j) the pixels of a tile, up to MR consecutive
 * outputs of one row, are consecutive floats of one row of xq, at the offset ko[k] past the
 * tile's base.  No col is written and no A packed (im2col took a sixth of these layers' time);
 * then conv_tr's transpose with the epilogue.  AVX-512 only (the micro-kernel's per-step
 * offsets), and rows of at least MR outputs: at 7 x 7 the 7-row tiles ran 7% slower than
 * im2col + GEMM. */

static int conv_s2_ok(const ex_conv_params *p) {
#ifdef EX_AVX512
  int64_t hq, wq;
  xq_dims(p, p->ow, &hq, &wq);
  return p->groups == 1 && p->sh == 2 && p->sw == 2 && p->dh == 1 && p->dw == 1 && p->kh * p->kw > 1 &&
         p->c > 4 /* the stems: conv_small_c */ && p->oc >= 32 && p->ow >= MR &&
         (double)p->c * hq * 2 * wq < 2147483647.0; /* ko's offsets fit int32 */
#else
  (void)p;
  return 0;
#endif
}

#ifdef EX_AVX512
/* ---- the implicit transposed GEMM of conv_s2 and conv_1x1_tr ----
 * T[pixel, oc] = A @ W^T with W^T pre-packed as B and A read in place: row i of step k of the
 * tile based at a is a[ko[k] + i].  Tiles are up to MR consecutive outputs of one output row,
 * per_row of them a row of ow outputs, each row's inputs rs floats past the previous row's.  A
 * unit is one B panel (32 output channels) and tpu consecutive tiles. */
typedef struct {
  const float *a;       /* one image's input as the tiles read it (conv_s2: its xq) */
  const int32_t *ko;    /* per k, its offset past a tile's base (+ 8 for the prefetch) */
  const float *wpk;     /* W^T packed as B */
  float *t;             /* T[oh * ow][oc] */
  int64_t ow, rs, per_row, tiles, oc, K, ks, np, tpu; /* np: B panels */
} ko_ctx;

static void ko_task(void *vctx, int64_t u0, int64_t u1) {
  const ko_ctx *g = vctx;
  const int64_t oc = g->oc, pad_oc = ROUND_UP(oc, NR);
  for (int64_t u = u0; u < u1; u++) {
    const int64_t jr = u % g->np * NR, t0 = u / g->np * g->tpu, t1 = EX_MIN(g->tiles, t0 + g->tpu);
    const int64_t nc = EX_MIN(NR, oc - jr), nv = nc > 16 ? 2 : 1;
    const __mmask16 mk = (__mmask16)(0xFFFFu >> (16 - (nc - 16 * (nv - 1))));
    for (int64_t pc = 0; pc < g->K; pc += g->ks) {
      const int64_t kc = EX_MIN(g->ks, g->K - pc);
      const float *pb = g->wpk + pc * pad_oc + jr * kc;
      int64_t fstep;
      for (int64_t t = t0; t < t1; t++) {
        const int64_t oy = t / g->per_row, ox = t % g->per_row * MR, rows = EX_MIN(MR, g->ow - ox);
        const char *far = far_share(pb + kc * NR, NR, kc, t1 - t0, t - t0, &fstep); /* as sgemm_range's */
        UK_KO_TAB[nv - 1][rows](kc, g->a + oy * g->rs + ox, g->ko + pc, pb, g->t + (oy * g->ow + ox) * oc + jr, oc,
                                pc > 0, mk, far, fstep);
      }
    }
  }
}

/* the ranges to cut n rows (or tiles) into so that, with np B panels, there are about 4 units a
 * thread (1 where the panels alone give that many) */
static int64_t ko_ranges(int64_t np, int64_t n) {
  const int64_t want = 4 * (int64_t)ex_pool_width();
  return np >= want ? 1 : EX_MIN(n, (want + np - 1) / np);
}

/* ko_task over each image (its input `as` floats past the previous one's, from a), units claimed
 * `grain` at a time, then conv_tr's transpose with the epilogue into y */
static int ko_run(ko_ctx *g, const ex_conv_params *p, const float *a, int64_t as, int64_t grain, const float *bias,
                  const float *res, float *y) {
  const int64_t O = p->oc, N = p->oh * p->ow;
  float *t = sc_take(SC_TR, (size_t)(N * O));
  if (!t) return EX_ENOMEM;
  g->t = t;
  for (int64_t b = 0; b < p->n; b++) {
    g->a = a + b * as;
    ex_parallel_for(g->np * ((g->tiles + g->tpu - 1) / g->tpu), grain, ko_task, g);
    ctr_ctx tc = {p, t, bias, res ? res + b * O * N : NULL, y + b * O * N, N, O};
    ex_parallel_for((O + 15) / 16, EX_MAX(1, 8192 / (16 * N)), ctr_task, &tc);
  }
  sc_give(SC_TR, t);
  return EX_OK;
}

static int conv_s2(const ex_conv_params *p, const float *x, const float *wpk, const float *bias, const float *res,
                   float *y) {
  const int64_t C = p->c, O = p->oc, K = C * p->kh * p->kw, per_row = (p->ow + MR - 1) / MR;
  int64_t hq, wq;
  xq_dims(p, p->ow, &hq, &wq);
  float *xq = xq_padded(p, x, hq, wq, SC_XD);
  int32_t *ko = malloc((size_t)(K + 8) * sizeof(int32_t));
  if (!xq || !ko) {
    free(ko);
    sc_give(SC_XD, xq);
    return EX_ENOMEM;
  }
  for (int64_t k = 0; k < K + 8; k++) {
    const int64_t kk = EX_MIN(k, K - 1), c = kk / (p->kh * p->kw), i = kk / p->kw % p->kh, j = kk % p->kw;
    ko[k] = (int32_t)(((c * hq + i) * 2 + (j & 1)) * wq + j / 2);
  }
  /* units: B panels x ranges of output rows, about 4 a thread.  Where the rows are split, a
   * thread claims whole ranges, all the panels of each, so that the rows of xq it reads stay in
   * its L2 (64 -> 128 from 56 x 56 at two threads: 0.44 -> 0.39 ms, panels and ranges had been
   * claimed one by one, alternately) */
  const int64_t np = (O + NR - 1) / NR, nr = ko_ranges(np, p->oh), rch = (p->oh + nr - 1) / nr;
  ko_ctx g = {NULL, ko, wpk, NULL, p->ow, 2 * 2 * wq, per_row, p->oh * per_row, O, K, kc_step(K), np, rch * per_row};
  const int err = ko_run(&g, p, xq, C * hq * 2 * wq, nr > 1 ? np : 1, bias, res, y);
  free(ko);
  sc_give(SC_XD, xq);
  return err;
}

/* ---- 1x1, stride 1, few positions, transposed (conv_tr): the same implicit GEMM over the
 * input itself ----
 * Row i of A = x^T at step k is pixel n0 + i of channel k: x[k * N + n0 + i], so a tile of MR
 * consecutive pixels (the plane as one row of N) reads A in place at ko[k] = k * N and no
 * transposed copy is packed (perf put 11% of MobileNetV2's 576 -> 96 at 14x14 in that
 * packing).  Units: a B panel and a range of pixel tiles, about 4 a thread.  In the networks at
 * one thread, the layers taking it ran 8 - 14% faster in MobileNetV2 (1.79 -> 1.64 and 1.89 ->
 * 1.62 ms in all) and 2 - 6% in ResNet-50; at two threads only below 256 output channels
 * (conv_gemm): ResNet-50's 1024 -> 256 at 14x14, units split by panels so that both threads read
 * all 800 KB of x, ran 14% slower than the packed GEMM, and no better with the pixels split
 * between the threads. */
static int conv_1x1_tr(const ex_conv_params *p, const float *x, const float *wpk, const float *bias,
                       const float *res, float *y) {
  const int64_t C = p->c, O = p->oc, N = p->oh * p->ow, tiles = (N + MR - 1) / MR;
  int32_t *ko = malloc((size_t)(C + 8) * sizeof(int32_t));
  if (!ko) return EX_ENOMEM;
  for (int64_t k = 0; k < C + 8; k++) ko[k] = (int32_t)(EX_MIN(k, C - 1) * N);
  const int64_t np = (O + NR - 1) / NR, nr = ko_ranges(np, tiles);
  ko_ctx g = {NULL, ko, wpk, NULL, N, 0, tiles, tiles, O, C, kc_step(C), np, (tiles + nr - 1) / nr};
  const int err = ko_run(&g, p, x, C * N, 1, bias, res, y);
  free(ko);
  return err;
}
#endif

static int conv_gemm(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                     const float *res, float *y) {
  const int64_t G = p->groups, cg = p->c / G, ocg = p->oc / G, K = cg * p->kh * p->kw,
                N = p->oh * p->ow;
  const int direct = p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 && p->ph == 0 &&
                     p->pw == 0 && p->oh == p->h && p->ow == p->w;
  const int packed = packed_a_for(p->wpack, ocg, K) != NULL,
            packed_t = packed_b_for(p->wpack, K, ocg) != NULL;
  const int trans = conv_tr(p) && (packed_t || !packed);
#ifdef EX_AVX512
  if (direct && trans && packed_t && G == 1 && (ex_pool_width() == 1 || ocg < 256) &&
      (double)K * N < 2147483647.0) /* conv_1x1_tr; ko's offsets fit int32 */
    return conv_1x1_tr(p, x, p->wpack + PACK_HDR, bias, res, y);
  if (conv_s2_ok(p)) {
    if (packed_t) return conv_s2(p, x, p->wpack + PACK_HDR, bias, res, y);
    float *wk = malloc((size_t)packed_b_floats(K, ocg) * sizeof(float)); /* weights computed at run time */
    if (!wk) return EX_ENOMEM;
    gemm_pack_b(w, 1, K, K, ocg, wk);
    const int err = conv_s2(p, x, wk + PACK_HDR, bias, res, y);
    free(wk);
    return err;
  }
#endif
  /* im2col in chunks of output rows, so the column panel stays in cache (about 2 MB, but at
   * least 512 columns for the GEMM); the transposed small-N form takes all rows at once */
  /* kh x kw > 1: col is written straight in packed-B form (the GEMM packs no copy of it) or, for
   * the GEMM to read in place, row-major (below); in chunks of output rows of about I2C_PK floats
   * (2 MB) a thread: smaller chunks cost the stride-2 3x3 convolutions extra pool rounds and
   * narrower GEMMs (512 KB against 1 MB: 2-5% slower; at two threads on Zen 4, 1 MB for both 5-15%
   * slower than 2 MB; on a 2 MB L2 Intel core, 2 MB a thread against 1 MB ran 3x3 stride 2,
   * 128 -> 128 at 56x56, as one chunk instead of two: 1.18-1.22 -> 1.02-1.04 ms at two threads) */
#ifdef EX_AVX512
  /* few output channels and a short K (the stems): col row-major, which the AVX-512 GEMM reads in
   * place, saves the pass that cuts it into panels (3 -> 32 channels at 224 x 224: 10% faster) */
  const int inplace = !direct && !trans && p->kh * p->kw > 1 && ocg <= 12 * MR && K <= 256;
#else
  const int inplace = 0;
#endif
  const int pk = !direct && !trans && p->kh * p->kw > 1 && !inplace;
  const int64_t chunk = pk || inplace ? EX_MAX(4 * NR, I2C_PK * ex_pool_width() / K) : EX_MAX(512, 524288 / K);
  const int64_t rows = trans || direct ? p->oh : EX_MIN(p->oh, (chunk + p->ow - 1) / p->ow);
  float *col = direct ? NULL : sc_take(SC_COL, (size_t)(K * ROUND_UP(rows * p->ow, NR)));
  _Atomic int i2c_err = EX_OK;
  float *xd = !direct && p->sw == 2 && p->kw > 1 ? sc_take(SC_XD, (size_t)(cg * p->h * p->w)) : NULL;
  float *tr = trans ? sc_take(SC_TR, (size_t)(N * ocg)) : NULL;
  int err = (!direct && !col) || (!direct && p->sw == 2 && p->kw > 1 && !xd) || (trans && !tr) ? EX_ENOMEM : EX_OK;
  for (int64_t b = 0; b < p->n && !err; b++)
    for (int64_t g = 0; g < G && !err; g++) {
      const float *xg = x + (b * p->c + g * cg) * p->h * p->w;
      if (xd) { /* deinterleave the group's rows once: strided gathers become copies */
        dei_ctx dc = {xg, xd, p->w};
        ex_parallel_for(cg * p->h, EX_MAX(1, 8192 / p->w), dei_task, &dc);
      }
      const int64_t yo = (b * p->oc + g * ocg) * N;
      for (int64_t oy0 = 0; oy0 < p->oh && !err; oy0 += rows) {
        const int64_t oy1 = EX_MIN(p->oh, oy0 + rows), Nc = (oy1 - oy0) * p->ow, o0 = oy0 * p->ow;
        const float *B = xg;
        if (!direct) {
          i2c_ctx ic = {p, xg, col, xd, oy0, oy1, pk, &i2c_err};
          ex_parallel_for(K, EX_MAX(1, 16384 / EX_MAX(Nc, 1)), im2col_task, &ic);
          if ((err = i2c_err)) break;
          B = col;
        }
        if (trans) { /* T[N, ocg] = B^T @ W^T, then a blocked transpose with the epilogue */
          if (packed_t)
            err = sgemm_run(B, NULL, 1, N, NULL, p->wpack + g * packed_b_floats(K, ocg) + PACK_HDR, EX_F32,
                            1, K, tr, ocg, N, ocg, K, &EPI_NONE);
          else
            err = sgemm_ep(B, 1, N, w + g * ocg * K, EX_F32, 1, K, tr, ocg, N, ocg, K, &EPI_NONE);
          ctr_ctx tc = {p, tr, bias ? bias + g * ocg : NULL, res ? res + yo : NULL, y + yo, N, ocg};
          /* chunks of about 8K outputs: the pool gets several even at 7x7 */
          if (!err) ex_parallel_for((ocg + 15) / 16, EX_MAX(1, 8192 / (16 * N)), ctr_task, &tc);
          continue;
        }
        const epi_t ep = {bias ? bias + g * ocg : NULL, 1, res ? res + yo + o0 : NULL, N, p->act};
        const int64_t ldb = direct ? N : Nc;
        if (direct) B += o0;
        const float *apk = packed ? p->wpack + g * packed_a_floats(ocg, K) + PACK_HDR : NULL;
        if (pk)
          err = sgemm_run(w + g * ocg * K, apk, K, 1, NULL, col, EX_F32, 0, 0, y + yo + o0, N, ocg, Nc, K, &ep);
        else if (packed)
          err = sgemm_run(NULL, apk, K, 1, B, NULL, EX_F32, ldb, 1, y + yo + o0, N, ocg, Nc, K, &ep);
        else
          err = sgemm_ep(w + g * ocg * K, K, 1, B, EX_F32, ldb, 1, y + yo + o0, N, ocg, Nc, K, &ep);
      }
    }
  sc_give(SC_COL, col);
  sc_give(SC_TR, tr);
  sc_give(SC_XD, xd);
  return err;
}

/* ---- depthwise ----
 * 3x3 and 5x5 kernels at stride 1 or 2 (dilation 1) run the direct kernel of depthwise.c.  The
 * other shapes run here: each task zeroes one padded plane buffer once (the geometry is the same
 * for every plane, so only the interior is rewritten per plane and the border stays zero), then
 * accumulates each output row over the taps. */
typedef struct {
  const ex_conv_params *p;
  const float *x, *w, *bias, *res;
  float *y;
  _Atomic int err;
} dw_ctx;

static void dw_task(void *vctx, int64_t q0, int64_t q1) {
  dw_ctx *g = vctx;
  const ex_conv_params *p = g->p;
  const int64_t PH = (p->oh - 1) * p->sh + (p->kh - 1) * p->dh + 1,
                PW = (p->ow - 1) * p->sw + (p->kw - 1) * p->dw + 1;
  float *pad = calloc((size_t)(PH * PW + p->ow), sizeof(float));
  if (!pad) { g->err = EX_ENOMEM; return; }
  float *acc = pad + PH * PW;
  /* interior rows [r0, r1) and columns [c0, c1) of the padded plane that hold input */
  const int64_t r0 = EX_MIN(p->ph, PH), r1 = EX_MIN(PH, p->ph + p->h);
  const int64_t c0 = EX_MIN(p->pw, PW), c1 = EX_MIN(PW, p->pw + p->w);
  for (int64_t q = q0; q < q1; q++) { /* plane (image, channel) */
    const int64_t ch = q % p->c;
    const float *xc = g->x + q * p->h * p->w, *wc = g->w + ch * p->kh * p->kw;
    const float bv = g->bias ? g->bias[ch] : 0.0f;
    float *yq = g->y + q * p->oh * p->ow;
    const float *rq = g->res ? g->res + q * p->oh * p->ow : NULL;
    for (int64_t r = r0; r < r1 && c1 > c0; r++)
      memcpy(pad + r * PW + c0, xc + (r - p->ph) * p->w, (size_t)(c1 - c0) * sizeof(float));
    for (int64_t oy = 0; oy < p->oh; oy++) {
      for (int64_t ox = 0; ox < p->ow; ox++) acc[ox] = bv;
      for (int64_t i = 0; i < p->kh; i++) {
        const float *row = pad + (oy * p->sh + i * p->dh) * PW;
        for (int64_t j = 0; j < p->kw; j++) {
          const float wv = wc[i * p->kw + j], *s = row + j * p->dw;
          if (p->sw == 1)
            for (int64_t ox = 0; ox < p->ow; ox++) acc[ox] += wv * s[ox];
          else if (p->sw == 2)
            for (int64_t ox = 0; ox < p->ow; ox++) acc[ox] += wv * s[2 * ox];
          else
            for (int64_t ox = 0; ox < p->ow; ox++) acc[ox] += wv * s[ox * p->sw];
        }
      }
      float *yr = yq + oy * p->ow;
      if (rq) {
        const float *rr = rq + oy * p->ow;
        for (int64_t ox = 0; ox < p->ow; ox++) acc[ox] += rr[ox];
      }
      act_row(p->act, acc, p->ow);
      memcpy(yr, acc, (size_t)p->ow * sizeof(float));
    }
  }
  free(pad);
}

static int conv_depthwise(const ex_conv_params *p, const float *x, const float *w,
                          const float *bias, const float *res, float *y) {
  if (dwd_ok(p)) return dwd_run(p, x, w, bias, res, y); /* depthwise.c */
  dw_ctx g = {p, x, w, bias, res, y, 0};
  const int64_t per = p->oh * p->ow * p->kh * p->kw;
  ex_parallel_for(p->n * p->c, EX_MAX(1, 32768 / EX_MAX(per, 1)), dw_task, &g);
  return g.err;
}

/* ---- a pointwise expansion and the depthwise convolution after it, fused ----
 * y = dw(act1(w1 @ x + b1)) for a 1x1 convolution p1 (stride 1, unpadded, one group) feeding a
 * direct depthwise one p2 (dwd_ok; MobileNetV2's 16 -> 96 expansion at 112 x 112 and the 3x3
 * stride-2 depthwise after it): the expanded tensor (there 4.8 MB, past L2) is never written
 * whole.  Per band of output rows, the GEMM computes just the expanded rows the band reads into a
 * per-thread buffer of about PWDW_BAND bytes, and the depthwise kernel reads them while they are
 * in L2.  Bands run on the pool, each on one thread; the rows a band shares with the one its
 * thread ran before are moved within the buffer, not computed again (3-5% of the pair). */
#define PWDW_BAND ((int64_t)1 << 19) /* 1 MB bands measured 5% slower, 1.5 MB 20% */
typedef struct {
  const ex_conv_params *p1, *p2;
  const float *x, *w1, *b1, *w2, *b2, *res;
  float *y;
  int64_t rows, nb; /* output rows per band, bands per image */
  _Atomic int err;
} pd_ctx;

static void pwdw_task(void *vctx, int64_t u0, int64_t u1) {
  pd_ctx *g = vctx;
  const ex_conv_params *p1 = g->p1, *p2 = g->p2;
  const int64_t C = p1->c, E = p1->oc, H = p2->h, W = p2->w, S = p2->sh, K = p2->kh, OHW = p2->oh * p2->ow;
  float *buf = sc_take(SC_PWDW, (size_t)(E * EX_MIN(H, (g->rows - 1) * S + K) * W));
  if (!buf) { g->err = EX_ENOMEM; return; }
  const float *apk = packed_a_for(p1->wpack, E, C);
  const epi_t ep = {g->b1, 1, NULL, 0, p1->act};
  int64_t pa = 0, pb = 0, pn = 0; /* the previous band's rows [pa, pb) of this image (pn floats a plane) */
  for (int64_t u = u0; u < u1 && !g->err; u++) {
    const int64_t b = u / g->nb, oy0 = u % g->nb * g->rows, oy1 = EX_MIN(p2->oh, oy0 + g->rows);
    /* the input rows the band reads */
    const int64_t ia = EX_MIN(H, EX_MAX(0, oy0 * S - p2->ph)), ib = EX_MAX(ia, EX_MIN(H, (oy1 - 1) * S - p2->ph + K));
    const int64_t N = (ib - ia) * W;
    /* rows the previous band of this thread computed too are moved to the top of each plane
     * rather than computed again: planes in ascending order when they shrink, else descending,
     * so that no plane is overwritten before it is moved */
    const int64_t keep = u > u0 && u % g->nb && ia < pb && ia >= pa ? EX_MIN(pb, ib) - ia : 0;
    for (int64_t i = 0; i < E && keep > 0; i++) {
      const int64_t e = N <= pn ? i : E - 1 - i;
      memmove(buf + e * N, buf + e * pn + (ia - pa) * W, (size_t)(keep * W) * sizeof(float));
    }
    pa = ia, pb = ib, pn = N;
    const float *xb = g->x + b * C * H * W + (ia + keep) * W;
    int err = EX_OK;
    const int64_t Nc = N - keep * W; /* columns computed */
    if (Nc > 0)
      err = apk ? sgemm_run(NULL, apk, C, 1, xb, NULL, EX_F32, H * W, 1, buf + keep * W, N, E, Nc, C, &ep)
                : sgemm_ep(g->w1, C, 1, xb, EX_F32, H * W, 1, buf + keep * W, N, E, Nc, C, &ep);
    if (err) { g->err = err; break; }
    dwd_ctx d = {.p = p2, .x = buf, .w = g->w2, .bias = g->b2, .res = g->res ? g->res + b * E * OHW : NULL,
                 .y = g->y + b * E * OHW, .nstrip = 1, .rows = oy1 - oy0, .units = E, .claim = 1,
                 .oyb = oy0, .oye = oy1, .xplane = N, .ia = ia, .ib = ib};
    dwd_fn(p2)(&d, 0, E);
  }
  sc_give(SC_PWDW, buf); /* frees it only when it was too large to keep */
}

static int conv_pwdw(const ex_conv_params *p1, const float *w1, const float *b1, const ex_conv_params *p2,
                     const float *w2, const float *b2, const float *x, const float *res, float *y) {
  int err = conv_check(p1);
  if (err || (err = conv_check(p2))) return err;
  if (p1->kh != 1 || p1->kw != 1 || p1->sh != 1 || p1->sw != 1 || p1->ph || p1->pw || p1->groups != 1 ||
      p1->oh != p1->h || p1->ow != p1->w || !dwd_ok(p2) || p2->groups != p2->c || p2->oc != p2->c ||
      p2->n != p1->n || p2->c != p1->oc || p2->h != p1->oh || p2->w != p1->ow)
    return EX_EINVAL;
  if (p2->n * p2->oc * p2->oh * p2->ow == 0) return EX_OK;
  if (!x || !w1 || !w2 || !y) return EX_EINVAL;
  /* bands of an even number of output rows (stride 1 computes rows in pairs) whose expanded input
   * is about PWDW_BAND bytes; with threads, a multiple of their number per image */
  const int64_t nt = ex_pool_width(), per_row = p2->c * p2->w * p2->sh * (int64_t)sizeof(float);
  int64_t rows = EX_MIN(p2->oh, EX_MAX(2, PWDW_BAND / per_row / 2 * 2));
  int64_t nb = (p2->oh + rows - 1) / rows;
  if (nt > 1 && nb % nt) {
    nb = ROUND_UP(nb, nt);
    rows = EX_MAX(2, ROUND_UP((p2->oh + nb - 1) / nb, 2));
    nb = (p2->oh + rows - 1) / rows;
  }
  pd_ctx g = {p1, p2, x, w1, b1, w2, b2, res, y, rows, nb, EX_OK};
  ex_parallel_for(p2->n * nb, 1, pwdw_task, &g);
  return g.err;
}

/* ---- Winograd F(4x4, 3x3) ---- */
#define WT 256 /* tiles per block, at most (a multiple of 16) */
#ifdef EX_AVX512
#define WG_L 16 /* tiles per transform group: a lane each */
#else
#define WG_L 8
#endif

/* U[36][oc][ic] = G g G^T for every 3x3 kernel g = w[o][i] */
static int winograd_weights(const float *w, float *u, int64_t oc, int64_t ic) {
  if (!w || !u || oc < 1 || ic < 1) return EX_EINVAL;
  static const float G[6][3] = {{1.0f / 4, 0, 0},
                                {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                {0, 0, 1}};
  for (int64_t o = 0; o < oc; o++)
    for (int64_t i = 0; i < ic; i++) {
      const float *g = w + (o * ic + i) * 9;
      double t[6][3], r[6][6];
      for (int a = 0; a < 6; a++)
        for (int c = 0; c < 3; c++)
          t[a][c] = (double)G[a][0] * g[c] + (double)G[a][1] * g[3 + c] + (double)G[a][2] * g[6 + c];
      for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
          r[a][b] = t[a][0] * G[b][0] + t[a][1] * G[b][1] + t[a][2] * G[b][2];
      for (int x = 0; x < 36; x++) u[(x * oc + o) * ic + i] = (float)r[x / 6][x % 6];
    }
  return EX_OK;
}

/* 1-D input transform B^T d of 6 values */
#define WG_BT(d0, d1, d2, d3, d4, d5, o)          \
  do {                                            \
    o[0] = 4 * d0 - 5 * d2 + d4;                  \
    o[1] = -4 * (d1 + d2) + d3 + d4;              \
    o[2] = 4 * (d1 - d2) - d3 + d4;               \
    o[3] = 2 * (d3 - d1) - d2 + d4;               \
    o[4] = 2 * (d1 - d3) - d2 + d4;               \
    o[5] = 4 * d1 - 5 * d3 + d5;                  \
  } while (0)
/* 1-D output transform A^T m of 6 values */
#define WG_AT(m0, m1, m2, m3, m4, m5, o)          \
  do {                                            \
    o[0] = m0 + (m1 + m2) + (m3 + m4);            \
    o[1] = (m1 - m2) + 2 * (m3 - m4);             \
    o[2] = (m1 + m2) + 4 * (m3 + m4);             \
    o[3] = (m1 - m2) + 8 * (m3 - m4) + m5;        \
  } while (0)

#ifdef EX_AVX2
/* 8 tiles x 4 consecutive floats (s[4l + q]) -> 4 vectors, lane l of vector q = s[4l + q] */
static inline void wg_deint4(const float *s, __m256 *q) {
  const __m256 v0 = _mm256_loadu_ps(s), v1 = _mm256_loadu_ps(s + 8), v2 = _mm256_loadu_ps(s + 16),
               v3 = _mm256_loadu_ps(s + 24);
  const __m256 a = _mm256_permute2f128_ps(v0, v2, 0x20), b = _mm256_permute2f128_ps(v0, v2, 0x31),
               c = _mm256_permute2f128_ps(v1, v3, 0x20), d = _mm256_permute2f128_ps(v1, v3, 0x31);
  const __m256 t0 = _mm256_unpacklo_ps(a, b), t1 = _mm256_unpackhi_ps(a, b),
               t2 = _mm256_unpacklo_ps(c, d), t3 = _mm256_unpackhi_ps(c, d);
  q[0] = _mm256_shuffle_ps(t0, t2, 0x44);
  q[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
  q[2] = _mm256_shuffle_ps(t1, t3, 0x44);
  q[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}
/* the inverse: 4 vectors -> 32 floats as 4 vectors, float 4 l + q of the 32 = lane l of q[q] */
static inline void wg_int4(const __m256 *q, __m256 *d) {
  const __m256 t0 = _mm256_unpacklo_ps(q[0], q[1]), t1 = _mm256_unpackhi_ps(q[0], q[1]),
               t2 = _mm256_unpacklo_ps(q[2], q[3]), t3 = _mm256_unpackhi_ps(q[2], q[3]);
  const __m256 a = _mm256_shuffle_ps(t0, t2, 0x44), b = _mm256_shuffle_ps(t0, t2, 0xEE),
               c = _mm256_shuffle_ps(t1, t3, 0x44), e = _mm256_shuffle_ps(t1, t3, 0xEE);
  /* a = tiles {0, 4}, b = {1, 5}, c = {2, 6}, e = {3, 7} */
  d[0] = _mm256_permute2f128_ps(a, b, 0x20);
  d[1] = _mm256_permute2f128_ps(c, e, 0x20);
  d[2] = _mm256_permute2f128_ps(a, b, 0x31);
  d[3] = _mm256_permute2f128_ps(c, e, 0x31);
}
/* lanes [lo, hi) of 8 floats at p: loaded (the rest zero) and stored (the rest untouched); the
 * lanes outside are never accessed */
static inline __m256 wg_ld(const float *p, int lo, int hi) {
  if (lo == 0 && hi == 8) return _mm256_loadu_ps(p);
#ifdef EX_AVX512
  return _mm256_maskz_loadu_ps((__mmask8)(((1u << hi) - 1) & ~((1u << lo) - 1)), p);
#else
  const __m256i i = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_and_si256(_mm256_cmpgt_epi32(i, _mm256_set1_epi32(lo - 1)),
                                                _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), i)));
#endif
}
static inline void wg_st(float *p, __m256 v, int lo, int hi) {
  if (lo == 0 && hi == 8) { _mm256_storeu_ps(p, v); return; }
#ifdef EX_AVX512
  _mm256_mask_storeu_ps(p, (__mmask8)(((1u << hi) - 1) & ~((1u << lo) - 1)), v);
#else
  const __m256i i = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  _mm256_maskstore_ps(p, _mm256_and_si256(_mm256_cmpgt_epi32(i, _mm256_set1_epi32(lo - 1)),
                                          _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), i)), v);
#endif
}
#endif

typedef struct {
  const ex_conv_params *p;
  const float *x, *u, *bias, *res;
  float *y;
  int64_t tw, th, T, total, tb, tbp; /* tiles per row/column/image, all tiles, tiles per block */
  const float *xp;                   /* NULL, or the input zero-padded to (4 th + 2) x xpw */
  int64_t xpw;
  const float *upk;                  /* NULL, or U pre-packed as GEMM A (ex_conv_pack_weights) */
  int64_t vx, mx;                    /* floats of V and of M per transform point x */
  _Atomic int err;
} wg_ctx;

/* V[x] is written straight in the GEMM's packed-B layout (K blocks of kc_step(C) channels,
 * NR-tile panels, np = ROUND_UP(nt, NR) columns): the offset of channel c, tile j */
static inline int64_t wg_voff(int64_t C, int64_t np, int64_t c, int64_t j) {
  const int64_t ks = kc_step(C), pc = c / ks * ks, kc = EX_MIN(ks, C - pc);
  return pc * np + j / NR * kc * NR + (c - pc) * NR + j % NR;
}

#ifdef EX_AVX2
/* A transform group's tiles (L of them, a lane each) fall in runs, consecutive tiles of one tile
 * row (a group of 16 crosses a row of 14 tiles at 56 x 56).  On the way in (AVX-512), each run is
 * read as whole rows of the padded input (its 4 n + 2 floats, as if the group's first lane began
 * 4 l0 floats before it), the columns 4 l + q split out in registers, and blended into the lanes
 * it owns; on the way out, each run's output rows are written whole, under masks where it starts
 * or ends inside a vector.  The runs are found once a group, for all the channels. */
typedef struct {
  int64_t off;           /* input: lane 0's virtual window (channel 0); output: the run's first float */
  int l0, n, rows;       /* first lane; output floats a row, and rows */
#ifdef EX_AVX512
  __mmask16 lanes, m[6]; /* input: the run's lanes, and the floats of a row loaded, 16 v .. 16 v + 15
                          * for m[v], v < 4, then float 64 (m[4]) and 65 (m[5]) */
#endif
} wg_run;

/* the runs of the group of L tiles from j (of the block's nt tiles from t0), for the input side
 * (in, AVX-512 only) or the output side; their count */
static int wg_runs(const wg_ctx *g, int64_t t0, int64_t j, int64_t nt, int L, int in, wg_run *ru) {
  const ex_conv_params *p = g->p;
  int nr = 0;
  for (int l = 0; l < L && j + l < nt;) {
    const int64_t t = t0 + j + l, tt = t % g->T, b = t / g->T, ty = tt / g->tw, tx = tt % g->tw;
    const int n = (int)EX_MIN(EX_MIN(L - l, nt - j - l), g->tw - tx);
    wg_run *u = &ru[nr++];
    u->l0 = l;
#ifdef EX_AVX512
    if (in) {
      u->off = ((b * p->c) * (4 * g->th + 2) + 4 * ty) * g->xpw + 4 * tx - 4 * l;
      u->lanes = (__mmask16)(((1u << (l + n)) - 1) & ~((1u << l) - 1));
      const int f0 = 4 * l, f1 = 4 * (l + n) + 2; /* floats [f0, f1) of the 66 */
      for (int v = 0; v < 6; v++) {
        const int base = v < 4 ? 16 * v : 60 + v; /* m[4]: float 64 at lane 0, m[5]: 65 */
        const int nl = v < 4 ? 16 : 1;
        uint32_t m = 0;
        for (int i = 0; i < nl; i++) m |= (uint32_t)(base + i >= f0 && base + i < f1) << i;
        u->m[v] = (__mmask16)m;
      }
      l += n;
      continue;
    }
#else
    (void)in;
#endif
    u->off = b * p->oc * p->oh * p->ow + 4 * ty * p->ow + 4 * tx;
    u->n = (int)EX_MIN(4 * n, p->ow - 4 * tx);
    u->rows = (int)EX_MIN(4, p->oh - 4 * ty);
    l += n;
  }
  return nr;
}

/* the output runs of a block's groups of L: group k's are ru[run0[k]] .. ru[run0[k + 1] - 1] */
static void wg_out_runs(const wg_ctx *g, int64_t t0, int64_t nt, int L, wg_run *ru, int *run0) {
  int nr = 0;
  for (int64_t j = 0; j < nt; j += L) {
    run0[j / L] = nr;
    nr += wg_runs(g, t0, j, nt, L, 0, ru + nr);
  }
  run0[(nt + L - 1) / L] = nr;
}
#endif

#ifdef EX_AVX512
/* ---- the AVX-512 transforms: 16 tiles a group, one a lane (the runs above) ---- */
static void wg_in16(const wg_ctx *g, int64_t t0, float *V, int64_t c0, int64_t c1) {
  const ex_conv_params *p = g->p;
  const int64_t C = p->c, nt = EX_MIN(g->tb, g->total - t0), np = ROUND_UP(nt, NR), n16 = ROUND_UP(nt, 16);
  const int64_t plane = (4 * g->th + 2) * g->xpw, W = g->xpw;
  if (n16 < np) /* the packed panels' columns past the last group: zero */
    for (int x = 0; x < 36; x++)
      for (int64_t c = c0; c < c1; c++)
        memset(V + x * g->vx + wg_voff(C, np, c, n16), 0, (size_t)(np - n16) * sizeof(float));
  const __m512i i4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
                one = _mm512_set1_epi32(1);
  for (int64_t j = 0; j < nt; j += 16) {
    wg_run ru[16];
    const int nr = wg_runs(g, t0, j, nt, 16, 1, ru);
    for (int64_t c = c0; c < c1; c++) {
      __m512 h[6][6]; /* h[r][k]: input row r across the tile, transformed: d B */
      for (int r = 0; r < 6; r++) {
        __m512 q[6] = {_mm512_setzero_ps()};
        for (int k = 0; k < nr; k++) {
          const wg_run *u = &ru[k];
          const float *s = g->xp + c * plane + u->off + r * W;
          const __m512 v0 = _mm512_maskz_loadu_ps(u->m[0], s), v1 = _mm512_maskz_loadu_ps(u->m[1], s + 16),
                       v2 = _mm512_maskz_loadu_ps(u->m[2], s + 32), v3 = _mm512_maskz_loadu_ps(u->m[3], s + 48),
                       v4 = _mm512_maskz_loadu_ps(u->m[4], s + 64), v5 = _mm512_maskz_loadu_ps(u->m[5], s + 65);
          __m512 w[6];
          __m512i ix = i4;
          for (int e = 0; e < 4; e++, ix = _mm512_add_epi32(ix, one)) /* lane l: float 4 l + e */
            w[e] = _mm512_mask_blend_ps(0xFF00, _mm512_permutex2var_ps(v0, ix, v1),
                                        _mm512_permutex2var_ps(v2, ix, v3));
          w[4] = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v4), _mm512_castps_si512(w[0]), 1));
          w[5] = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v5), _mm512_castps_si512(w[1]), 1));
          for (int e = 0; e < 6; e++) q[e] = _mm512_mask_mov_ps(q[e], u->lanes, w[e]);
        }
        WG_BT(q[0], q[1], q[2], q[3], q[4], q[5], h[r]);
      }
      const int64_t vo = wg_voff(C, np, c, j);
      for (int k = 0; k < 6; k++) {
        __m512 o[6];
        WG_BT(h[0][k], h[1][k], h[2][k], h[3][k], h[4][k], h[5][k], o);
        for (int r = 0; r < 6; r++) _mm512_storeu_ps(V + (r * 6 + k) * g->vx + vo, o[r]);
      }
    }
  }
}

static void wg_out16(const wg_ctx *g, int64_t t0, const float *M, int64_t o0, int64_t o1) {
  const ex_conv_params *p = g->p;
  const int64_t nt = EX_MIN(g->tb, g->total - t0), S = g->tbp, OHW = p->oh * p->ow;
  wg_run ru[WT];
  int run0[WT / 16 + 1];
  wg_out_runs(g, t0, nt, 16, ru, run0);
  for (int64_t o = o0; o < o1; o++) {
    const __m512 bv = _mm512_set1_ps(g->bias ? g->bias[o] : 0.0f);
    for (int64_t j = 0; j < nt; j += 16) {
      __m512 t[4][6], row[4][4];
      for (int q = 0; q < 6; q++) {
        __m512 m[6];
        for (int r = 0; r < 6; r++) m[r] = _mm512_loadu_ps(M + (6 * r + q) * g->mx + o * S + j);
        __m512 r4[4];
        WG_AT(m[0], m[1], m[2], m[3], m[4], m[5], r4);
        for (int r = 0; r < 4; r++) t[r][q] = r4[r];
      }
      for (int r = 0; r < 4; r++) {
        __m512 c4[4];
        WG_AT(t[r][0], t[r][1], t[r][2], t[r][3], t[r][4], t[r][5], c4);
        /* 4 x 16 -> 16 x 4: float 4 l + q of the row's 64 = lane l of c4[q] */
        const __m512 a0 = _mm512_unpacklo_ps(c4[0], c4[1]), a1 = _mm512_unpackhi_ps(c4[0], c4[1]),
                     a2 = _mm512_unpacklo_ps(c4[2], c4[3]), a3 = _mm512_unpackhi_ps(c4[2], c4[3]);
        const __m512 u0 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a0), _mm512_castps_pd(a2))),
                     u1 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a0), _mm512_castps_pd(a2))),
                     u2 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a1), _mm512_castps_pd(a3))),
                     u3 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a1), _mm512_castps_pd(a3)));
        /* u_i: tile 4 k + i in its 128-bit lane k */
        const __m512 s0 = _mm512_shuffle_f32x4(u0, u1, 0x44), s1 = _mm512_shuffle_f32x4(u0, u1, 0xEE),
                     s2 = _mm512_shuffle_f32x4(u2, u3, 0x44), s3 = _mm512_shuffle_f32x4(u2, u3, 0xEE);
        row[r][0] = _mm512_add_ps(_mm512_shuffle_f32x4(s0, s2, 0x88), bv);
        row[r][1] = _mm512_add_ps(_mm512_shuffle_f32x4(s0, s2, 0xDD), bv);
        row[r][2] = _mm512_add_ps(_mm512_shuffle_f32x4(s1, s3, 0x88), bv);
        row[r][3] = _mm512_add_ps(_mm512_shuffle_f32x4(s1, s3, 0xDD), bv);
      }
      for (int k = run0[j / 16]; k < run0[j / 16 + 1]; k++) {
        const wg_run u = ru[k];
        const int64_t off = o * OHW + u.off - 4 * u.l0; /* float 4 l0 of a row at the run's start */
        for (int r = 0; r < u.rows; r++)
          for (int v = u.l0 / 4; v < 4 && 16 * v < 4 * u.l0 + u.n; v++) {
            const int lo = EX_MAX(0, 4 * u.l0 - 16 * v), hi = EX_MIN(16, 4 * u.l0 + u.n - 16 * v);
            const __mmask16 mk = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
            const int64_t e = off + r * p->ow + 16 * v;
            __m512 y = row[r][v];
            if (g->res) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mk, g->res + e));
            if (p->act == EX_ACT_RELU || p->act == EX_ACT_RELU6) {
              y = relu512(y, p->act);
            } else if (p->act != EX_ACT_NONE) {
              float f[16];
              _mm512_storeu_ps(f, y);
              act_row(p->act, f + lo, hi - lo);
              y = _mm512_loadu_ps(f);
            }
            _mm512_mask_storeu_ps(g->y + e, mk, y);
          }
      }
    }
  }
}
#endif

/* input transform of the block's tiles from t0, channels [c0, c1): V[36] packed [C][np] */
static void wg_in(const wg_ctx *g, int64_t t0, float *V, int64_t c0, int64_t c1) {
#ifdef EX_AVX512
  if (g->xp) { wg_in16(g, t0, V, c0, c1); return; }
#endif
  const ex_conv_params *p = g->p;
  const int64_t C = p->c, nt = EX_MIN(g->tb, g->total - t0);
  const int64_t HW = p->h * p->w, np = ROUND_UP(nt, NR), nt8 = ROUND_UP(nt, 8);
  /* the packed panels' columns past the last 8-tile group: zero */
  if (nt8 < np)
    for (int x = 0; x < 36; x++)
      for (int64_t c = c0; c < c1; c++)
        memset(V + x * g->vx + wg_voff(C, np, c, nt8), 0, (size_t)(np - nt8) * sizeof(float));
  for (int64_t j = 0; j < nt; j += 8) {
    int64_t ib[8], iy0[8], ix0[8];
    int inside[8];
    for (int l = 0; l < 8; l++) {
      const int64_t t = t0 + EX_MIN(j + l, nt - 1), tt = t % g->T;
      ib[l] = t / g->T;
      iy0[l] = tt / g->tw * 4 - p->ph;
      ix0[l] = tt % g->tw * 4 - p->pw;
      inside[l] = iy0[l] >= 0 && ix0[l] >= 0 && iy0[l] + 6 <= p->h && ix0[l] + 6 <= p->w;
    }
    /* fast: 8 tiles of one tile row, read from the padded copy with in-register transposes */
#ifdef EX_AVX2
    const int row8 = g->xp && j + 8 <= nt && ib[0] == ib[7] && iy0[0] == iy0[7] && ix0[7] == ix0[0] + 28;
#endif
    for (int64_t c = c0; c < c1; c++) {
      cv8 d[6][6], t[6][6];
#ifdef EX_AVX2
      if (row8) {
        const float *s0 = g->xp + ((ib[0] * C + c) * (4 * g->th + 2) + iy0[0] + p->ph) * g->xpw + ix0[0] + p->pw;
        for (int r = 0; r < 6; r++) {
          __m256 q4[4], h4[4];
          wg_deint4(s0 + r * g->xpw, q4);
          wg_deint4(s0 + r * g->xpw + 4, h4);
          for (int q = 0; q < 4; q++) memcpy(&d[r][q], &q4[q], sizeof(cv8));
          memcpy(&d[r][4], &h4[0], sizeof(cv8));
          memcpy(&d[r][5], &h4[1], sizeof(cv8));
        }
      } else if (g->xp) { /* any 8 tiles: 8 rows of 8 floats per tile row r, transposed */
        const float *s[8];
        for (int l = 0; l < 8; l++)
          s[l] = g->xp + ((ib[l] * C + c) * (4 * g->th + 2) + iy0[l] + p->ph) * g->xpw + ix0[l] + p->pw;
        for (int r = 0; r < 6; r++) {
          __m256 q8[8];
          for (int l = 0; l < 8; l++) q8[l] = _mm256_loadu_ps(s[l] + r * g->xpw);
          tr8(q8);
          for (int q = 0; q < 6; q++) memcpy(&d[r][q], &q8[q], sizeof(cv8));
        }
      } else
#endif
      for (int l = 0; l < 8; l++) {
        const float *xc = g->x + (ib[l] * C + c) * HW;
        if (g->xp) {
          const float *s = g->xp + ((ib[l] * C + c) * (4 * g->th + 2) + iy0[l] + p->ph) * g->xpw + ix0[l] + p->pw;
          for (int r = 0; r < 6; r++)
            for (int q = 0; q < 6; q++) d[r][q][l] = s[r * g->xpw + q];
        } else if (inside[l]) {
          const float *s = xc + iy0[l] * p->w + ix0[l];
          for (int r = 0; r < 6; r++)
            for (int q = 0; q < 6; q++) d[r][q][l] = s[r * p->w + q];
        } else {
          for (int r = 0; r < 6; r++)
            for (int q = 0; q < 6; q++) {
              const int64_t iy = iy0[l] + r, ix = ix0[l] + q;
              d[r][q][l] = iy >= 0 && iy < p->h && ix >= 0 && ix < p->w ? xc[iy * p->w + ix] : 0.0f;
            }
        }
      }
      for (int q = 0; q < 6; q++) {
        cv8 o[6];
        WG_BT(d[0][q], d[1][q], d[2][q], d[3][q], d[4][q], d[5][q], o);
        for (int r = 0; r < 6; r++) t[r][q] = o[r];
      }
      for (int r = 0; r < 6; r++) {
        cv8 o[6];
        WG_BT(t[r][0], t[r][1], t[r][2], t[r][3], t[r][4], t[r][5], o);
        const int64_t vo = wg_voff(C, np, c, j);
        for (int q = 0; q < 6; q++) memcpy(V + (r * 6 + q) * g->vx + vo, &o[q], sizeof(cv8));
      }
    }
  }
}

/* GEMM units [u0, u1): unit u is rows [O * r / mo, O * (r + 1) / mo) (in whole MR panels) of
 * GEMM x = u / mo, r = u % mo, of the 36: M[x][O][S] = U[x][O][C] @ V[x][C][S] */
static int wg_gemms(const wg_ctx *g, int64_t t0, const float *V, float *M, int64_t u0, int64_t u1,
                    int64_t mo) {
  const int64_t C = g->p->c, O = g->p->oc, nt = EX_MIN(g->tb, g->total - t0), S = g->tbp;
  const int64_t mb = (O + MR - 1) / MR;
  int err = EX_OK;
  for (int64_t u = u0; u < u1 && !err; u++) {
    const int64_t x = u / mo, r = u % mo;
    const float *upk = g->upk ? g->upk + x * packed_a_floats(O, C) + PACK_HDR : NULL;
    if (mo == 1) {
      err = sgemm_run(g->u + x * O * C, upk, C, 1, NULL, V + x * g->vx, EX_F32, 0, 0, M + x * g->mx, S,
                      O, nt, C, &EPI_NONE);
      continue;
    }
    sg_ctx sg = {g->u + x * O * C, NULL, EX_F32, M + x * g->mx, C, 1, 0, 0, S, O, nt, C, &EPI_NONE,
                 upk, V + x * g->vx, 1, 1, MR, NULL, 0, 0, 0, kc_step(C), upk ? 'a' : 0, 0};
    err = sgemm_range(&sg, EX_MIN(O, mb * r / mo * MR), EX_MIN(O, mb * (r + 1) / mo * MR), 0, nt);
  }
  return err;
}

/* output transform + epilogue, output channels [o0, o1): each channel's 36 rows of M read front
 * to back */
static void wg_out(const wg_ctx *g, int64_t t0, const float *M, int64_t o0, int64_t o1) {
#ifdef EX_AVX512
  wg_out16(g, t0, M, o0, o1);
  return;
#endif
  const ex_conv_params *p = g->p;
  const int64_t O = p->oc, nt = EX_MIN(g->tb, g->total - t0), S = g->tbp, OHW = p->oh * p->ow;
#ifdef EX_AVX2
  wg_run runs[WT];
  int run0[WT / 8 + 1];
  wg_out_runs(g, t0, nt, 8, runs, run0);
#endif
  for (int64_t o = o0; o < o1; o++) {
    for (int64_t j = 0; j < nt; j += 8) {
      cv8 m[6][6], t[4][6];
      for (int r = 0; r < 6; r++)
        for (int q = 0; q < 6; q++) memcpy(&m[r][q], M + (6 * r + q) * g->mx + o * S + j, sizeof(cv8));
      for (int q = 0; q < 6; q++) {
        cv8 r4[4];
        WG_AT(m[0][q], m[1][q], m[2][q], m[3][q], m[4][q], m[5][q], r4);
        for (int r = 0; r < 4; r++) t[r][q] = r4[r];
      }
      float out[4][4][8];
      for (int r = 0; r < 4; r++) {
        cv8 r4[4];
        WG_AT(t[r][0], t[r][1], t[r][2], t[r][3], t[r][4], t[r][5], r4);
        for (int q = 0; q < 4; q++) memcpy(out[r][q], &r4[q], sizeof(cv8));
      }
      const float bv = g->bias ? g->bias[o] : 0.0f;
#ifdef EX_AVX2
      { /* each run of the group's tiles as whole output rows: 32 floats interleaved from the 8
         * tiles, + bias (+ residual), activation, stored under a mask where a run starts or ends
         * inside a vector */
        const __m256 bv8 = _mm256_set1_ps(bv);
        __m256 row[4][4];
        for (int r = 0; r < 4; r++) {
          __m256 q4[4];
          for (int q = 0; q < 4; q++) memcpy(&q4[q], &out[r][q], sizeof(cv8));
          wg_int4(q4, row[r]);
          for (int v = 0; v < 4; v++) row[r][v] = _mm256_add_ps(row[r][v], bv8);
        }
        for (int k = run0[j / 8]; k < run0[j / 8 + 1]; k++) {
          const wg_run u = runs[k];
          const int64_t off = o * OHW + u.off - 4 * u.l0; /* float 4 l0 of a row at off + 4 l0 */
          for (int r = 0; r < u.rows; r++)
            for (int v = u.l0 / 2; v < 4 && 8 * v < 4 * u.l0 + u.n; v++) {
              const int lo = EX_MAX(0, 4 * u.l0 - 8 * v), hi = EX_MIN(8, 4 * u.l0 + u.n - 8 * v);
              const int64_t e = off + r * p->ow + 8 * v;
              __m256 y8 = row[r][v];
              if (g->res) y8 = _mm256_add_ps(y8, wg_ld(g->res + e, lo, hi));
              if (p->act == EX_ACT_RELU || p->act == EX_ACT_RELU6) { /* NaN passes (act_row) */
                y8 = relu256(y8, p->act);
              } else if (p->act != EX_ACT_NONE) {
                float f[8];
                _mm256_storeu_ps(f, y8);
                act_row(p->act, f + lo, hi - lo);
                y8 = _mm256_loadu_ps(f);
              }
              wg_st(g->y + e, y8, lo, hi);
            }
        }
        continue;
      }
#endif
      for (int l = 0; l < 8 && j + l < nt; l++) {
        const int64_t t = t0 + j + l, tt = t % g->T, b = t / g->T;
        const int64_t oy0 = tt / g->tw * 4, ox0 = tt % g->tw * 4;
        const int64_t yo = (b * O + o) * OHW;
        for (int r = 0; r < 4 && oy0 + r < p->oh; r++) {
          float row[4];
          const int64_t nq = EX_MIN(4, p->ow - ox0), off = yo + (oy0 + r) * p->ow + ox0;
          for (int q = 0; q < nq; q++) row[q] = out[r][q][l] + bv;
          if (g->res)
            for (int q = 0; q < nq; q++) row[q] += g->res[off + q];
          act_row(p->act, row, nq);
          memcpy(g->y + off, row, (size_t)nq * sizeof(float));
        }
      }
    }
  }
}

static void wg_task(void *vctx, int64_t b0, int64_t b1) {
  wg_ctx *g = vctx;
  const ex_conv_params *p = g->p;
  float *V = sc_take(SC_WG_V, (size_t)(36 * (g->vx + g->mx)));
  if (!V) { g->err = EX_ENOMEM; return; }
  for (int64_t b = b0; b < b1; b++) {
    wg_in(g, b * g->tb, V, 0, p->c);
    const int err = wg_gemms(g, b * g->tb, V, V + 36 * g->vx, 0, 36, 1);
    if (err) g->err = err;
    wg_out(g, b * g->tb, V + 36 * g->vx, 0, p->oc);
  }
  sc_give(SC_WG_V, V);
}

/* one block shared by the pool in three phases: channels, the 36 GEMMs, output channels */
typedef struct {
  wg_ctx *g;
  int64_t t0, mo;
  float *V, *M;
} wgp_ctx;

static void wgp_in(void *vctx, int64_t c0, int64_t c1) {
  const wgp_ctx *c = vctx;
  wg_in(c->g, c->t0, c->V, c0, c1);
}
static void wgp_gemm(void *vctx, int64_t x0, int64_t x1) {
  const wgp_ctx *c = vctx;
  const int err = wg_gemms(c->g, c->t0, c->V, c->M, x0, x1, c->mo);
  if (err) c->g->err = err;
}
static void wgp_out(void *vctx, int64_t o0, int64_t o1) {
  const wgp_ctx *c = vctx;
  wg_out(c->g, c->t0, c->M, o0, o1);
}

static int conv_winograd(const ex_conv_params *p, const float *x, const float *u,
                         const float *bias, const float *res, float *y) {
  if (p->kh != 3 || p->kw != 3 || p->sh != 1 || p->sw != 1 || p->dh != 1 || p->dw != 1 ||
      p->groups != 1)
    return EX_EINVAL;
  wg_ctx g = {p, x, u, bias, res, y, (p->ow + 3) / 4, (p->oh + 3) / 4, 0, 0, 0, 0, NULL, 0,
              packed_a_for(p->wpack, p->oc, p->c) && p->wpack[WG_MARK] == 36 ? p->wpack : NULL, 0, 0, 0};
  g.T = g.tw * g.th;
  g.total = g.T * p->n;
  /* each of the 36 GEMMs streams its slice of V and M once: favour wide N (up to WT tiles).
   * With fewer than 96 tiles a thread, blocks run one after another, each shared by the pool in
   * three phases; otherwise each block runs on one thread, a whole number of blocks a thread
   * (ResNet's 64 -> 64 at 56 x 56, 196 tiles, as two blocks of 104 and 92 rather than one shared
   * in phases: 3-7% faster at two threads, 12% with AVX2; 49 tiles as two blocks: 5% slower) */
  const int nt = ex_pool_width();
  const int64_t nb0 = (g.total + WT - 1) / WT;
  const int phased = nt > 1 && g.total < 96 * nt;
  const int64_t nb = phased ? nb0 : ROUND_UP(EX_MAX(nb0, nt), nt);
  g.tb = EX_MIN(WT, ROUND_UP((g.total + nb - 1) / nb, 8));
  /* rows of M hold whole transform groups of WG_L tiles, 8 floats more where they would be a
   * multiple of 64 (4K-aliased rows) */
  const int64_t tr = ROUND_UP(g.tb, WG_L);
  g.tbp = tr + 8 * (tr % 64 == 0);
  /* each point's V and M 16 floats past a multiple of 64: their 36 streams in a transform would
   * otherwise often be a multiple of 4 KB apart, all on the same L1 sets */
  g.vx = ROUND_UP(p->c * ROUND_UP(g.tb, NR), 64) + 16;
  g.mx = ROUND_UP(p->oc * g.tbp, 64) + 16;
  const int64_t nblk = (g.total + g.tb - 1) / g.tb;
  float *xp = NULL;
#ifdef EX_AVX2
  { /* zero-padded input: every tile reads in bounds (+8 floats of slack per row) */
    g.xpw = 4 * g.tw + 2 + 8;
    g.xp = xp = xq_padded(p, x, 4 * g.th + 2, g.xpw, SC_WG_X);
  }
#endif
  if (phased) {
    float *V = sc_take(SC_WG_V, (size_t)(36 * (g.vx + g.mx)));
    if (!V) g.err = EX_ENOMEM;
    /* GEMM units: each GEMM's rows in two halves when there are enough, for finer balance */
    const int64_t mo = p->oc >= 4 * MR ? 2 : 1;
    for (int64_t b = 0; b < nblk && !g.err; b++) {
      wgp_ctx c = {&g, b * g.tb, mo, V, V + 36 * g.vx};
      ex_parallel_for(p->c, EX_MAX(1, 2048 / g.tb), wgp_in, &c);
      ex_parallel_for(36 * mo, 1, wgp_gemm, &c);
      ex_parallel_for(p->oc, EX_MAX(1, 2048 / g.tb), wgp_out, &c);
    }
    sc_give(SC_WG_V, V);
  } else {
    ex_parallel_for(nblk, 1, wg_task, &g);
  }
  sc_give(SC_WG_X, xp);
  return g.err;
}

/* ---- Winograd F(2x2, 3x3) ----
 * On small planes (the 14x14 stage) F(4x4) wastes much of its tiles (4 x 4 tiles of 4 cover
 * 16 x 16) and leaves its 36 GEMMs 16 columns; F(2x2) tiles 14 x 14 exactly with 49 tiles, 16
 * GEMMs of 4 multiplies per output.  The GEMMs run transposed, M[x][t][o] = V[x][t][c] @
 * U[x][c][o], so the tiles fill the micro-kernel's MR rows (49 of 56) and the output channels its
 * NR columns.  V is written straight in packed-A form; U[16][oc][c] (from the planner) is packed
 * as B once (ex_conv_pack_weights, marked 16 in the header so F(4x4) never takes it).  Per block
 * of tiles, three phases on the pool: input transform by channel, the 16 GEMMs, output
 * transform + epilogue by output channel. */
typedef struct {
  const ex_conv_params *p;
  const float *u, *upk, *bias, *res; /* upk: NULL, or U packed as 16 B matrices */
  float *y;
  const float *xp;                   /* the input zero-padded to xph x xpw per plane */
  int64_t *soff;                     /* per tile of the block: its window's offset in xp, channel 0 */
  int64_t xph, xpw, tw, T;           /* tiles per row, per image */
  int64_t t0, nt, mp;                /* this block: tiles [t0, t0 + nt), mp = nt rounded to MR */
  int64_t vx, mx;                    /* floats per point of V and M */
  float *V, *M;                      /* V[16][vx]: mp x c packed A, M[16][mx]: nt x oc */
  _Atomic int err;
} w2_ctx;

/* V = B^T d B of each 4x4 input tile, channels [c0, c1): a panel of MR tiles at a time, gathered
 * into d[point][tile], transformed across the tiles as vectors, stored as 16 runs of MR */
static void w2_in(void *vctx, int64_t c0, int64_t c1) {
  const w2_ctx *g = vctx;
  const int64_t C = g->p->c, ks = kc_step(C), vx = g->vx, W = g->xpw, plane = g->xph * W;
  for (int64_t c = c0; c < c1; c++) {
    const int64_t pc = c / ks * ks, kc = EX_MIN(ks, C - pc);
    const float *xc = g->xp + c * plane;
    for (int64_t j0 = 0; j0 < g->mp; j0 += MR) {
      float d[16][MR], v[16][MR];
      for (int l = 0; l < MR; l++) {
        if (j0 + l >= g->nt) { /* the panel's rows past the last tile */
          for (int x = 0; x < 16; x++) d[x][l] = 0.0f;
          continue;
        }
        const float *src = xc + g->soff[j0 + l];
        for (int r = 0; r < 4; r++)
          for (int q = 0; q < 4; q++) d[4 * r + q][l] = src[r * W + q];
      }
      for (int l = 0; l < MR; l++) {
        float h[4][4];
        for (int q = 0; q < 4; q++) { /* columns: B^T d */
          h[0][q] = d[q][l] - d[8 + q][l];
          h[1][q] = d[4 + q][l] + d[8 + q][l];
          h[2][q] = d[8 + q][l] - d[4 + q][l];
          h[3][q] = d[4 + q][l] - d[12 + q][l];
        }
        for (int r = 0; r < 4; r++) { /* rows: (B^T d) B */
          v[4 * r + 0][l] = h[r][0] - h[r][2];
          v[4 * r + 1][l] = h[r][1] + h[r][2];
          v[4 * r + 2][l] = h[r][2] - h[r][1];
          v[4 * r + 3][l] = h[r][1] - h[r][3];
        }
      }
      float *dst = g->V + pc * g->mp + j0 * kc + (c - pc) * MR; /* panel j0 / MR of the K block */
      for (int x = 0; x < 16; x++) memcpy(dst + x * vx, v[x], sizeof v[x]);
    }
  }
}

/* the GEMMs of transform points [x0, x1), each on one thread */
static void w2_gemm(void *vctx, int64_t x0, int64_t x1) {
  w2_ctx *g = vctx;
  const int64_t C = g->p->c, O = g->p->oc;
  for (int64_t x = x0; x < x1; x++) {
    const float *bpk = g->upk ? g->upk + x * packed_b_floats(C, O) + PACK_HDR : NULL;
    /* B = U[x] as [c][o]: element (c, o) at o * C + c */
    sg_ctx sg = {NULL, g->u + x * O * C, EX_F32, g->M + x * g->mx, 0, 0, 1, C, O, g->nt, O, C, &EPI_NONE,
                 g->V + x * g->vx, bpk, 1, 1, MR, NULL, 0, 0, 0, kc_step(C), bpk ? 'b' : 0, 0};
    const int err = sgemm_range(&sg, 0, g->nt, 0, O);
    if (err) g->err = err;
  }
}

/* y = A^T m A of each tile, + bias (+ residual), activation; output channels [o0, o1), 8 at a
 * time as vectors (M holds a tile's channels contiguously) */
static void w2_out(void *vctx, int64_t o0, int64_t o1) {
  const w2_ctx *g = vctx;
  const ex_conv_params *p = g->p;
  const int64_t O = p->oc, mx = g->mx, OHW = p->oh * p->ow;
  for (int64_t j = 0; j < g->nt; j++) {
    const int64_t t = g->t0 + j, b = t / g->T, tt = t % g->T, oy = tt / g->tw * 2, ox = tt % g->tw * 2;
    const int64_t ny = EX_MIN(2, p->oh - oy), nx = EX_MIN(2, p->ow - ox);
    const float *m = g->M + j * O;
    float *yt = g->y + b * O * OHW + oy * p->ow + ox;
    const float *rt = g->res ? g->res + (yt - g->y) : NULL;
    for (int64_t o = o0; o < o1; o += 8) {
      const int64_t no = EX_MIN(8, o1 - o);
      cv8 mm[16], r0[4], r1[4], out[4];
      if (no == 8) {
        for (int x = 0; x < 16; x++) memcpy(&mm[x], m + x * mx + o, sizeof(cv8));
      } else {
        for (int x = 0; x < 16; x++)
          for (int l = 0; l < 8; l++) mm[x][l] = l < no ? m[x * mx + o + l] : 0.0f;
      }
      for (int q = 0; q < 4; q++) { /* columns: A^T m */
        r0[q] = mm[q] + mm[4 + q] + mm[8 + q];
        r1[q] = mm[4 + q] - mm[8 + q] - mm[12 + q];
      }
      cv8 bv = {0};
      if (g->bias)
        for (int l = 0; l < no; l++) bv[l] = g->bias[o + l];
      out[0] = r0[0] + r0[1] + r0[2] + bv;
      out[1] = r0[1] - r0[2] - r0[3] + bv;
      out[2] = r1[0] + r1[1] + r1[2] + bv;
      out[3] = r1[1] - r1[2] - r1[3] + bv;
      if (rt) /* the residual gathered into the same vectors, then the activation on them */
        for (int64_t l = 0; l < no; l++)
          for (int64_t r = 0; r < ny; r++)
            for (int64_t q = 0; q < nx; q++) out[2 * r + q][l] += rt[(o + l) * OHW + r * p->ow + q];
      for (int k = 0; k < 4; k++) act_row(p->act, &out[k][0], 8);
      for (int64_t l = 0; l < no; l++)
        for (int64_t r = 0; r < ny; r++)
          for (int64_t q = 0; q < nx; q++) yt[(o + l) * OHW + r * p->ow + q] = out[2 * r + q][l];
    }
  }
}

static int conv_winograd2(const ex_conv_params *p, const float *x, const float *u,
                          const float *bias, const float *res, float *y) {
  if (p->kh != 3 || p->kw != 3 || p->sh != 1 || p->sw != 1 || p->dh != 1 || p->dw != 1 ||
      p->groups != 1)
    return EX_EINVAL;
  const int64_t C = p->c, O = p->oc, tw = (p->ow + 1) / 2, th = (p->oh + 1) / 2, total = tw * th * p->n;
  const float *upk = packed_b_for(p->wpack, C, O) && p->wpack[WG_MARK] == 16 ? p->wpack : NULL;
  w2_ctx g = {p, u, upk, bias, res, y, NULL, NULL, 2 * th + 2, 2 * tw + 2, tw, tw * th, 0, 0, 0, 0, 0, NULL, NULL, 0};
  /* the zero-padded input: every tile reads in bounds */
  float *xp = xq_padded(p, x, g.xph, g.xpw, SC_WG_X);
  if (!xp) return EX_ENOMEM;
  g.xp = xp;
  /* blocks of up to about 128 tiles, balanced, whole MR panels */
  const int64_t nblk = (total + 127) / 128, tb = EX_MIN(total, ROUND_UP((total + nblk - 1) / nblk, MR));
  /* each point's matrix 32 floats past a multiple of its size: the 16 streams of a transform
   * would otherwise often sit 4 KB apart, on the same L1 sets */
  g.vx = ROUND_UP(ROUND_UP(tb, MR) * C, 64) + 32;
  g.mx = ROUND_UP(tb * O, 64) + 32;
  float *V = sc_take(SC_WG_V, (size_t)(16 * (g.vx + g.mx)));
  g.soff = malloc((size_t)tb * sizeof(int64_t));
  if (!V || !g.soff) {
    free(g.soff);
    sc_give(SC_WG_V, V);
    sc_give(SC_WG_X, xp);
    return EX_ENOMEM;
  }
  g.V = V;
  g.M = V + 16 * g.vx;
  for (int64_t t0 = 0; t0 < total && !g.err; t0 += tb) {
    g.t0 = t0;
    g.nt = EX_MIN(tb, total - t0);
    g.mp = ROUND_UP(g.nt, MR);
    for (int64_t j = 0; j < g.nt; j++) {
      const int64_t t = t0 + j, tt = t % g.T;
      g.soff[j] = t / g.T * C * g.xph * g.xpw + (tt / tw * 2) * g.xpw + tt % tw * 2;
    }
    ex_parallel_for(C, EX_MAX(1, 1024 / g.nt), w2_in, &g);
    ex_parallel_for(16, 1, w2_gemm, &g);
    ex_parallel_for(O, EX_MAX(1, 1024 / g.nt), w2_out, &g);
  }
  free(g.soff);
  sc_give(SC_WG_V, V);
  sc_give(SC_WG_X, xp);
  return g.err;
}

/* ---- transposed convolution: GEMM to columns, then col2im ---- */
typedef struct {
  const ex_conv_params *p;
  const float *col, *bias;
  float *y; /* the group's output */
  int64_t g;
} c2i_ctx;

static void col2im_task(void *vctx, int64_t c0, int64_t c1) {
  const c2i_ctx *g = vctx;
  const ex_conv_params *p = g->p; /* here h, w: input size; oh, ow: output size */
  const int64_t HW = p->h * p->w, kk = p->kh * p->kw;
  for (int64_t co = c0; co < c1; co++) {
    float *yc = g->y + co * p->oh * p->ow;
    const float bv = g->bias ? g->bias[g->g * (p->oc / p->groups) + co] : 0.0f;
    for (int64_t i = 0; i < p->oh * p->ow; i++) yc[i] = bv;
    for (int64_t i = 0; i < p->kh; i++)
      for (int64_t j = 0; j < p->kw; j++) {
        const float *src = g->col + (co * kk + i * p->kw + j) * HW;
        for (int64_t iy = 0; iy < p->h; iy++) {
          const int64_t oy = iy * p->sh - p->ph + i * p->dh;
          if (oy < 0 || oy >= p->oh) continue;
          float *yr = yc + oy * p->ow;
          const float *sr = src + iy * p->w;
          for (int64_t ix = 0; ix < p->w; ix++) {
            const int64_t ox = ix * p->sw - p->pw + j * p->dw;
            if (ox >= 0 && ox < p->ow) yr[ox] += sr[ix];
          }
        }
      }
    act_row(p->act, yc, p->oh * p->ow);
  }
}

static int conv_transpose2d(const ex_conv_params *p, const float *x, const float *w,
                            const float *bias, float *y) {
  int err = conv_check(p);
  if (err) return err;
  if (p->n * p->oc * p->oh * p->ow == 0) return EX_OK;
  if (!x || !w || !y) return EX_EINVAL;
  const int64_t G = p->groups, icg = p->c / G, ocg = p->oc / G, KK = ocg * p->kh * p->kw,
                HW = p->h * p->w;
  float *col = malloc((size_t)EX_MAX(KK * HW, 1) * sizeof(float));
  if (!col) return EX_ENOMEM;
  for (int64_t b = 0; b < p->n && !err; b++)
    for (int64_t g = 0; g < G && !err; g++) {
      /* col[KK, HW] = W_g^T @ x_g, W_g = w[g*icg : (g+1)*icg] as [icg, KK] */
      err = sgemm_ep(w + g * icg * KK, 1, KK, x + (b * p->c + g * icg) * HW, EX_F32, HW, 1, col,
                     HW, KK, HW, icg, &EPI_NONE);
      if (err) break;
      c2i_ctx c = {p, col, bias, y + (b * p->oc + g * ocg) * p->oh * p->ow, g};
      ex_parallel_for(ocg, 1, col2im_task, &c);
    }
  free(col);
  return err;
}

/* GEMM weights, per group, in sgemm_run's packed layout: as A, or transposed as B (conv_tr) */
static int64_t conv_packed_size(const ex_conv_params *p) {
  if (conv_check(p)) return 0;
  if (p->algo == EX_CONV_WINOGRAD) return 36 * packed_a_floats(p->oc, p->c);
  if (p->algo == EX_CONV_WINOGRAD2) return 16 * packed_b_floats(p->c, p->oc);
  const int64_t ocg = p->oc / p->groups, K = p->c / p->groups * p->kh * p->kw;
  return p->groups * (conv_tr(p) ? packed_b_floats(K, ocg) : packed_a_floats(ocg, K));
}

static int conv_pack_weights(const ex_conv_params *p, const float *w, float *out) {
  int err = conv_check(p);
  if (err) return err;
  if (!w || !out) return EX_EINVAL;
  if (p->algo == EX_CONV_WINOGRAD) { /* w: U[36][oc][c], each point's matrix packed as A */
    for (int x = 0; x < 36; x++)
      gemm_pack_a(w + x * p->oc * p->c, p->c, p->oc, p->c, out + x * packed_a_floats(p->oc, p->c));
    out[WG_MARK] = 36; /* F(2x2) will not take these */
    return EX_OK;
  }
  if (p->algo == EX_CONV_WINOGRAD2) { /* w: U[16][oc][c], each point's matrix packed as B [c][oc] */
    for (int x = 0; x < 16; x++)
      gemm_pack_b(w + x * p->oc * p->c, 1, p->c, p->c, p->oc, out + x * packed_b_floats(p->c, p->oc));
    out[WG_MARK] = 16;
    return EX_OK;
  }
  const int64_t ocg = p->oc / p->groups, K = p->c / p->groups * p->kh * p->kw;
  for (int64_t g = 0; g < p->groups; g++)
    if (conv_tr(p)) gemm_pack_b(w + g * ocg * K, 1, K, K, ocg, out + g * packed_b_floats(K, ocg));
    else gemm_pack_a(w + g * ocg * K, K, ocg, K, out + g * packed_a_floats(ocg, K));
  return EX_OK;
}

/* ---- few input channels (the stems: 3 -> 32 at 3x3 and 3 -> 64 at 7x7, stride 2) ----
 * im2col would write c*kh*kw shifted copies of the input for the GEMM to read back (8 MB for the
 * 7x7 stem), and 32 or 64 output rows fill the GEMM's 14-row panels poorly.  Direct instead, on a
 * zero-padded copy of the input (xq; at stride 2 each row split into its even and odd columns), so
 * that every tap's input for 16 consecutive outputs of a row is one unaligned load: per output
 * row, a tile of 8 output channels by up to 3 vectors of 16 outputs (24 accumulators; AVX2: 4 by
 * 3 vectors of 8), each tap's weights broadcast into the FMAs of all the tile's vectors.  A tile
 * of 16 channels by one vector, each tap's vector split in registers, spent one broadcast load
 * per FMA and ran at 60% of the FMA peak, bound by the loads; with AVX2, im2col + GEMM ran the
 * stems 10-40% slower than this kernel (3 -> 32 at 3x3: 0.58-0.60 -> 0.36 ms at one thread).
 * Bias starts the sums; the residual and ReLU/ReLU6 are applied before the store.  Rows of the
 * output are shared by the pool. */
#ifdef EX_AVX2
#define CS_MAXC 4
#ifdef EX_AVX512
#define CS_OB 8 /* output channels a tile */
#define CS_W 16 /* outputs a vector */
#else
#define CS_OB 4 /* 12 accumulators of 16 ymm registers */
#define CS_W 8
#endif
#define CS_NV 3 /* vectors a tile, at most */
typedef struct {
  const ex_conv_params *p;
  const float *wt, *bias, *res; /* wt[oc / CS_OB blocks][c * kh * kw][CS_OB]: a tap's channels together */
  float *y;
  const float *xq;              /* xq[n][c][hq][stride][wq] (xq_task) */
  int64_t hq, wq;
} cs_ctx;

static int cs_ok(const ex_conv_params *p) {
  return p->groups == 1 && p->c <= CS_MAXC && (p->kw == 3 || p->kw == 5 || p->kw == 7) && p->kh <= 7 &&
         p->sh == p->sw && p->sh <= 2 && p->dh == 1 && p->dw == 1 && p->ow >= 16;
}

#ifdef EX_AVX512
typedef __m512 cs_v;
#define CS_LOAD _mm512_loadu_ps
#define CS_SET1 _mm512_set1_ps
#define CS_FMA _mm512_fmadd_ps
#else
typedef __m256 cs_v;
#define CS_LOAD _mm256_loadu_ps
#define CS_SET1 _mm256_set1_ps
#define CS_FMA _mm256_fmadd_ps
#endif
static inline __attribute__((always_inline)) void cs_tile(const cs_ctx *g, const float *xr, const float *wb,
                                                          const float *bias, const float *ro, float *yo,
                                                          int64_t no, int64_t nout, const int KW, const int S,
                                                          const int NV) {
  const ex_conv_params *p = g->p;
  const int64_t KH = p->kh, OHW = p->oh * p->ow, plane = g->hq * S * g->wq;
  cs_v acc[CS_OB][CS_NV];
#pragma GCC unroll 8
  for (int o = 0; o < CS_OB; o++) {
    const cs_v b0 = CS_SET1(bias && o < no ? bias[o] : 0.0f);
    for (int v = 0; v < NV; v++) acc[o][v] = b0;
  }
  for (int64_t ci = 0; ci < p->c; ci++, xr += plane)
    for (int64_t i = 0; i < KH; i++) {
      const float *xi = xr + i * S * g->wq, *wr = wb + (ci * KH + i) * KW * CS_OB;
#pragma GCC unroll 7
      for (int j = 0; j < KW; j++) {
        const float *xj = xi + (j % S) * g->wq + j / S;
        cs_v t[CS_NV];
        for (int v = 0; v < NV; v++) t[v] = CS_LOAD(xj + CS_W * v);
#pragma GCC unroll 8
        for (int o = 0; o < CS_OB; o++) {
          const cs_v w = CS_SET1(wr[j * CS_OB + o]);
          for (int v = 0; v < NV; v++) acc[o][v] = CS_FMA(w, t[v], acc[o][v]);
        }
      }
    }
  const int64_t nl = nout - CS_W * (NV - 1); /* the last vector's outputs */
#ifdef EX_AVX512
  const __mmask16 ml = (__mmask16)(0xFFFFu >> (16 - nl));
#pragma GCC unroll 8
  for (int o = 0; o < CS_OB; o++) {
    if (o >= no) break;
    for (int v = 0; v < NV; v++) {
      const __mmask16 m = v == NV - 1 ? ml : (__mmask16)0xFFFF;
      __m512 r = acc[o][v];
      if (ro) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, ro + o * OHW + 16 * v));
      _mm512_mask_storeu_ps(yo + o * OHW + 16 * v, m, relu512(r, p->act));
    }
  }
#else
  const __m256i ml = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nl), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
  for (int o = 0; o < CS_OB; o++) {
    if (o >= no) break;
    for (int v = 0; v < NV; v++) {
      float *yv = yo + o * OHW + 8 * v;
      const int part = v == NV - 1 && nl < 8; /* masked only when partial: a masked store is slow */
      __m256 r = acc[o][v];
      if (ro) r = _mm256_add_ps(r, part ? _mm256_maskload_ps(ro + o * OHW + 8 * v, ml)
                                        : _mm256_loadu_ps(ro + o * OHW + 8 * v));
      r = relu256(r, p->act);
      if (part) _mm256_maskstore_ps(yv, ml, r);
      else _mm256_storeu_ps(yv, r);
    }
  }
#endif
}

static inline __attribute__((always_inline)) void cs_rows(const cs_ctx *g, int64_t r0, int64_t r1, const int KW,
                                                          const int S) {
  const ex_conv_params *p = g->p;
  const int64_t C = p->c, OW = p->ow, OHW = p->oh * OW, CK = C * p->kh * KW;
  const int clamp = p->act == EX_ACT_RELU || p->act == EX_ACT_RELU6;
  for (int64_t r = r0; r < r1; r++) { /* output row oy of image b */
    const int64_t b = r / p->oh, oy = r % p->oh;
    const float *xb = g->xq + (b * C * g->hq + S * oy) * S * g->wq;
    for (int64_t o0 = 0; o0 < p->oc; o0 += CS_OB) {
      const int64_t no = EX_MIN(CS_OB, p->oc - o0);
      float *yo = g->y + (b * p->oc + o0) * OHW + oy * OW;
      const float *ro = g->res ? g->res + (yo - g->y) : NULL, *bias = g->bias ? g->bias + o0 : NULL;
      const float *wb = g->wt + o0 * CK;
      for (int64_t ox0 = 0; ox0 < OW; ox0 += CS_W * CS_NV) {
        const int64_t nout = EX_MIN(CS_W * CS_NV, OW - ox0), nv = (nout + CS_W - 1) / CS_W;
        const float *ror = ro ? ro + ox0 : NULL;
        if (nv == 3) cs_tile(g, xb + ox0, wb, bias, ror, yo + ox0, no, nout, KW, S, 3);
        else if (nv == 2) cs_tile(g, xb + ox0, wb, bias, ror, yo + ox0, no, nout, KW, S, 2);
        else cs_tile(g, xb + ox0, wb, bias, ror, yo + ox0, no, nout, KW, S, 1);
      }
      if (!clamp && p->act != EX_ACT_NONE)
        for (int64_t o = 0; o < no; o++) act_row(p->act, yo + o * OHW, OW);
    }
  }
}

#define CS_TASK(KW, S) \
  static void cs_task_##KW##S(void *vctx, int64_t r0, int64_t r1) { cs_rows(vctx, r0, r1, KW, S); }
CS_TASK(3, 1) CS_TASK(3, 2) CS_TASK(5, 1) CS_TASK(5, 2) CS_TASK(7, 1) CS_TASK(7, 2)
#undef CS_TASK

static int conv_small_c(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                        const float *res, float *y) {
  static void (*const fn[3][2])(void *, int64_t, int64_t) = {
      {cs_task_31, cs_task_32}, {cs_task_51, cs_task_52}, {cs_task_71, cs_task_72}};
  const int64_t CK = p->c * p->kh * p->kw, ob = (p->oc + CS_OB - 1) / CS_OB;
  int64_t hq, wq;
  xq_dims(p, ROUND_UP(p->ow, CS_W), &hq, &wq); /* the last vector's lanes past the row read too */
  float *wt = sc_take(SC_ROW, (size_t)(ob * CK * CS_OB)), *xq = xq_padded(p, x, hq, wq, SC_XD);
  if (!wt || !xq) {
    sc_give(SC_ROW, wt);
    sc_give(SC_XD, xq);
    return EX_ENOMEM;
  }
  for (int64_t o = 0; o < ob * CS_OB; o++) /* channels past the end: zero */
    for (int64_t t = 0; t < CK; t++) wt[(o / CS_OB * CK + t) * CS_OB + o % CS_OB] = o < p->oc ? w[o * CK + t] : 0.0f;
  cs_ctx g = {p, wt, bias, res, y, xq, hq, wq};
  ex_parallel_for(p->n * p->oh, EX_MAX(1, 65536 / EX_MAX(p->ow * p->oc * CK, 1)), fn[p->kw / 2 - 1][p->sh - 1], &g);
  sc_give(SC_ROW, wt);
  sc_give(SC_XD, xq);
  return EX_OK;
}
#endif

static int conv_run(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                    const float *res, float *y, int dw_ok, int small_c) {
#ifdef EX_AVX2
  if (small_c) return conv_small_c(p, x, w, bias, res, y);
#endif
  switch (p->algo) {
  case EX_CONV_AUTO: return dw_ok ? conv_depthwise(p, x, w, bias, res, y) : conv_gemm(p, x, w, bias, res, y);
  case EX_CONV_GEMM: return conv_gemm(p, x, w, bias, res, y);
  case EX_CONV_DEPTHWISE: return dw_ok ? conv_depthwise(p, x, w, bias, res, y) : EX_EINVAL;
  case EX_CONV_WINOGRAD: return conv_winograd(p, x, w, bias, res, y);
  case EX_CONV_WINOGRAD2: return conv_winograd2(p, x, w, bias, res, y);
  default: return EX_EINVAL;
  }
}

static int conv2d(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                  const float *res, float *y) {
  int err = conv_check(p);
  if (err) return err;
  if (p->n * p->oc * p->oh * p->ow == 0) return EX_OK;
  if (!x || !w || !y) return EX_EINVAL;
  const int dw_ok = p->groups == p->c && p->oc == p->c;
#ifdef EX_AVX2
  const int small_c = (p->algo == EX_CONV_AUTO || p->algo == EX_CONV_GEMM) && !dw_ok && cs_ok(p);
#else
  const int small_c = 0;
#endif
  /* y may be the residual's own buffer (the planner gives a residual that dies here its buffer to
   * the output).  Winograd and the GEMM over pre-packed weights read each residual element before
   * writing that output, or add the products onto it; the other paths get a copy */
  const int gemm = p->algo == EX_CONV_GEMM || (p->algo == EX_CONV_AUTO && !dw_ok);
  float *rc = NULL;
  if (res && res == y && !(p->algo == EX_CONV_WINOGRAD || p->algo == EX_CONV_WINOGRAD2) &&
      (!gemm || small_c || !p->wpack)) {
    const size_t n = (size_t)(p->n * p->oc * p->oh * p->ow) * sizeof(float);
    if (!(rc = malloc(n))) return EX_ENOMEM;
    res = memcpy(rc, res, n);
  }
  err = conv_run(p, x, w, bias, res, y, dw_ok, small_c);
  free(rc);
  return err;
}
