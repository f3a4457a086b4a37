// RMSNorm over the last dimension: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// rows independent rows of width d (d = H for layer norms, d = head_dim for q_norm/k_norm).
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// x (rows, d), w (d) -> y (rows, d); rstd (rows) is written when not null. y may alias x.
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t d, float eps);
// Given x, w, rstd from forward and dy (rows, d): dx (rows, d) is overwritten, dw (d) accumulated (+=).
// dw's reduction order is fixed (independent of the thread count), so results are bitwise reproducible.
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      int64_t rows, int64_t d);

}  // namespace fp::ops::cpu
