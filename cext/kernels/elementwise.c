/* ex_elementwise: interpreter for the register programs of express.h.
 * Reference semantics: each instruction is a plain scalar loop over a tile (libm for math).
 * Optimized: dimensions are coalesced, short rows are packed several to a tile, f32 inputs and
 * outputs with unit inner stride are read/written in place, and big spaces run on the pool. */
#include "common.h"

/* operand kinds per opcode: dst, a, b, c ('F' float, 'I' int, '.' unused) */
static const char *const OP_SIG[EX_OP_COUNT] = {
  [EX_OP_F_ADD] = "FFF.", [EX_OP_F_SUB] = "FFF.", [EX_OP_F_MUL] = "FFF.", [EX_OP_F_DIV] = "FFF.",
  [EX_OP_F_POW] = "FFF.", [EX_OP_F_MAX] = "FFF.", [EX_OP_F_MIN] = "FFF.",
  [EX_OP_F_ABS] = "FF..", [EX_OP_F_NEG] = "FF..", [EX_OP_F_EXP] = "FF..", [EX_OP_F_LOG] = "FF..",
  [EX_OP_F_SQRT] = "FF..", [EX_OP_F_SIN] = "FF..", [EX_OP_F_COS] = "FF..", [EX_OP_F_TANH] = "FF..",
  [EX_OP_F_FLOOR] = "FF..", [EX_OP_F_CEIL] = "FF..", [EX_OP_F_ROUND] = "FF..",
  [EX_OP_F_SIGMOID] = "FF..", [EX_OP_F_RELU] = "FF..", [EX_OP_F_GELU] = "FF..",
  [EX_OP_F_GELU_TANH] = "FF..", [EX_OP_F_SILU] = "FF..", [EX_OP_F_ERF] = "FF..",
  [EX_OP_F_RSQRT] = "FF..", [EX_OP_F_RECIP] = "FF..", [EX_OP_F_SQUARE] = "FF..",
  [EX_OP_F_AXPB] = "FF..", [EX_OP_F_CLAMP] = "FF..", [EX_OP_F_WHERE] = "FFFI",
  [EX_OP_F_EQ] = "IFF.", [EX_OP_F_NE] = "IFF.", [EX_OP_F_LT] = "IFF.", [EX_OP_F_LE] = "IFF.",
  [EX_OP_F_GT] = "IFF.", [EX_OP_F_GE] = "IFF.",
  [EX_OP_F_NONZERO] = "IF..", [EX_OP_F_TO_I] = "IF..", [EX_OP_I_TO_F] = "FI..",
  [EX_OP_I_ADD] = "III.", [EX_OP_I_SUB] = "III.", [EX_OP_I_MUL] = "III.", [EX_OP_I_MAX] = "III.",
  [EX_OP_I_MIN] = "III.", [EX_OP_I_ABS] = "II..", [EX_OP_I_NEG] = "II..", [EX_OP_I_POW] = "III.",
  [EX_OP_I_EQ] = "III.", [EX_OP_I_NE] = "III.", [EX_OP_I_LT] = "III.", [EX_OP_I_LE] = "III.",
  [EX_OP_I_GT] = "III.", [EX_OP_I_GE] = "III.",
  [EX_OP_I_AND] = "III.", [EX_OP_I_OR] = "III.", [EX_OP_I_NOT] = "II..", [EX_OP_I_WHERE] = "IIII",
  [EX_OP_I_WRAP] = "II..", [EX_OP_F_NARROW] = "FF..",
};

/* ---- the instruction set ---- */
/* exp(x), within about 1 ulp of expf for |x| <= 88 (+inf above about 88.4, 0 below -87, and NaN
 * gives +inf), branch-free so that a loop over it vectorizes (GCC if-converts its clamps only
 * under -fno-trapping-math, which cext/build.py sets): Cephes' expf (x = n ln2 + r,
 * |r| <= ln2 / 2, a degree-6 polynomial) */
static inline float expf_vec(float x) {
  x = x < 89.0f ? x : 89.0f; /* n = 128: 2^n is +inf */
  x = x > -87.0f ? x : -87.0f;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* nearest integer */
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;          /* ln2 in two parts */
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23; /* 2^n */
  float s;
  memcpy(&s, &bits, 4);
  return p * s;
}

