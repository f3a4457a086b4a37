// AdamW update, torch.optim.AdamW semantics (decoupled weight decay, bias-corrected moments).
// Dimensions: n the number of elements of one parameter (or of any range of a flat state buffer).
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// One AdamW step over n elements, in place:
//   g      = grad * grad_scale                     (grad_scale carries global-norm clipping)
//   param *= 1 - lr * weight_decay
//   m      = beta1 * m + (1 - beta1) * g
//   v      = beta2 * v + (1 - beta2) * g * g
//   param -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),   bc1 = 1 - beta1^step, bc2 = 1 - beta2^step
// step counts from 1 (the step being taken, PyTorch's state["step"] after its increment). The bias
// corrections are computed in double once per call, every per-element operation in float.
//
// param (n) fp32 weights, updated
// grad  (n) fp32 gradient, read only
// m     (n) first moment (exp_avg), updated; zero before step 1
// v     (n) second moment (exp_avg_sq), updated; zero before step 1
//
// Contract, Note [AdamW is element-wise]: the result of every element depends only on that element's
// inputs and the scalars, never on n, the thread count, or where a range is split: calling it on
// [0, n) or on consecutive sub-ranges [0, a), [a, b), ..., [z, n) gives identical bits. Bucketed and
// streamed (host-offload) variants rely on this to equal the plain update bit for bit.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int64_t step);

}  // namespace fp::ops::cpu
