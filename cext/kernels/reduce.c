/* ex_reduce and ex_cumsum over the middle axis of a contiguous [outer, r, inner] array.
 * Reference: per-element scalar loops.  Optimized: f32 data is read in place and everything
 * else is widened a chunk at a time; float sums are pairwise (sum_f32 within a row, a binary
 * counter of partial sums across rows); max/min use 8 independent lanes; work is split over
 * (outer, column block) items on the pool. */
#include "common.h"

#define RCH 1024 /* elements converted at a time along a contiguous row */
#define RW 128   /* columns per block when inner > 1 */
#define RGROUP 64 /* rows summed sequentially before a pairwise push */

typedef struct {
  int32_t op, idt, odt;
  const char *x;
  char *y;
  int64_t outer, r, inner, nblk;
} red_ctx;

/* n f32 values at x (dtype dt, stride s): in place when possible, else converted into buf */
static const float *get_f(const char *x, int32_t dt, int64_t s, int64_t n, float *buf) {
  if (dt == EX_F32 && s == 1) return (const float *)x;
  load_f(buf, x, dt, s, n);
  return buf;
}

static void put_f(char *y, int32_t dt, float v) { store_f(y, dt, 1, &v, 1); }
static void put_i(char *y, int32_t dt, int64_t v) { store_i(y, dt, 1, &v, 1); }

static float lanes_max(const float *v, int64_t n, float acc, int is_max) {
  float l[8];
  for (int j = 0; j < 8; j++) l[j] = acc;
  int64_t i = 0;
  if (is_max)
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; j++) l[j] = nan_max(l[j], v[i + j]);
  else
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; j++) l[j] = nan_min(l[j], v[i + j]);
  for (; i < n; i++) acc = is_max ? nan_max(acc, v[i]) : nan_min(acc, v[i]);
  for (int j = 0; j < 8; j++) acc = is_max ? nan_max(acc, l[j]) : nan_min(acc, l[j]);
  return acc;
}

/* arg-extreme update for one value: NaN beats everything and the first one stays */
static inline int arg_better(float v, float best, int is_max) {
  if (best != best) return 0;
  if (v != v) return 1;
  return is_max ? v > best : v < best;
}

/* inner == 1: one contiguous row of r elements */
static void red_row(const red_ctx *c, int64_t o) {
  const int64_t r = c->r, es = dtype_size(c->idt);
  const char *x = c->x + o * r * es;
  char *y = c->y + o * dtype_size(c->odt);
  const int op = c->op, is_max = op == EX_RED_MAX || op == EX_RED_ARGMAX;
  if (dtype_is_float(c->idt)) {
    float buf[RCH], lv[EX_PW_LEVELS], acc = op == EX_RED_PROD ? 1.0f : is_max ? -INFINITY : INFINITY;
    pairwise_acc pw = {lv, 0, 1};
    int64_t best_i = 0;
    for (int64_t i0 = 0; i0 < r; i0 += RCH) {
      const int64_t n = EX_MIN(RCH, r - i0);
      const float *v = get_f(x + i0 * es, c->idt, 1, n, buf);
      switch (op) {
      case EX_RED_SUM: case EX_RED_MEAN: { float s = sum_f32(v, n); pw_push(&pw, &s); } break;
      case EX_RED_PROD: for (int64_t i = 0; i < n; i++) acc *= v[i]; break;
      case EX_RED_MAX: case EX_RED_MIN: acc = lanes_max(v, n, acc, is_max); break;
      default: /* ARGMAX / ARGMIN */
        for (int64_t i = 0; i < n; i++)
          if ((i0 == 0 && i == 0) || arg_better(v[i], acc, is_max)) { acc = v[i]; best_i = i0 + i; }
      }
    }
    if (op == EX_RED_SUM || op == EX_RED_MEAN) {
      pw_total(&pw, &acc);
      if (op == EX_RED_MEAN) acc /= (float)r;
    }
    if (op >= EX_RED_ARGMAX) put_i(y, EX_I64, best_i);
    else put_f(y, c->odt, acc);
  } else {
    int64_t buf[RCH], acc = op == EX_RED_PROD ? 1 : op == EX_RED_SUM || op == EX_RED_MEAN ? 0
                          : is_max ? INT64_MIN : INT64_MAX, best_i = 0;
    for (int64_t i0 = 0; i0 < r; i0 += RCH) {
      const int64_t n = EX_MIN(RCH, r - i0);
      load_i(buf, x + i0 * es, c->idt, 1, n);
      switch (op) {
      case EX_RED_SUM: case EX_RED_MEAN:
        for (int64_t i = 0; i < n; i++) acc = (int64_t)((uint64_t)acc + (uint64_t)buf[i]);
        break;
      case EX_RED_PROD:
        for (int64_t i = 0; i < n; i++) acc = (int64_t)((uint64_t)acc * (uint64_t)buf[i]);
        break;
      case EX_RED_MAX: for (int64_t i = 0; i < n; i++) acc = buf[i] > acc ? buf[i] : acc; break;
      case EX_RED_MIN: for (int64_t i = 0; i < n; i++) acc = buf[i] < acc ? buf[i] : acc; break;
      default:
        for (int64_t i = 0; i < n; i++)
          if ((i0 == 0 && i == 0) || (is_max ? buf[i] > acc : buf[i] < acc)) { acc = buf[i]; best_i = i0 + i; }
      }
    }
    if (op == EX_RED_MEAN) put_f(y, c->odt, (float)((double)acc / (double)r));
    else if (op >= EX_RED_ARGMAX) put_i(y, EX_I64, best_i);
    else put_i(y, c->odt, acc);
  }
}