static int64_t ipow(int64_t a, int64_t b) {
  if (b < 0) return 0;
  uint64_t r = 1, x = (uint64_t)a;
  for (uint64_t e = (uint64_t)b; e; e >>= 1) {
    if (e & 1) r *= x;
    x *= x;
  }
  return (int64_t)r;
}

static inline int64_t wrap_to(int64_t v, int dt) {
  switch (dt) {
  case EX_I8: return (int8_t)v;
  case EX_U8: return (uint8_t)v;
  case EX_I32: return (int32_t)v;
  case EX_BOOL: return v != 0;
  default: return v;
  }
}

#define F1(EXPR) for (int64_t i = 0; i < n; i++) { float x = A[i]; D[i] = (EXPR); } break
#define F2(EXPR) for (int64_t i = 0; i < n; i++) { float x = A[i], y = B[i]; D[i] = (EXPR); } break
#define FC(EXPR) for (int64_t i = 0; i < n; i++) { float x = A[i], y = B[i]; DI[i] = (EXPR); } break
#define I1(EXPR) for (int64_t i = 0; i < n; i++) { int64_t x = IA[i]; DI[i] = (EXPR); } break
#define I2(EXPR) for (int64_t i = 0; i < n; i++) { int64_t x = IA[i], y = IB[i]; DI[i] = (EXPR); } break
#define U(v) ((uint64_t)(v))

