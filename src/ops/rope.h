// Rotary position embedding, rotate-half layout (Hugging Face Llama/Qwen):
//   for i < hd/2: inv_freq_i = theta^(-2i/hd), a = pos * inv_freq_i (computed in double),
//   y[i] = x[i] cos a - x[i + hd/2] sin a;  y[i + hd/2] = x[i + hd/2] cos a + x[i] sin a.
// n tokens, heads heads, hd head_dim (even).
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// x (n, heads, hd) rotated in place; pos (n) the position of each token in its sequence.
void rope_forward(float* x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, float theta);
// dx (n, heads, hd) in place: the transpose (inverse) rotation.
void rope_backward(float* dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, float theta);

}  // namespace fp::ops::cpu
