// SwiGLU activation of the experts: a = silu(g) * u, silu(g) = g / (1 + exp(-g)). n elements.
//
// bf16 (Note [Kernel operands carry their dtype] in core/buf.h): every operand is f32 or bf16 on its
// own. The activation is computed in f32 from the exactly widened inputs and each output is rounded
// once, so a bf16 result has the bits of the f32 kernel on the widened inputs, rounded.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops::cpu {

// g, u (n) -> a (n).
void swiglu_forward(CBuf g, CBuf u, Buf a, int64_t n);
// da (n) -> dg, du (n), overwritten.
void swiglu_backward(CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n);

}  // namespace fp::ops::cpu
