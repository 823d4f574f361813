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
enum ex_isa { EX_ISA_GENERIC = 0, EX_ISA_AVX2 = 1, EX_ISA_AVX512 = 2 };
int  ex_isa(void);                     /* the kernel variant in use */
int  ex_cpu_has_avx2(void);            /* what the CPU offers (avx2 + fma + f16c) */
int  ex_cpu_has_avx512(void);          /* avx512 f/bw/vl/dq on top of avx2 + fma + f16c */
int  ex_set_isa(int isa);              /* force a variant; EX_EINVAL if the CPU lacks it */
void ex_set_num_threads(int n);        /* n >= 1; the pool grows or shrinks */
int  ex_get_num_threads(void);
void *ex_alloc(size_t nbytes);         /* 64-byte aligned; NULL on failure; counted */
void *ex_alloc_huge(size_t nbytes);    /* as ex_alloc, from 1 MB up mapped afresh on transparent
                                          huge pages: for memory kept and reused (a compiled plan's) */
void ex_free(void *p);                 /* either's blocks */
int64_t ex_mem_current(void);          /* bytes held through ex_alloc now */
int64_t ex_mem_peak(void);
void ex_mem_reset_peak(void);
/* The pool's first worker as a prefetcher: it pulls the first bytes[i] of each region p[i]
 * (n <= EX_PREFETCH_MAX) into its cache, a line of each in turn, until the next parallel job
 * starts or another request replaces this one.  Returns at once; with one thread it does
 * nothing.  For a memory-bound job whose input is not ready yet, issued before the short
 * single-threaded steps that compute it: the worker would only spin through them (a decode
 * step's next projection). */
#define EX_PREFETCH_MAX 128
typedef struct {
  const void *p[EX_PREFETCH_MAX];
  int64_t bytes[EX_PREFETCH_MAX];
  int32_t n;
} ex_prefetch;
void ex_prefetch_async(const ex_prefetch *req);

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
  EX_OP_F_NARROW,      /* dst = a rounded to dtype imm0 (EX_F16 or EX_BF16), nearest even: an
                          astype to half precision inside a fused chain */
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

/* ---- fused epilogues and linear layers ----
 * Activations applied after bias and residual: y = act(acc + bias + residual). */
enum ex_act { EX_ACT_NONE = 0, EX_ACT_RELU, EX_ACT_RELU6, EX_ACT_SILU, EX_ACT_GELU, EX_ACT_GELU_TANH,
              EX_ACT_SIGMOID };
/* y[m, n] = act(x[m, k] @ w[n, k]^T + bias[n] + res[m, n]); x, w, res, y contiguous; w is
 * EX_F32, EX_F16 or EX_BF16 (widened in the kernel); bias and res may be NULL. */
int ex_linear(const float *x, const void *w, int32_t w_dtype, const float *bias, const float *res,
              float *y, int64_t m, int64_t n, int64_t k, int32_t act);

/* ---- convolution (NCHW float32, contiguous) ----
 * Output size (oh, ow) is given: padding ph/pw is before (top/left); after is implied.
 * For ex_conv_transpose2d, (c, h, w) describe the input and (oc, oh, ow) the output;
 * its weight is [c, oc / groups, kh, kw] (PyTorch's layout). */
enum ex_conv_algo { EX_CONV_AUTO = 0, EX_CONV_GEMM, EX_CONV_DEPTHWISE, EX_CONV_WINOGRAD,
                    EX_CONV_WINOGRAD2 };
typedef struct {
  int64_t n, c, h, w;        /* input */
  int64_t oc, oh, ow;        /* output */
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups;
  int32_t act;               /* ex_act */
  int32_t algo;              /* ex_conv_algo; WINOGRAD takes ex_winograd_weights' output as w,
                                WINOGRAD2 (F(2x2, 3x3)) u[16][oc][ic] = G w G^T, G = [[1, 0, 0],
                                [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]] */
  const float *wpack;        /* NULL, or GEMM weights from ex_conv_pack_weights (used when they
                                were packed for the kernel variant running; w is still required) */
} ex_conv_params;
int ex_conv2d(const ex_conv_params *p, const float *x, const float *w, const float *bias,
              const float *res, float *y);
/* y = depthwise p2 (w2, b2, res) of act(1x1 conv p1 (w1, b1) of x), the expanded tensor never
 * stored whole: p1 1x1, stride 1, unpadded, one group (its wpack used as in ex_conv2d); p2
 * depthwise 3x3 or 5x5, stride 1 or 2, over p1's output; b1, b2, res may be NULL */
