// Bulk conversion between f32 and bf16 storage, the loads and stores of every kernel that reads or
// writes bf16 (Note [Kernel operands carry their dtype] in core/buf.h). Widening is exact; narrowing
// rounds to nearest even and keeps NaN a quiet NaN of the same sign: bit for bit core/dtype.h's
// bf16_from_float, which tests/ops/test_convert.cpp checks for all 2^32 float patterns against.
// AVX2 where the CPU has it (runtime dispatch, cpu_features.h), else the scalar conversions.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/buf.h"

namespace fp::ops::cpu {

// dst (n) = src (n) widened.
void bf16_to_f32(const bf16* src, float* dst, int64_t n);
// dst (n) = src (n) rounded to nearest even.
void f32_to_bf16(const float* src, bf16* dst, int64_t n);

// dst (n) = src (n) in dst's dtype, whatever the two dtypes (f32 or bf16): a copy when they agree.
void convert(Buf dst, CBuf src, int64_t n);

// Blocks (the panels of the bf16 GEMMs): dst (rows, cols) dense f32 = the block src (rows, cols)
// stored with leading dimension ld, widened (copied when f32); and back, store_block writing the
// dense f32 block into dst (rows, cols, leading dimension ld) in dst's dtype.
void widen_block(CBuf src, int64_t ld, int64_t rows, int64_t cols, float* dst);
void store_block(const float* src, int64_t rows, int64_t cols, Buf dst, int64_t ld);

// Note [bf16 kernels by f32 chunks]: the element-wise kernels (elementwise, rmsnorm, swiglu,
// embedding) keep one f32 loop and run it, when an operand is bf16, on chunks of at most kChunk
// elements: each bf16 input's chunk widened into a stack buffer (load), each bf16 output computed in
// one (stage, or load_rw for y += ...) and rounded once into place (store). An f32 operand is used in
// place, so the all-f32 call is the f32 loop itself.
namespace chunked {

inline constexpr int64_t kChunk = 256;  // 1 KiB of f32 per staged operand

inline bool f32(DType t) { return t == DType::DType_F32; }

// Every operand f32 or bf16, else an InternalError naming the kernel and each operand's dtype.
// Called before any parallel region (an exception must not leave one).
void dtypes_check(const char* kernel, std::initializer_list<std::pair<const char*, DType>> operands);

// n elements of x as f32 (tmp holds n: kChunk in the chunked loops, a row elsewhere): x's own data
// when f32, else widened into tmp.
inline const float* load(CBuf x, float* tmp, int64_t n) {
  if (f32(x.dtype)) return static_cast<const float*>(x.p);
  convert(tmp, x, n);
  return tmp;
}
// The same for an operand read and then written (y += ...): compute on the result, then store().
inline float* load_rw(Buf y, float* tmp, int64_t n) {
  if (f32(y.dtype)) return static_cast<float*>(y.p);
  convert(tmp, y, n);
  return tmp;
}
// Where to compute n elements of y: y itself when f32, else tmp (rounded into y by store()).
inline float* stage(Buf y, float* tmp) { return f32(y.dtype) ? static_cast<float*>(y.p) : tmp; }
inline void store(Buf y, const float* f, int64_t n) {
  if (!f32(y.dtype)) convert(y, f, n);
}

}  // namespace chunked

}  // namespace fp::ops::cpu
