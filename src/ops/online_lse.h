// The cross-entropy of a vocabulary that is never materialised whole: logits arrive as strips, each
// the logits of some rows against a vocabulary range [v0, v1) (a sub-block of the vocabulary on one
// rank, a shard of it in the Ring-DTP ring), and each row keeps a running state folded with an online
// log-sum-exp (docs/design.md, Ring-DTP):
//
//   m' = max(m, max_j x_j)          running max                                  (rows) float
//   z' = z exp(m - m') + sum_j exp(x_j - m')   running sum of exponentials, rescaled (rows) double
//   y  = x[target]                  the target's logit, from the strip that holds it (rows) float
//
// After every range of [0, V) has been folded once (in any order), lse = m + log z and the token loss
// is lse - y. The gradient of a strip needs only the final (m, z): d x_j = scale (exp(x_j - lse) -
// [j == target]).
//
// Dimensions: rows tokens of the strip, ld the strip's row stride (elements), [v0, v1) the vocabulary
// ids of its columns 0 .. v1 - v0 - 1. Target kIgnoreIndex (-100) = ignored (ops/cross_entropy.h).
//
// Note [Why z is a double]: z sums up to V terms in (0, 1]; as in the full loss (Note [Why the softmax
// sum is taken in double], backend/cpu/kernels/cross_entropy.cpp) a double keeps it exact to far below float
// precision for any V, so lse, the loss and every softmax value come out as the full loss's do (to
// ~1 ulp), whatever the number of ranges. 8 bytes per token of state is nothing next to a strip.
#pragma once

#include <cstdint>

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// The empty state: m (rows) = -inf, z (rows) = 0, y (rows) = 0.
using online_lse_init_fn = void(float* m, double* z, float* y, int64_t rows);

// Folds the strip (rows, ld) holding vocabulary ids [v0, v1) into the state m, z, y (rows) of its rows;
// targets (rows). Each row in one fixed order whatever the thread count.
using online_lse_fold_fn = void(const float* strip, int64_t ld, const int32_t* targets, int64_t rows, int64_t v0,
                                int64_t v1, float* m, double* z, float* y);

// *loss_sum (a double on the device) = sum over rows whose target is not ignored of (m + log z - y),
// in row order. The state must have folded all of [0, V).
using online_lse_loss_fn = void(const float* m, const double* z, const float* y, const int32_t* targets, int64_t rows,
                                double* loss_sum);

// The strip (rows, ld) of ids [v0, v1), in place: x_j -> scale (exp(x_j - lse) - [v0 + j == target]),
// lse = m + log z from the final state; rows whose target is ignored become 0 (their logits not read).
using online_lse_backward_fn = void(float* strip, int64_t ld, const int32_t* targets, int64_t rows, int64_t v0,
                                    int64_t v1, const float* m, const double* z, float scale);

}  // namespace fp::ops
