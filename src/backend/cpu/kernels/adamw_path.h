// The instruction-set paths of the cpu AdamW kernel (backend/cpu/kernels/adamw.cpp), for tests and benchmarks
// that compare them. Dimensions: n elements.
//
// Every path computes the same bits (Note [AdamW is element-wise], ops/adamw.h): they differ only in
// how many elements one instruction handles. ops::cpu::adamw_update runs adamw_path_best().
#pragma once

#include <cstdint>
#include <string_view>

#include "core/buf.h"
#include "ops/adamw.h"

namespace fp::ops::cpu {

enum class AdamwPath {
  AdamwPath_scalar,  // one element at a time (the tail of the others)
  AdamwPath_sse,     // 4 wide, part of x86-64
  AdamwPath_avx2,    // 8 wide, when the cpu has AVX2 (checked at run time)
};

std::string_view adamw_path_name(AdamwPath p);
// Whether this build and this cpu can run p.
bool adamw_path_available(AdamwPath p);
// The widest available path at simd_level() (Note [One instruction-set dispatch], backend/cpu/kernels/cpu_features.h).
AdamwPath adamw_path_best();

// ops::cpu::adamw_update on an explicit path (asserts adamw_path_available(path)); same arguments,
// same contract, same threading.
// A bf16 grad or param_copy is converted with core/dtype.h's bits on every path (widening exact,
// narrowing bf16_from_float), so the paths agree bit for bit for every dtype too.
void adamw_update_path(AdamwPath path, float* param, CBuf grad, float* m, float* v, int64_t n, AdamWHyper h,
                       Buf param_copy);

}  // namespace fp::ops::cpu