/* inner > 1: columns [j0, j0 + w) of slab o, walking the r rows */
static void red_cols(const red_ctx *c, int64_t o, int64_t j0, int64_t w) {
  const int64_t r = c->r, inner = c->inner, es = dtype_size(c->idt);
  const char *x = c->x + (o * r * inner + j0) * es;
  char *y = c->y + (o * inner + j0) * dtype_size(c->odt);
  const int op = c->op, is_max = op == EX_RED_MAX || op == EX_RED_ARGMAX;
  int64_t best_i[RW];
  if (dtype_is_float(c->idt)) {
    float buf[RW], acc[RW], lv[EX_PW_LEVELS * RW];
    pairwise_acc pw = {lv, 0, w};
    const float init = op == EX_RED_PROD ? 1.0f : op <= EX_RED_MEAN ? 0.0f : is_max ? -INFINITY : INFINITY;
    for (int64_t j = 0; j < w; j++) { acc[j] = init; best_i[j] = 0; }
    for (int64_t i = 0; i < r; i++) {
      const float *v = get_f(x + i * inner * es, c->idt, 1, w, buf);
      switch (op) {
      case EX_RED_SUM: case EX_RED_MEAN:
        for (int64_t j = 0; j < w; j++) acc[j] += v[j];
        if ((i + 1) % RGROUP == 0 || i + 1 == r) {
          pw_push(&pw, acc);
          for (int64_t j = 0; j < w; j++) acc[j] = 0.0f;
        }
        break;
      case EX_RED_PROD: for (int64_t j = 0; j < w; j++) acc[j] *= v[j]; break;
      case EX_RED_MAX: for (int64_t j = 0; j < w; j++) acc[j] = nan_max(acc[j], v[j]); break;
      case EX_RED_MIN: for (int64_t j = 0; j < w; j++) acc[j] = nan_min(acc[j], v[j]); break;
      default:
        for (int64_t j = 0; j < w; j++)
          if (i == 0 || arg_better(v[j], acc[j], is_max)) { acc[j] = v[j]; best_i[j] = i; }
      }
    }
    if (op == EX_RED_SUM || op == EX_RED_MEAN) {
      pw_total(&pw, acc);
      if (op == EX_RED_MEAN)
        for (int64_t j = 0; j < w; j++) acc[j] /= (float)r;
    }
    if (op >= EX_RED_ARGMAX) store_i(y, EX_I64, 1, best_i, w);
    else store_f(y, c->odt, 1, acc, w);
  } else {
    int64_t buf[RW], acc[RW];
    const int64_t init = op == EX_RED_PROD ? 1 : op <= EX_RED_MEAN ? 0 : is_max ? INT64_MIN : INT64_MAX;
    for (int64_t j = 0; j < w; j++) { acc[j] = init; best_i[j] = 0; }
    for (int64_t i = 0; i < r; i++) {
      load_i(buf, x + i * inner * es, c->idt, 1, w);
      switch (op) {
      case EX_RED_SUM: case EX_RED_MEAN:
        for (int64_t j = 0; j < w; j++) acc[j] = (int64_t)((uint64_t)acc[j] + (uint64_t)buf[j]);
        break;
      case EX_RED_PROD:
        for (int64_t j = 0; j < w; j++) acc[j] = (int64_t)((uint64_t)acc[j] * (uint64_t)buf[j]);
        break;
      case EX_RED_MAX: for (int64_t j = 0; j < w; j++) acc[j] = buf[j] > acc[j] ? buf[j] : acc[j]; break;
      case EX_RED_MIN: for (int64_t j = 0; j < w; j++) acc[j] = buf[j] < acc[j] ? buf[j] : acc[j]; break;
      default:
        for (int64_t j = 0; j < w; j++)
          if (i == 0 || (is_max ? buf[j] > acc[j] : buf[j] < acc[j])) { acc[j] = buf[j]; best_i[j] = i; }
      }
    }
    if (op == EX_RED_MEAN) {
      float m[RW];
      for (int64_t j = 0; j < w; j++) m[j] = (float)((double)acc[j] / (double)r);
      store_f(y, c->odt, 1, m, w);
    } else if (op >= EX_RED_ARGMAX) {
      store_i(y, EX_I64, 1, best_i, w);
    } else {
      store_i(y, c->odt, 1, acc, w);
    }
  }
}

