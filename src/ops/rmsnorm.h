// RMSNorm over the last dimension: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// rows independent rows of width d (d = H for layer norms, d = head_dim for q_norm/k_norm).
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// x (rows, d), w (d) -> y (rows, d); rstd (rows) is written when not null. y may alias x.
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t d, float eps);
// Given x, w, rstd from forward and dy (rows, d): dx (rows, d) is overwritten, dw (d) accumulated (+=).
// dw's reduction order is fixed (independent of the thread count), so results are bitwise reproducible.
// workspace: rmsnorm_backward_workspace(rows, d) floats of scratch (the dw partials), which the caller
// allocates through the ledger (category workspace), so that no op holds memory the ledger cannot see.
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      int64_t rows, int64_t d, float* workspace);
// The floats rmsnorm_backward needs for (rows, d): B x d, B = ceil(rows / block) <= 256 row blocks
// (Note [Deterministic rmsnorm dw] in rmsnorm.cpp), so at most 256 d whatever the rows.
int64_t rmsnorm_backward_workspace(int64_t rows, int64_t d);

}  // namespace fp::ops::cpu
