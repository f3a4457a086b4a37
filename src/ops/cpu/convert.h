// Bulk conversion between f32 and bf16 storage, the loads and stores of every kernel that reads or
// writes bf16 (Note [Kernel operands carry their dtype] in core/buf.h). Widening is exact; narrowing
// rounds to nearest even and keeps NaN a quiet NaN of the same sign: bit for bit core/dtype.h's
// bf16_from_float, which tests/ops/test_convert.cpp checks for all 2^32 float patterns against.
// AVX2 where the CPU has it (runtime dispatch, cpu_features.h), else the scalar conversions.
#pragma once

#include <cstdint>

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

}  // namespace fp::ops::cpu