int ex_conv_pwdw(const ex_conv_params *p1, const float *w1, const float *b1, const ex_conv_params *p2,
                 const float *w2, const float *b2, const float *x, const float *res, float *y);
/* GEMM weights packed once into the micro-kernel's panel layout (for the variant in use):
 * ex_conv_packed_size(p) floats, filled by ex_conv_pack_weights(p, w, out); for WINOGRAD, w is
 * ex_winograd_weights' output and each of its 36 matrices is packed (16 for WINOGRAD2) */
int64_t ex_conv_packed_size(const ex_conv_params *p);
int ex_conv_pack_weights(const ex_conv_params *p, const float *w, float *out);
/* F(4x4, 3x3) weights: u[36][oc][ic] from w[oc][ic][3][3] */
int ex_winograd_weights(const float *w, float *u, int64_t oc, int64_t ic);
int ex_conv_transpose2d(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                        float *y);

/* ---- pooling and resizing over nc contiguous float32 planes ---- */
enum ex_pool { EX_POOL_MAX = 0, EX_POOL_AVG, EX_POOL_AVG_EXCL /* padding not counted */ };
int ex_pool2d(int32_t kind, const float *x, float *y, int64_t nc, int64_t h, int64_t w,
              int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
              int64_t ph, int64_t pw, int64_t dh, int64_t dw);
int ex_adaptive_pool2d(int32_t kind, const float *x, float *y, int64_t nc, int64_t h, int64_t w,
                       int64_t oh, int64_t ow);
enum ex_resize { EX_RESIZE_NEAREST = 0, EX_RESIZE_BILINEAR };
/* scale_*: input size / output size (or 1 / scale_factor), used by nearest and by bilinear
 * without align_corners */
int ex_resize2d(int32_t mode, int32_t align_corners, const float *x, float *y, int64_t nc,
                int64_t h, int64_t w, int64_t oh, int64_t ow, float scale_h, float scale_w);
/* pad the last three dims of a contiguous [outer, in[0], in[1], in[2]] array */
enum ex_pad_mode { EX_PAD_CONSTANT = 0, EX_PAD_REFLECT, EX_PAD_REPLICATE };
int ex_pad(int32_t elem_size, int32_t mode, const void *x, void *y, int64_t outer,
           const int64_t *in_shape, const int64_t *before, const int64_t *after, const void *value);

/* ---- normalization (float32, contiguous; weight/bias may be NULL) ---- */
int ex_layer_norm(const float *x, const float *w, const float *b, float *y, int64_t rows,
                  int64_t n, float eps);
int ex_rms_norm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps);
/* x [n, c, inner]; groups of c / groups channels; per-channel affine, then act */
int ex_group_norm(const float *x, const float *w, const float *b, float *y, int64_t n, int64_t c,
                  int64_t inner, int64_t groups, float eps, int32_t act);
/* inference batch norm over x [n, c, inner] with running mean/var, then act */
int ex_batch_norm(const float *x, const float *mean, const float *var, const float *w,
                  const float *b, float *y, int64_t n, int64_t c, int64_t inner, float eps,
                  int32_t act);

/* ---- attention: y = softmax(q k^T * scale + mask [+ causal]) v ----
 * q [b, hq, lq, d], k [b, hk, lk, d], v [b, hk, lk, dv] with element strides (batch, head, row)
 * and unit stride along the last dim; y contiguous [b, hq, lq, dv]; hq % hk == 0 (GQA);
 * mask (additive, may be NULL) indexed by strides over (b, hq, lq, lk), 0 broadcasts;
 * causal: key j is visible to query i when j <= i. */
int ex_attention(const float *q, const int64_t *q_strides, const float *k, const int64_t *k_strides,
                 const float *v, const int64_t *v_strides, const float *mask,
                 const int64_t *mask_strides, float *y, int64_t b, int64_t hq, int64_t hk, int64_t lq,
                 int64_t lk, int64_t d, int64_t dv, float scale, int32_t causal);

/* ---- quantized linear: y[m, n] = x[m, k] @ dequant(W)[n, k]^T (+ bias[n]), x/y/bias float32 ----
 * W group-quantized (int8, or int4 as nibbles + 8), packed by express/ops/quant.py:
 * rows interleaved by 16 (n16 = n rounded up to 16), chunks of 32 values along k; scales float16
 * [n16 / 16][k / group][16] (byte layout in cext/kernels/qgemm.c).  group % 32 == 0 and
 * k % group == 0 (else EX_EINVAL); bias may be NULL.  x is rounded to int8 per 32 values (as
 * llama.cpp's Q8_0) and every block is an integer dot product (AVX-512 VNNI, AVX2 or portable
 * code, as ex_isa and the CPU allow).  x and y are contiguous. */