static void exec(const ex_instr *in, void *d, const void *a, const void *b, const void *c, int64_t n) {
  float *D = d;
  int64_t *DI = d;
  const float *A = a, *B = b;
  const int64_t *IA = a, *IB = b, *IC = c;
  const float f0 = in->imm0, f1 = in->imm1;
  const float SQRT1_2 = 0.70710678118654752f, SQRT_2_PI = 0.79788456080286536f;
  switch (in->op) {
  case EX_OP_F_ADD: F2(x + y);
  case EX_OP_F_SUB: F2(x - y);
  case EX_OP_F_MUL: F2(x * y);
  case EX_OP_F_DIV: F2(x / y);
  case EX_OP_F_POW: F2(powf(x, y));
  case EX_OP_F_MAX: F2(nan_max(x, y));
  case EX_OP_F_MIN: F2(nan_min(x, y));
  case EX_OP_F_ABS: F1(fabsf(x));
  case EX_OP_F_NEG: F1(-x);
  case EX_OP_F_EXP: F1(expf(x));
  case EX_OP_F_LOG: F1(logf(x));
  case EX_OP_F_SQRT: F1(sqrtf(x));
  case EX_OP_F_SIN: F1(sinf(x));
  case EX_OP_F_COS: F1(cosf(x));
  case EX_OP_F_TANH: F1(tanhf(x));
  case EX_OP_F_FLOOR: F1(floorf(x));
  case EX_OP_F_CEIL: F1(ceilf(x));
  case EX_OP_F_ROUND: F1(rintf(x)); /* default rounding mode: half to even */
  /* vectorized as SiLU is; NaN passes through (expf_vec would take it for +inf) */
  case EX_OP_F_SIGMOID: F1(x != x ? x : 1.0f / (1.0f + expf_vec(-x)));
  case EX_OP_F_RELU: F1(x < 0.0f ? 0.0f : x); /* NaN passes through */
  case EX_OP_F_GELU: F1(0.5f * x * (1.0f + erff(x * SQRT1_2)));
  /* 0.5 x (1 + tanh u) = x sigmoid(2u): no cancellation where tanh u is near -1, and vectorized;
   * large negative x gives -0 and -inf NaN, as before */
  case EX_OP_F_GELU_TANH: F1(x / (1.0f + expf_vec(-2.0f * SQRT_2_PI * (x + 0.044715f * x * x * x))));
  /* x / (1 + e^-x): vectorized; -inf gives NaN and large negative x -0, as x * sigmoid(x) does */
  case EX_OP_F_SILU: F1(x / (1.0f + expf_vec(-x)));
  case EX_OP_F_ERF: F1(erff(x));
  case EX_OP_F_RSQRT: F1(1.0f / sqrtf(x));
  case EX_OP_F_RECIP: F1(1.0f / x);
  case EX_OP_F_SQUARE: F1(x * x);
  case EX_OP_F_AXPB: F1(x * f0 + f1);
  case EX_OP_F_CLAMP: F1(nan_min(nan_max(x, f0), f1));
  case EX_OP_F_WHERE: for (int64_t i = 0; i < n; i++) D[i] = IC[i] ? A[i] : B[i]; break;
  case EX_OP_F_EQ: FC(x == y);
  case EX_OP_F_NE: FC(x != y);
  case EX_OP_F_LT: FC(x < y);
  case EX_OP_F_LE: FC(x <= y);
  case EX_OP_F_GT: FC(x > y);
  case EX_OP_F_GE: FC(x >= y);
  case EX_OP_F_NONZERO: for (int64_t i = 0; i < n; i++) DI[i] = A[i] != 0.0f; break;
  case EX_OP_F_TO_I: for (int64_t i = 0; i < n; i++) DI[i] = f_to_i64(A[i]); break;
  case EX_OP_I_TO_F: for (int64_t i = 0; i < n; i++) D[i] = (float)IA[i]; break;
  case EX_OP_I_ADD: I2((int64_t)(U(x) + U(y)));
  case EX_OP_I_SUB: I2((int64_t)(U(x) - U(y)));
  case EX_OP_I_MUL: I2((int64_t)(U(x) * U(y)));
  case EX_OP_I_MAX: I2(x > y ? x : y);
  case EX_OP_I_MIN: I2(x < y ? x : y);
  case EX_OP_I_ABS: I1(x < 0 ? (int64_t)(0 - U(x)) : x);
  case EX_OP_I_NEG: I1((int64_t)(0 - U(x)));
  case EX_OP_I_POW: I2(ipow(x, y));
  case EX_OP_I_EQ: I2(x == y);
  case EX_OP_I_NE: I2(x != y);
  case EX_OP_I_LT: I2(x < y);
  case EX_OP_I_LE: I2(x <= y);
  case EX_OP_I_GT: I2(x > y);
  case EX_OP_I_GE: I2(x >= y);
  case EX_OP_I_AND: I2(x != 0 && y != 0);
  case EX_OP_I_OR: I2(x != 0 || y != 0);
  case EX_OP_I_NOT: I1(x == 0);
  case EX_OP_I_WHERE: for (int64_t i = 0; i < n; i++) DI[i] = IC[i] ? IA[i] : IB[i]; break;
  case EX_OP_F_NARROW: /* imm0 validated */
    if ((int)f0 == EX_F16)
      for (int64_t i = 0; i < n; i++) D[i] = f16_to_f32(f32_to_f16(A[i]));
    else
      for (int64_t i = 0; i < n; i++) D[i] = bf16_to_f32(f32_to_bf16(A[i]));
    break;
  default: { /* EX_OP_I_WRAP, imm0 validated */
    int dt = (int)f0;
    I1(wrap_to(x, dt));
  }
  }
}

/* ---- driver ---- */
typedef struct {
  const ex_program *p;
  int nd;                       /* coalesced dims, >= 1; the last one is the row */
  int64_t shape[EX_MAX_DIMS];
  int64_t rows, L;              /* rows of length L */
  int64_t rows_per_tile;        /* > 1: a tile holds several whole rows; else tiles split a row */
  int64_t tiles_per_row, tile_len;
  int nops;                     /* inputs, then outputs */
  int64_t *str;                 /* nops * EX_MAX_DIMS coalesced strides */
  int *direct_in;               /* input o may be read in place (f32 into a float register) */
  int *direct_out;              /* per instruction: the output it may write in place, or -1 */
  _Atomic int err;
} ew_ctx;

static const ex_operand *ew_op(const ew_ctx *c, int o) {
  return o < c->p->n_in ? &c->p->in[o] : &c->p->out[o - c->p->n_in];
}