static void red_task(void *vctx, int64_t b, int64_t e) {
  const red_ctx *c = vctx;
  for (int64_t it = b; it < e; it++) {
    const int64_t o = it / c->nblk, j0 = (it % c->nblk) * RW;
    if (c->inner == 1) red_row(c, o);
    else red_cols(c, o, j0, EX_MIN(RW, c->inner - j0));
  }
}

static int shape_check(const void *x, const void *y, int64_t outer, int64_t r, int64_t inner) {
  if (outer < 0 || r < 0 || inner < 0) return EX_EINVAL;
  if (outer * inner > 0 && (!y || (r > 0 && !x))) return EX_EINVAL;
  return EX_OK;
}

static int reduce(int32_t op, int32_t in_dtype, const void *x, int32_t out_dtype, void *y,
                  int64_t outer, int64_t r, int64_t inner) {
  if (op < EX_RED_SUM || op > EX_RED_ARGMIN) return EX_EOPCODE;
  if (!dtype_ok(in_dtype) || !dtype_ok(out_dtype)) return EX_EDTYPE;
  const int fin = dtype_is_float(in_dtype), fout = dtype_is_float(out_dtype);
  int ok;
  switch (op) {
  case EX_RED_SUM: case EX_RED_PROD: ok = fin ? fout : out_dtype == EX_I64; break;
  case EX_RED_MEAN: ok = fout; break;
  case EX_RED_MAX: case EX_RED_MIN: ok = out_dtype == in_dtype; break;
  default: ok = out_dtype == EX_I64;
  }
  if (!ok) return EX_EDTYPE;
  int err = shape_check(x, y, outer, r, inner);
  if (err) return err;
  if (outer * inner == 0) return EX_OK;
  if (r == 0 && op >= EX_RED_MAX) return EX_EINVAL; /* no identity, as NumPy */
  if (r == 0) { /* empty sum 0, product 1, mean NaN */
    const float fv = op == EX_RED_PROD ? 1.0f : op == EX_RED_MEAN ? NAN : 0.0f;
    for (int64_t i = 0; i < outer * inner; i++) {
      char *dst = (char *)y + i * dtype_size(out_dtype);
      if (fout) put_f(dst, out_dtype, fv);
      else put_i(dst, out_dtype, op == EX_RED_PROD);
    }
    return EX_OK;
  }
  red_ctx c = {op, in_dtype, out_dtype, x, y, outer, r, inner, (inner + RW - 1) / RW};
  const int64_t per_item = r * EX_MIN(inner, RW);
  ex_parallel_for(outer * c.nblk, EX_MAX(1, 32768 / per_item), red_task, &c);
  return EX_OK;
}

