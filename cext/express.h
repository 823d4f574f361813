/* Express C kernel library: every entry point, in one header.
 *
 * The C layer is flat and dumb: no graph, no allocation of tensors. Python hands in pointers,
 * shapes and element strides (strides count elements, not bytes, and may be 0 or negative).
 * Every function returns 0 on success or a negative EX_E* code; none of them aborts.
 * cffi reads this file's declarations, so it holds only plain C declarations (no macros with
 * bodies, no #include, no inline functions).
 */

/* ---- dtypes (codes match express/dtypes.py) ---- */
enum ex_dtype { EX_F32 = 0, EX_F16 = 1, EX_BF16 = 2, EX_I8 = 3, EX_U8 = 4, EX_I32 = 5, EX_I64 = 6, EX_BOOL = 7 };

/* ---- error codes ---- */
enum ex_err { EX_OK = 0, EX_EINVAL = -1, EX_ENOMEM = -2, EX_EDTYPE = -3, EX_EOPCODE = -4 };

/* ---- runtime: CPU features, threads, aligned memory ---- */
enum ex_isa { EX_ISA_GENERIC = 0, EX_ISA_AVX2 = 1 };
int  ex_isa(void);                     /* the kernel variant in use */
int  ex_cpu_has_avx2(void);            /* what the CPU offers (avx2 + fma + f16c) */
int  ex_set_isa(int isa);              /* force a variant; EX_EINVAL if the CPU lacks it */
void ex_set_num_threads(int n);        /* n >= 1; the pool grows or shrinks */
int  ex_get_num_threads(void);
void *ex_alloc(size_t nbytes);         /* 64-byte aligned; NULL on failure; counted */
void ex_free(void *p);
int64_t ex_mem_current(void);          /* bytes held through ex_alloc now */
int64_t ex_mem_peak(void);
void ex_mem_reset_peak(void);

/* ---- elementwise: a small register program run over tiles of an N-d iteration space ----
 * Registers are tiles of EX_TILE values, either float (compute in float32: f32, f16, bf16 data)
 * or int (compute in int64: i8, u8, i32, i64, bool data).  Loads widen, stores narrow:
 * float->int truncates toward zero, int->narrower int wraps (two's complement), anything->bool is
 * (x != 0), f32->f16/bf16 rounds to nearest even.  The program is in SSA form except that a
 * register may be reused after its last read. */
enum ex_reg_kind { EX_REG_F = 0, EX_REG_I = 1 };

enum ex_opcode {
  /* float domain: dst, a, b, c are float registers unless noted */
  EX_OP_F_ADD = 0, EX_OP_F_SUB, EX_OP_F_MUL, EX_OP_F_DIV, EX_OP_F_POW, EX_OP_F_MAX, EX_OP_F_MIN,
  EX_OP_F_ABS, EX_OP_F_NEG, EX_OP_F_EXP, EX_OP_F_LOG, EX_OP_F_SQRT, EX_OP_F_SIN, EX_OP_F_COS,
  EX_OP_F_TANH, EX_OP_F_FLOOR, EX_OP_F_CEIL, EX_OP_F_ROUND,   /* ROUND: half to even, as NumPy */
  EX_OP_F_SIGMOID, EX_OP_F_RELU, EX_OP_F_GELU, EX_OP_F_GELU_TANH, EX_OP_F_SILU, EX_OP_F_ERF,
  EX_OP_F_RSQRT, EX_OP_F_RECIP, EX_OP_F_SQUARE,
  EX_OP_F_AXPB,        /* dst = a * imm0 + imm1 */
  EX_OP_F_CLAMP,       /* dst = min(max(a, imm0), imm1) */
  EX_OP_F_WHERE,       /* dst = c ? a : b ; c is an INT register */
  /* comparisons: float a, b -> INT dst (0/1); NaN compares as NumPy does */
  EX_OP_F_EQ, EX_OP_F_NE, EX_OP_F_LT, EX_OP_F_LE, EX_OP_F_GT, EX_OP_F_GE,
  EX_OP_F_NONZERO,     /* INT dst = (a != 0) ; NaN counts as nonzero */
  EX_OP_F_TO_I,        /* INT dst = (int64) a, truncation toward zero; NaN/inf -> INT64_MIN */
  EX_OP_I_TO_F,        /* float dst = (float) INT a */
  /* int domain: all registers INT */
  EX_OP_I_ADD, EX_OP_I_SUB, EX_OP_I_MUL,  /* wrap around (computed unsigned) */
  EX_OP_I_MAX, EX_OP_I_MIN, EX_OP_I_ABS, EX_OP_I_NEG,
  EX_OP_I_POW,         /* a ** b for b >= 0 by squaring (wraps); b < 0 gives 0 */
  EX_OP_I_EQ, EX_OP_I_NE, EX_OP_I_LT, EX_OP_I_LE, EX_OP_I_GT, EX_OP_I_GE,
  EX_OP_I_AND, EX_OP_I_OR, EX_OP_I_NOT,  /* logical: operands tested != 0, result 0/1 */
  EX_OP_I_WHERE,       /* dst = c ? a : b */
  EX_OP_I_WRAP,        /* dst = a wrapped to the width of dtype imm0 (an ex_dtype code), e.g. for
                          int8 intermediates inside a fused chain */
  EX_OP_COUNT
};