/* advance the row multi-index by one, moving every operand's row pointer */
static void next_row(const ew_ctx *c, int64_t *idx, char **row) {
  for (int d = c->nd - 2; d >= 0; d--) {
    const int back = ++idx[d] == c->shape[d];
    for (int o = 0; o < c->nops; o++) {
      const int64_t s = c->str[o * EX_MAX_DIMS + d];
      row[o] += (back ? -(c->shape[d] - 1) * s : s) * dtype_size(ew_op(c, o)->dtype);
    }
    if (!back) return;
    idx[d] = 0;
  }
}

/* move operands [o0, o1) between memory and registers for the rows of one multi-row tile */
static void ew_rows(const ew_ctx *c, int64_t *idx, char **row, char **row_save, void **ptr,
                    int64_t nrows, int o0, int o1, int store) {
  const ex_program *p = c->p;
  const int64_t L = c->L;
  int64_t idx_save[EX_MAX_DIMS];
  memcpy(idx_save, idx, sizeof idx_save);
  memcpy(row_save, row, (size_t)c->nops * sizeof(char *));
  for (int64_t rr = 0; rr < nrows; rr++) {
    for (int o = o0; o < o1; o++) {
      const ex_operand *op = ew_op(c, o);
      const int64_t s = c->str[o * EX_MAX_DIMS + c->nd - 1];
      const int isf = p->reg_kind[op->reg] == EX_REG_F;
      char *r = (char *)ptr[op->reg] + rr * L * (isf ? 4 : 8);
      if (store) {
        if (isf) store_f(row[o], op->dtype, s, (const float *)r, L);
        else store_i(row[o], op->dtype, s, (const int64_t *)r, L);
      } else {
        if (isf) load_f((float *)r, row[o], op->dtype, s, L);
        else load_i((int64_t *)r, row[o], op->dtype, s, L);
      }
    }
    if (rr + 1 < nrows) next_row(c, idx, row);
  }
  memcpy(idx, idx_save, sizeof idx_save);
  memcpy(row, row_save, (size_t)c->nops * sizeof(char *));
}

static void ew_task(void *vctx, int64_t t_begin, int64_t t_end) {
  ew_ctx *c = vctx;
  const ex_program *p = c->p;
  const int nd = c->nd, nops = c->nops, nreg = p->n_reg, n_in = p->n_in;
  const int64_t T = c->tile_len, reg_bytes = T * 8;
  char *mem = malloc((size_t)(nreg * reg_bytes) + (size_t)nreg * sizeof(void *) +
                     2 * (size_t)nops * sizeof(char *));
  if (!mem) { c->err = EX_ENOMEM; return; }
  void **ptr = (void **)(mem + nreg * reg_bytes);
  char **row = (char **)(ptr + nreg), **row_save = row + nops;
#define SCRATCH(r) ((void *)(mem + (r) * reg_bytes))

  /* position the row multi-index at this chunk's first row */
  int64_t idx[EX_MAX_DIMS] = {0};
  int64_t cur = c->rows_per_tile > 1 ? t_begin * c->rows_per_tile : t_begin / c->tiles_per_row;
  for (int64_t d = nd - 2, r = cur; d >= 0; d--) { idx[d] = r % c->shape[d]; r /= c->shape[d]; }
  for (int o = 0; o < nops; o++) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; d++) off += idx[d] * c->str[o * EX_MAX_DIMS + d];
    row[o] = (char *)ew_op(c, o)->data + off * dtype_size(ew_op(c, o)->dtype);
  }

  for (int64_t t = t_begin; t < t_end; t++) {
    /* a tile is rows [ra, ra + nrows) whole, or columns [col, col + n) of row ra */
    int64_t ra, nrows, col, n;
    if (c->rows_per_tile > 1) {
      ra = t * c->rows_per_tile;
      nrows = EX_MIN(c->rows - ra, c->rows_per_tile);
      col = 0;
      n = nrows * c->L;
    } else {
      ra = t / c->tiles_per_row;
      nrows = 1;
      col = (t % c->tiles_per_row) * T;
      n = EX_MIN(T, c->L - col);
    }
    for (; cur < ra; cur++) next_row(c, idx, row);

    for (int r = 0; r < nreg; r++) ptr[r] = SCRATCH(r);
    if (nrows > 1) {
      ew_rows(c, idx, row, row_save, ptr, nrows, 0, n_in, 0);
    } else {
      for (int o = 0; o < n_in; o++) {
        const ex_operand *op = &p->in[o];
        const int64_t s = c->str[o * EX_MAX_DIMS + nd - 1];
        char *src = row[o] + col * s * dtype_size(op->dtype);
        if (c->direct_in[o] && s == 1) ptr[op->reg] = src;
        else if (p->reg_kind[op->reg] == EX_REG_F) load_f(ptr[op->reg], src, op->dtype, s, n);
        else load_i(ptr[op->reg], src, op->dtype, s, n);
      }
    }

    for (int i = 0; i < p->n_instr; i++) {
      const ex_instr *in = &p->code[i];
      const char *sig = OP_SIG[in->op];
      const void *a = sig[1] != '.' ? ptr[in->a] : NULL, *b = sig[2] != '.' ? ptr[in->b] : NULL,
                 *cc = sig[3] != '.' ? ptr[in->c] : NULL;
      const int o = c->direct_out[i];
      if (o >= 0 && nrows == 1) ptr[in->dst] = row[n_in + o] + col * 4;
      else ptr[in->dst] = SCRATCH(in->dst);
      exec(in, ptr[in->dst], a, b, cc, n);
    }

    if (nrows > 1) {
      ew_rows(c, idx, row, row_save, ptr, nrows, n_in, nops, 1);
    } else {
      for (int o = 0; o < p->n_out; o++) {
        const ex_operand *op = &p->out[o];
        const int64_t s = c->str[(n_in + o) * EX_MAX_DIMS + nd - 1];
        char *dst = row[n_in + o] + col * s * dtype_size(op->dtype);
        if (ptr[op->reg] == dst) continue; /* written in place */
        if (p->reg_kind[op->reg] == EX_REG_F) store_f(dst, op->dtype, s, ptr[op->reg], n);
        else store_i(dst, op->dtype, s, ptr[op->reg], n);
      }
    }
  }
