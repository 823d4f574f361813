/* Portable float16 <-> float32 conversions, round to nearest even: the reference for every kernel
 * (common.h uses F16C instead where the variant has it; qgemm.c and ggml_quant.c, their own
 * translation units, use these as they are). */
#ifndef EX_KERNELS_HALF_H
#define EX_KERNELS_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t half_bits_(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float half_float_(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float half_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return half_float_(sign | 0x7f800000u | (m << 13));
  if (e) return half_float_(sign | ((e + 112) << 23) | (m << 13));
  return half_float_(sign | half_bits_((float)m * 5.9604644775390625e-8f)); /* m * 2^-24, exact */
}

static inline uint16_t f32_to_half(float f) {
  uint32_t x = half_bits_(f), sign = (x >> 16) & 0x8000;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) /* inf or NaN (kept quiet) */
    return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00 | ((x >> 13) & 0x3ff) : 0x7c00));
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to inf */
  if (x < 0x38800000u) {
    /* below 2^-14: adding 0.5f puts the f16 subnormal ulp (2^-24) at the float ulp, so the
     * FPU's own round-to-nearest-even does the rounding */
    float a = half_float_(x) + 0.5f;
    return (uint16_t)(sign | (half_bits_(a) - 0x3f000000u));
  }
  x += 0xc8000fffu + ((x >> 13) & 1); /* rebias exponent by -112, round half to even */
  return (uint16_t)(sign | (x >> 13));
}

#endif
