/* AVX2 helpers shared by the kernels that carry their own target attributes or pragmas
 * (qgemm.c, ggml_quant.c): each inlines into any caller whose target includes AVX2. */
#ifndef EX_SIMD_AVX2_H
#define EX_SIMD_AVX2_H
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#define EX_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* the largest of 8 floats */
EX_AVX2_INLINE float ex_hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

/* 32 int32 (4 vectors, each at most 127 in magnitude) -> 32 int8 in order at o (the packs
 * interleave the 128-bit lanes: 4-value runs come out as 0 2 4 6 1 3 5 7, put back in order) */
EX_AVX2_INLINE void ex_pack32_i8(int8_t *o, __m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  _mm256_storeu_si256((__m256i *)o, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

#endif
#endif
