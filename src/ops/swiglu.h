// SwiGLU activation of the experts: a = silu(g) * u, silu(g) = g / (1 + exp(-g)). n elements.
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// g, u (n) -> a (n).
void swiglu_forward(const float* g, const float* u, float* a, int64_t n);
// da (n) -> dg, du (n), overwritten.
void swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n);

}  // namespace fp::ops::cpu