#define EX_MAX_DIMS 8
#define EX_TILE 512

typedef struct {
  int32_t op;
  int32_t dst, a, b, c;     /* register indices; -1 where unused */
  float imm0, imm1;
} ex_instr;

typedef struct {
  void *data;               /* element [0,...,0] */
  int32_t dtype;            /* ex_dtype */
  int32_t reg;              /* register loaded from (input) or stored to (output) */
  int64_t strides[EX_MAX_DIMS];  /* element strides over the iteration shape; 0 broadcasts */
} ex_operand;

typedef struct {
  int32_t ndim;                    /* 0..EX_MAX_DIMS; 0 is a single element */
  int64_t shape[EX_MAX_DIMS];
  int32_t n_in, n_out, n_instr, n_reg;
  ex_operand *in;
  ex_operand *out;
  ex_instr *code;
  int32_t *reg_kind;               /* n_reg entries of ex_reg_kind */
} ex_program;

int ex_elementwise(const ex_program *p);

/* ---- data movement ---- */
/* dst (contiguous, row-major over shape) = src viewed with element strides; any elem_size. */
int ex_copy(int32_t elem_size, const void *src, const int64_t *src_strides, void *dst,
            int32_t ndim, const int64_t *shape);

/* ---- reductions over the middle axis of a contiguous [outer, r, inner] array ----
 * out has [outer, inner] elements.  SUM/PROD/MEAN accumulate floats in float32 with pairwise or
 * multi-lane partial sums (error well under 1e-5 relative for r up to 1e6) and ints in int64;
 * MAX/MIN propagate NaN as NumPy does; ARG* write int64 indices of the first extreme (NaN wins). */
enum ex_reduce_op { EX_RED_SUM = 0, EX_RED_PROD, EX_RED_MEAN, EX_RED_MAX, EX_RED_MIN, EX_RED_ARGMAX, EX_RED_ARGMIN };
int ex_reduce(int32_t op, int32_t in_dtype, const void *x, int32_t out_dtype, void *y,
              int64_t outer, int64_t r, int64_t inner);
/* inclusive cumulative sum along the middle axis; out is [outer, r, inner] */
int ex_cumsum(int32_t in_dtype, const void *x, int32_t out_dtype, void *y,
              int64_t outer, int64_t r, int64_t inner);

/* ---- matmul: C[b] = A[b] @ B[b] for every batch index b ----
 * A[b] is m x k at a + a_off(b) with element strides (a_rs, a_cs); B[b] is k x n with (b_rs, b_cs);
 * C is contiguous [batch..., m, n].  Batch offsets: the batch index runs over batch_shape
 * (nbatch_dims <= 6) with per-dim element strides a_bs/b_bs (0 broadcasts).
 * dtype: EX_F32 (accumulate in float32) or EX_I64 (wrapping int64). */
int ex_matmul(int32_t dtype, const void *a, int64_t a_rs, int64_t a_cs,
              const void *b, int64_t b_rs, int64_t b_cs, void *c,
              int64_t m, int64_t n, int64_t k,
              int32_t nbatch_dims, const int64_t *batch_shape,
              const int64_t *a_bs, const int64_t *b_bs);

/* ---- softmax over the middle axis of a contiguous float32 [outer, r, inner] array ---- */
int ex_softmax(const float *x, float *y, int64_t outer, int64_t r, int64_t inner, int32_t log);

/* ---- gather: y[o, j, i] = x[o, idx[j], i] over a contiguous [outer, axis_len, inner] x ----
 * Negative indices count from the end; any index outside [-axis_len, axis_len) returns EX_EINVAL
 * before anything is written. */
int ex_take(int32_t elem_size, const void *x, int64_t outer, int64_t axis_len, int64_t inner,
            const int64_t *idx, int64_t n_idx, void *y);

/* ---- slice update: dst[o, start + j, i] = src[o, j, i] (in place), contiguous operands ----
 * `start` is read at run time (a compiled plan's runtime position); EX_EINVAL when
 * start < 0 or start + src_len > dst_len, before anything is written. */
int ex_slice_update(int32_t elem_size, void *dst, int64_t outer, int64_t dst_len, int64_t inner,
                    const void *src, int64_t src_len, const int64_t *start);
