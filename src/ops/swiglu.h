// SwiGLU activation of the experts: a = silu(g) * u, silu(g) = g / (1 + exp(-g)). n elements.
//
// bf16 (Note [Kernel operands carry their dtype] in core/buf.h): every operand is f32 or bf16 on its
// own. The activation is computed in f32 from the exactly widened inputs and each output is rounded
// once, so a bf16 result has the bits of the f32 kernel on the widened inputs, rounded.
//
// Note [The clamped SwiGLU] (gpt-oss's experts, transformers' GptOssExperts._apply_gate): with gate g and
// up u, g_c = min(g, limit), u_c = clamp(u, -limit, limit), a = (u_c + 1) g_c sigmoid(alpha g_c)
// (alpha 1.702, limit 7.0 in the published models). Its gradient is zero where a clamp is active
// (g > limit for dg; |u| > limit for du), as torch.clamp's: a bound itself passes. Same storage rule.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// g, u (n) -> a (n).
using swiglu_forward_fn = void(CBuf g, CBuf u, Buf a, int64_t n);

// da (n) -> dg, du (n), overwritten.
using swiglu_backward_fn = void(CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n);

// Note [The clamped SwiGLU]: g, u (n) -> a (n); and da (n) -> dg, du (n), overwritten.
using swiglu_clamped_forward_fn = void(CBuf g, CBuf u, Buf a, int64_t n, float alpha, float limit);
using swiglu_clamped_backward_fn = void(CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n, float alpha, float limit);

}  // namespace fp::ops
