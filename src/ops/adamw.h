// AdamW update, torch.optim.AdamW semantics (decoupled weight decay, bias-corrected moments).
// Dimensions: n the number of elements of one parameter (or of any range of a flat state buffer).
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// The scalars of one AdamW step (the update below).
struct AdamWHyper {
  float lr = 0.0f;                   // learning rate of this step
  float beta1 = 0.0f, beta2 = 0.0f;  // decay rates of the first and second moments
  float eps = 0.0f;                  // added to the denominator
  float weight_decay = 0.0f;         // decoupled: param *= 1 - lr * weight_decay
  float grad_scale = 1.0f;           // the gradient's factor: global-norm clipping
  int64_t step = 1;                  // the step being taken, from 1 (PyTorch's state["step"] after its increment)
};

// One AdamW step over n elements with the scalars h, in place:
//   g      = grad * grad_scale
//   param *= 1 - lr * weight_decay
//   m      = beta1 * m + (1 - beta1) * g
//   v      = beta2 * v + (1 - beta2) * g * g
//   param -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),   bc1 = 1 - beta1^step, bc2 = 1 - beta2^step
// The bias corrections are computed in double once per call, every per-element operation in float.
//
// param      (n) f32 weights, updated: the master copy under a mixed-precision recipe
// grad       (n) gradient, f32 or bf16, read only; a bf16 gradient is widened (exact), so the update
//                is bit for bit the f32 update fed the widened gradient
// m          (n) f32 first moment (exp_avg), updated; zero before step 1
// v          (n) f32 second moment (exp_avg_sq), updated; zero before step 1
// param_copy (n) null, or the model's working copy of the weights (f32 or bf16), overwritten after
//                the update with param rounded once to its dtype (to nearest even; a copy when f32).
//                It must not overlap param, unless it is param itself (f32): then nothing is written.
//
// Contract, Note [AdamW is element-wise]: the result of every element depends only on that element's
// inputs and the scalars, never on n, the thread count, or where a range is split: calling it on
// [0, n) or on consecutive sub-ranges [0, a), [a, b), ..., [z, n) gives identical bits, whatever the
// dtypes of grad and param_copy (their conversions are element-wise too). Bucketed and streamed
// (host-offload) variants rely on this to equal the plain update bit for bit.
//
// param_copy has no default: the kernel table (backend/kernels.h) holds function pointers, through
// which a default argument would not apply, so every caller passes it (nullptr when there is none).
using adamw_update_fn = void(float* param, CBuf grad, float* m, float* v, int64_t n, AdamWHyper h, Buf param_copy);

// One tensor of a bucket: adamw_update's operands and its own weight decay (none on norms and biases).
struct AdamWTensor {
  float* param = nullptr;
  CBuf grad;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
  float weight_decay = 0.0f;
  Buf param_copy;
};

// Note [The optimizer in buckets]: one AdamW step over a bucket of tensors in one call, as PyTorch's fused
// AdamW (multi_tensor_apply over lists of tensors) and llm.c (one launch over its flat buffers) do, so a
// GPU launches once per bucket, not once per parameter. A bucket is a table of count tensors (host memory,
// read at the call, alive until the stream has passed it), not one contiguous buffer: each tensor keeps
// its own allocation, name and place in the ledger and in checkpoints. Tensor i gets exactly
// adamw_update(t[i].param, t[i].grad, t[i].m, t[i].v, t[i].n, h with weight_decay = t[i].weight_decay,
// t[i].param_copy): the same bits (Note [AdamW is element-wise] lets a backend split the work across
// tensors and threads as it likes). The tensors do not overlap.
using adamw_update_multi_fn = void(const AdamWTensor* t, int64_t count, AdamWHyper h);

}  // namespace fp::ops