#undef SCRATCH
  free(mem);
}

static int ew_validate(const ex_program *p, int64_t *total) {
  if (!p || p->ndim < 0 || p->ndim > EX_MAX_DIMS) return EX_EINVAL;
  if (p->n_in < 0 || p->n_out < 0 || p->n_instr < 0 || p->n_reg < 0) return EX_EINVAL;
  if ((p->n_in && !p->in) || (p->n_out && !p->out) || (p->n_instr && !p->code) ||
      (p->n_reg && !p->reg_kind))
    return EX_EINVAL;
  *total = 1;
  for (int d = 0; d < p->ndim; d++) {
    if (p->shape[d] < 0) return EX_EINVAL;
    *total *= p->shape[d];
  }
  for (int r = 0; r < p->n_reg; r++)
    if (p->reg_kind[r] != EX_REG_F && p->reg_kind[r] != EX_REG_I) return EX_EINVAL;
  for (int o = 0; o < p->n_in + p->n_out; o++) {
    const ex_operand *op = o < p->n_in ? &p->in[o] : &p->out[o - p->n_in];
    if (!dtype_ok(op->dtype)) return EX_EDTYPE;
    if (op->reg < 0 || op->reg >= p->n_reg) return EX_EINVAL;
    if (!op->data && *total) return EX_EINVAL;
  }
  for (int i = 0; i < p->n_instr; i++) {
    const ex_instr *in = &p->code[i];
    if (in->op < 0 || in->op >= EX_OP_COUNT) return EX_EOPCODE;
    const char *sig = OP_SIG[in->op];
    const int32_t regs[4] = {in->dst, in->a, in->b, in->c};
    for (int j = 0; j < 4; j++) {
      if (sig[j] == '.') continue;
      if (regs[j] < 0 || regs[j] >= p->n_reg) return EX_EINVAL;
      if (p->reg_kind[regs[j]] != (sig[j] == 'F' ? EX_REG_F : EX_REG_I)) return EX_EINVAL;
    }
    if (in->op == EX_OP_I_WRAP) {
      const float d = in->imm0;
      if (!(d == EX_I8 || d == EX_U8 || d == EX_I32 || d == EX_I64 || d == EX_BOOL)) return EX_EDTYPE;
    }
    if (in->op == EX_OP_F_NARROW && !(in->imm0 == EX_F16 || in->imm0 == EX_BF16)) return EX_EDTYPE;
  }
  return EX_OK;
}