/* ---- cumulative sum ---- */
static void cumsum_task(void *vctx, int64_t b, int64_t e) {
  const red_ctx *c = vctx;
  const int64_t r = c->r, inner = c->inner, ies = dtype_size(c->idt), oes = dtype_size(c->odt);
  const int fl = dtype_is_float(c->idt);
  for (int64_t it = b; it < e; it++) {
    const int64_t o = it / c->nblk, j0 = (it % c->nblk) * RW;
    const char *x = c->x + (o * r * inner + j0) * ies;
    char *y = c->y + (o * r * inner + j0) * oes;
    if (inner == 1) { /* along a contiguous row, a chunk at a time */
      float fb[RCH], fa = 0.0f;
      int64_t ib[RCH], ia = 0;
      for (int64_t i0 = 0; i0 < r; i0 += RCH) {
        const int64_t n = EX_MIN(RCH, r - i0);
        if (fl) {
          load_f(fb, x + i0 * ies, c->idt, 1, n);
          for (int64_t i = 0; i < n; i++) fb[i] = fa += fb[i];
          store_f(y + i0 * oes, c->odt, 1, fb, n);
        } else {
          load_i(ib, x + i0 * ies, c->idt, 1, n);
          for (int64_t i = 0; i < n; i++) ib[i] = ia = (int64_t)((uint64_t)ia + (uint64_t)ib[i]);
          store_i(y + i0 * oes, c->odt, 1, ib, n);
        }
      }
    } else {
      const int64_t w = EX_MIN(RW, inner - j0);
      float fb[RW], fa[RW] = {0};
      int64_t ib[RW], ia[RW] = {0};
      for (int64_t i = 0; i < r; i++) {
        if (fl) {
          load_f(fb, x + i * inner * ies, c->idt, 1, w);
          for (int64_t j = 0; j < w; j++) fa[j] += fb[j];
          store_f(y + i * inner * oes, c->odt, 1, fa, w);
        } else {
          load_i(ib, x + i * inner * ies, c->idt, 1, w);
          for (int64_t j = 0; j < w; j++) ia[j] = (int64_t)((uint64_t)ia[j] + (uint64_t)ib[j]);
          store_i(y + i * inner * oes, c->odt, 1, ia, w);
        }
      }
    }
  }
}

static int cumsum(int32_t in_dtype, const void *x, int32_t out_dtype, void *y,
                  int64_t outer, int64_t r, int64_t inner) {
  if (!dtype_ok(in_dtype) || !dtype_ok(out_dtype)) return EX_EDTYPE;
  if (dtype_is_float(in_dtype) ? !dtype_is_float(out_dtype) : out_dtype != EX_I64) return EX_EDTYPE;
  int err = shape_check(x, y, outer, r, inner);
  if (err || outer * r * inner == 0) return err;
  red_ctx c = {EX_RED_SUM, in_dtype, out_dtype, x, y, outer, r, inner, (inner + RW - 1) / RW};
  const int64_t per_item = r * EX_MIN(inner, RW);
  ex_parallel_for(outer * c.nblk, EX_MAX(1, 32768 / per_item), cumsum_task, &c);
  return EX_OK;
}
