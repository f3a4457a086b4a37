// The plain (full) vocabulary loss: logits, log-softmax and their gradient each materialised as
// (n, V) fp32, as PyTorch and Megatron do. n tokens, V vocabulary. Target -100 = ignored.
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

inline constexpr int32_t kIgnoreIndex = -100;

// logits (n, V) -> logp (n, V), max-subtracted log-softmax per row.
void log_softmax_forward(const float* logits, float* logp, int64_t n, int64_t V);
// loss (n) = -logp[t, target[t]], 0 where the target is ignored.
void nll_forward(const float* logp, const int32_t* targets, float* loss, int64_t n, int64_t V);
// dlogits (n, V), overwritten: scale * (exp(logp) - onehot(target)); rows of ignored targets are 0.
void cross_entropy_backward(const float* logp, const int32_t* targets, float scale, float* dlogits, int64_t n,
                            int64_t V);

}  // namespace fp::ops::cpu
