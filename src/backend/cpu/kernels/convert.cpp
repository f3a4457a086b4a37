// f32 <-> bf16 conversion (backend/cpu/kernels/convert.h). The AVX2 narrowing is bf16_from_float on 8 lanes
// (backend/cpu/kernels/convert_avx2.h: add 0x7fff plus the lowest kept bit, shift out the low half, and take
// (bits >> 16) | 0x40 where the input is a NaN); two vectors of 8 pack into one of 16 halves (packus
// works in 128-bit lanes, so a 64-bit permute puts the halves back in order).
#include "backend/cpu/kernels/convert.h"

#include <immintrin.h>

#include <cstring>
#include <string>

#include "backend/cpu/kernels/convert_avx2.h"
#include "backend/cpu/kernels/cpu_features.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

namespace {

__attribute__((target("avx2"))) void widen_avx2(const bf16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, bf16_widen8_avx2(src + i));
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

__attribute__((target("avx2"))) void narrow_avx2(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i packed = _mm256_packus_epi32(bf16_narrow8_lanes_avx2(_mm256_loadu_ps(src + i)),
                                               bf16_narrow8_lanes_avx2(_mm256_loadu_ps(src + i + 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permute4x64_epi64(packed, 0xD8));
  }
  for (; i < n; ++i) dst[i] = from_f32<bf16>(src[i]);
}

bool use_avx2() {  // Note [One instruction-set dispatch] (backend/cpu/kernels/cpu_features.h)
  static const bool yes = simd_level() >= SimdLevel::avx2;
  return yes;
}

}  // namespace

void bf16_to_f32(const bf16* src, float* dst, int64_t n) {
  if (use_avx2()) return widen_avx2(src, dst, n);
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f32(src[i]);
}

void f32_to_bf16(const float* src, bf16* dst, int64_t n) {
  if (use_avx2()) return narrow_avx2(src, dst, n);
  for (int64_t i = 0; i < n; ++i) dst[i] = from_f32<bf16>(src[i]);
}

void convert(Buf dst, CBuf src, int64_t n) {
  if (n <= 0) return;
  if (dst.dtype == src.dtype) {
    std::memmove(dst.p, src.p, static_cast<size_t>(n) * dtype_size(dst.dtype));
  } else if (dst.dtype == DType::DType_F32) {
    bf16_to_f32(src.as<bf16>(), dst.f32(), n);
  } else {
    f32_to_bf16(src.f32(), dst.as<bf16>(), n);
  }
}

void widen_block(CBuf src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) convert(dst + r * cols, src.at(r * ld), cols);
}

void store_block(const float* src, int64_t rows, int64_t cols, Buf dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) convert(dst.at(r * ld), src + r * cols, cols);
}

void chunked::dtypes_check(const char* kernel, std::initializer_list<std::pair<const char*, DType>> operands) {
  bool ok = true;
  std::string got;
  for (const auto& [name, t] : operands) {
    ok = ok && (t == DType::DType_F32 || t == DType::DType_BF16);
    got += fmt::format("{}{} {}", got.empty() ? "" : ", ", name, dtype_name(t));
  }
  FP_ASSERT(ok, "{} takes f32 or bf16 operands, got {}", kernel, got);
}

}  // namespace fp::ops::cpu