int ex_qgemm(int32_t bits, int64_t m, int64_t n, int64_t k, int64_t group, const float *x, const void *wq,
             const void *scales, const float *bias, float *y);
/* count (1 .. 8) weights of the same bits and group that read the same x, in one call: x is
 * quantized once and all their rows split over the pool in one pass (a decode step's q/k/v or
 * gate/up projections).  y is [m, n[0] + ... + n[count - 1]], weight j's outputs in the columns
 * after those of weights 0 .. j - 1; bias and res may be NULL, or arrays whose entries may be NULL:
 * res[j] (contiguous, m x n[j]) is added to weight j's outputs (a residual, as the last step). */
/* rows[0 .. count) of such a weight with n rows, dequantized into out (count x k): an embedding
 * lookup from a quantized table, reading only those rows' bytes; EX_EINVAL for a row outside
 * [0, n) */
int ex_qgemm_rows(int32_t bits, int64_t n, int64_t k, int64_t group, const void *wq, const void *scales,
                  const int64_t *rows, int64_t count, float *out);
int ex_qgemm_multi(int32_t bits, int64_t m, int64_t k, int64_t group, const float *x, int32_t count,
                   const int64_t *n, const void *const *wq, const void *const *scales, const float *const *bias,
                   const float *const *res, float *y, const ex_prefetch *then);
/* then (NULL, or n = 0, for none) is handed to ex_prefetch_async once the product is done: the
 * next one's weights.  ex_qgemm_prefetch_plan writes the request for a one-row product of these
 * weights: the start of each stream it reads with the pool's present width, and of its scales. */
void ex_qgemm_prefetch_plan(int32_t bits, int64_t k, int64_t group, int32_t count, const int64_t *n,
                            const void *const *wq, const void *const *scales, ex_prefetch *req);

/* ---- GGUF-quantized linear: y[m, n] = x[m, k] @ W[n, k]^T (+ bias[n]), x/y/bias float32 ----
 * W: n rows of ggml blocks exactly as a GGUF file stores them (ex_ggml_row_bytes(type, k) bytes
 * a row, contiguous); type is the ggml type number: 2 Q4_0, 6 Q5_0, 8 Q8_0, 12 Q4_K, 13 Q5_K,
 * 14 Q6_K (else EX_EINVAL; k must be a multiple of the block, 32 or 256).  x is quantized as
 * ggml does (Q8_0 or Q8_K) and every block is an integer dot product (cext/kernels/ggml_quant.c).
 * x and y are contiguous; bias may be NULL. */
int64_t ex_ggml_row_bytes(int32_t type, int64_t k);   /* bytes of one row, or EX_EINVAL */
int ex_ggml_gemm(int32_t type, int64_t m, int64_t n, int64_t k, const float *x, const void *w,
                 const float *bias, float *y);
/* count (1 .. 8) weights of one type that read the same x, in one call (as ex_qgemm_multi): x is
 * quantized once, y is [m, n[0] + ... + n[count - 1]], weight j's outputs after those of the
 * weights before it; bias may be NULL, or an array whose entries may be NULL. */
int ex_ggml_gemm_multi(int32_t type, int64_t m, int64_t k, const float *x, int32_t count, const int64_t *n,
                       const void *const *w, const float *const *bias, float *y);

/* ---- read bandwidth probe: the sum of p[0 .. n) as a double (0 for n <= 0) ----
 * Read on the pool as several prefetched streams a thread (cext/kernels/qgemm.c) with little
 * work per byte: bytes / time is the read bandwidth that bounds a decode step (benchmarks/llm.py). */
double ex_read_sum(const float *p, int64_t n);

/* ---- a plan's kernel calls, run back to back without returning to Python ----
 * Every `int ex_NAME(...)` above also has an argument struct ex_args_NAME (its parameters as
 * fields, in order) and a number EX_CALL_NAME; cext/build.py writes both from this file.
 * ex_run_calls runs calls[0 .. n) in order, each as ex_NAME(args...); it stops at the first that
 * fails, stores its index in *failed and returns its code (an unknown kind: EX_EINVAL). */
typedef struct {
  int32_t kind;        /* EX_CALL_NAME */
  const void *args;    /* an ex_args_NAME */
} ex_call;
int ex_run_calls(const ex_call *calls, int64_t n, int64_t *failed);
