// The 8-lane f32 <-> bf16 conversions of backend/cpu/kernels/convert.cpp, for kernels that convert inside their
// own AVX2 loops (AdamW stores the bf16 working copy in the pass that updates the weights). Callers
// check cpu_features().avx2 first. bf16_narrow8_avx2 is bf16_from_float on each lane (round to
// nearest even; a NaN stays a quiet NaN of the same sign), tests/ops/test_convert.cpp checks it.
#pragma once

#include <immintrin.h>

namespace fp::ops::cpu {

// The 8 floats of x rounded to bf16, each in the low half of its 32-bit lane (< 2^16).
__attribute__((target("avx2"))) inline __m256i bf16_narrow8_lanes_avx2(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

// The 8 floats of x rounded to bf16, packed into 8 halves (16 bytes).
__attribute__((target("avx2"))) inline __m128i bf16_narrow8_avx2(__m256 x) {
  const __m256i r = bf16_narrow8_lanes_avx2(x);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// 8 bf16 (16 bytes at p) widened to 8 floats (exact).
__attribute__((target("avx2"))) inline __m256 bf16_widen8_avx2(const void* p) {
  const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

}  // namespace fp::ops::cpu
