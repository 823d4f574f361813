/* gather (take along one axis). Reference C only: it is a copy of rows, memcpy does the work. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "express.h"

int ex_take(int32_t elem_size, const void *x, int64_t outer, int64_t axis_len, int64_t inner,
            const int64_t *idx, int64_t n_idx, void *y) {
  if (elem_size <= 0 || outer < 0 || axis_len < 0 || inner < 0 || n_idx < 0) return EX_EINVAL;
  if (n_idx && !idx) return EX_EINVAL;
  for (int64_t j = 0; j < n_idx; j++)  /* check every index first: never a partial write */
    if (idx[j] < -axis_len || idx[j] >= axis_len) return EX_EINVAL;
  if (outer == 0 || inner == 0 || n_idx == 0) return EX_OK;
  if (!x || !y) return EX_EINVAL;
  const size_t row = (size_t)inner * (size_t)elem_size;
  const char *src = (const char *)x;
  char *dst = (char *)y;
  for (int64_t o = 0; o < outer; o++) {
    const char *xo = src + (size_t)o * (size_t)axis_len * row;
    for (int64_t j = 0; j < n_idx; j++, dst += row) {
      int64_t k = idx[j] < 0 ? idx[j] + axis_len : idx[j];
      memcpy(dst, xo + (size_t)k * row, row);
    }
  }
  return EX_OK;
}

int ex_slice_update(int32_t elem_size, void *dst, int64_t outer, int64_t dst_len, int64_t inner,
                    const void *src, int64_t src_len, const int64_t *start) {
  if (elem_size <= 0 || outer < 0 || dst_len < 0 || inner < 0 || src_len < 0 || !start) return EX_EINVAL;
  const int64_t s = *start;
  if (s < 0 || s > dst_len - src_len) return EX_EINVAL;
  if (outer == 0 || inner == 0 || src_len == 0) return EX_OK;
  if (!dst || !src) return EX_EINVAL;
  const size_t row = (size_t)inner * (size_t)elem_size;
  for (int64_t o = 0; o < outer; o++)
    memcpy((char *)dst + ((size_t)o * (size_t)dst_len + (size_t)s) * row,
           (const char *)src + (size_t)o * (size_t)src_len * row, (size_t)src_len * row);
  return EX_OK;
}