static int elementwise(const ex_program *p) {
  int64_t total;
  int err = ew_validate(p, &total);
  if (err || total == 0 || p->n_out == 0) return err;

  ew_ctx c = {.p = p, .nops = p->n_in + p->n_out};
  char *mem = malloc((size_t)c.nops * EX_MAX_DIMS * sizeof(int64_t) +
                     (size_t)(p->n_in + p->n_instr) * sizeof(int) + 1);
  if (!mem) return EX_ENOMEM;
  c.str = (int64_t *)mem;
  c.direct_in = (int *)(c.str + c.nops * EX_MAX_DIMS);
  c.direct_out = c.direct_in + p->n_in;

  /* drop unit dims, then merge neighbours that are contiguous in every operand */
  int nd = 0;
  for (int d = 0; d < p->ndim; d++) {
    if (p->shape[d] == 1) continue;
    int merge = nd > 0;
    for (int o = 0; o < c.nops && merge; o++)
      merge = c.str[o * EX_MAX_DIMS + nd - 1] == ew_op(&c, o)->strides[d] * p->shape[d];
    if (merge) {
      c.shape[nd - 1] *= p->shape[d];
      for (int o = 0; o < c.nops; o++) c.str[o * EX_MAX_DIMS + nd - 1] = ew_op(&c, o)->strides[d];
    } else {
      c.shape[nd] = p->shape[d];
      for (int o = 0; o < c.nops; o++) c.str[o * EX_MAX_DIMS + nd] = ew_op(&c, o)->strides[d];
      nd++;
    }
  }
  if (nd == 0) {
    nd = 1;
    c.shape[0] = 1;
    for (int o = 0; o < c.nops; o++) c.str[o * EX_MAX_DIMS] = 0;
  }
  c.nd = nd;
  c.L = c.shape[nd - 1];
  c.rows = total / c.L;
  int64_t ntiles;
  if (c.L >= EX_TILE) {
    c.rows_per_tile = 1;
    c.tile_len = EX_TILE;
    c.tiles_per_row = (c.L + EX_TILE - 1) / EX_TILE;
    ntiles = c.rows * c.tiles_per_row;
  } else {
    c.rows_per_tile = EX_MIN(EX_TILE / c.L, c.rows);
    c.tile_len = c.rows_per_tile * c.L;
    c.tiles_per_row = 1;
    ntiles = (c.rows + c.rows_per_tile - 1) / c.rows_per_tile;
  }

  /* in-place reads: f32 into a float register (the unit inner stride is checked per tile) */
  for (int o = 0; o < p->n_in; o++)
    c.direct_in[o] = p->in[o].dtype == EX_F32 && p->reg_kind[p->in[o].reg] == EX_REG_F;
  /* in-place writes: the last write of an f32 unit-stride output's register goes straight to
   * memory, provided no later instruction reads an input register (which may alias it) */
  for (int i = 0; i < p->n_instr; i++) c.direct_out[i] = -1;
  for (int o = 0; o < p->n_out; o++) {
    const ex_operand *op = &p->out[o];
    if (op->dtype != EX_F32 || p->reg_kind[op->reg] != EX_REG_F ||
        c.str[(p->n_in + o) * EX_MAX_DIMS + nd - 1] != 1)
      continue;
    int w = -1;
    for (int i = 0; i < p->n_instr; i++)
      if (p->code[i].dst == op->reg) w = i;
    if (w < 0 || c.direct_out[w] >= 0) continue;
    int safe = 1;
    for (int i = w + 1; i < p->n_instr && safe; i++) {
      const char *sig = OP_SIG[p->code[i].op];
      const int32_t rd[3] = {p->code[i].a, p->code[i].b, p->code[i].c};
      for (int j = 0; j < 3 && safe; j++)
        for (int q = 0; q < p->n_in && safe && sig[j + 1] != '.'; q++) safe = rd[j] != p->in[q].reg;
    }
    if (safe) c.direct_out[w] = o;
  }

  ex_parallel_for(ntiles, EX_MAX(1, 32768 / c.tile_len), ew_task, &c);
  err = c.err;
  free(mem);
  return err;
}
