// The plain (full) vocabulary loss: logits, log-softmax and their gradient each materialised as
// (n, V) fp32, as PyTorch and Megatron do. n tokens, V vocabulary. Target -100 = ignored.
#pragma once

#include <cstdint>

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// The target that marks a position without a loss (PyTorch's ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

// logits (n, V) -> logp (n, V), max-subtracted log-softmax per row.
using log_softmax_forward_fn = void(const float* logits, float* logp, int64_t n, int64_t V);

// loss (n) = -logp[t, target[t]], 0 where the target is ignored.
using nll_forward_fn = void(const float* logp, const int32_t* targets, float* loss, int64_t n, int64_t V);

// dlogits (n, V), overwritten: scale * (exp(logp) - onehot(target)); rows of ignored targets are 0.
using cross_entropy_backward_fn = void(const float* logp, const int32_t* targets, float scale, float* dlogits,
                                       int64_t n, int64_t V);

}  // namespace fp::ops
