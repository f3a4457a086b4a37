// AdamW (ops/adamw.h: adamw_update, adamw_update_multi) on cuda.
// Dimensions: n elements of one tensor; count tensors of a bucket.
//
// One launch per bucket of up to kMaxTensors tensors, their table a kernel parameter (PyTorch's
// multi_tensor_apply, llm.c's one launch over its flat buffers): blocks take chunks of kChunk elements in a
// grid-stride loop, a chunk within one tensor. adamw_update is a bucket of one.
//
// The cpu's bits (Note [AdamW is element-wise] in ops/adamw.h; Note [Bits as the cpu's] in common.cuh): the
// scalars are formed on the host exactly as the cpu forms them (bias corrections in double, then rounded to
// float), and each element goes through the cpu's sequence of correctly rounded float operations,
// v + ((1 - beta2) * g) * g, sqrt(v) / sqrt(bc2) + eps, param * decay - (step_size * m) / denom, with
// -fmad=false so none is fused; a bf16 gradient is widened exactly and the working copy rounded as
// bf16_from_float. So the device update equals the cpu's (and the host-offloaded one's) bit for bit.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

constexpr int kMaxTensors = 32;
constexpr int64_t kChunk = 4 * kThreads;

// The cpu's AdamwScalars (backend/cpu/kernels/adamw.cpp) less the decay, which is per tensor.
struct Scalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps, grad_scale;
};

enum CopyKind : int { kCopyNone, kCopyF32, kCopyBf16 };

struct AdamwTable {
  float* param[kMaxTensors];
  const void* grad[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  void* copy[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t first[kMaxTensors + 1];  // tensor k's chunks are [first[k], first[k + 1])
  float decay[kMaxTensors];        // 1 - lr * weight_decay, each tensor's own
  bool grad_bf16[kMaxTensors];
  int8_t copy_kind[kMaxTensors];
  int count;
};

__global__ void adamw_kernel(const __grid_constant__ AdamwTable t, const Scalars s) {
  for (int64_t chunk = blockIdx.x; chunk < t.first[t.count]; chunk += gridDim.x) {
    int k = 0;
    while (chunk >= t.first[k + 1]) ++k;
    const int64_t begin = (chunk - t.first[k]) * kChunk, end = min(begin + kChunk, t.n[k]);
    const float decay = t.decay[k];
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float grad =
          t.grad_bf16[k] ? ld(static_cast<const bf16*>(t.grad[k])[i]) : static_cast<const float*>(t.grad[k])[i];
      // The cpu's adamw_element, operation for operation.
      const float g = grad * s.grad_scale;
      const float mi = s.beta1 * t.m[k][i] + s.one_minus_beta1 * g;
      const float vi = s.beta2 * t.v[k][i] + s.one_minus_beta2 * g * g;
      const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
      t.m[k][i] = mi;
      t.v[k][i] = vi;
      const float p = t.param[k][i] * decay - s.step_size * mi / denom;
      t.param[k][i] = p;
      if (t.copy_kind[k] == kCopyF32) static_cast<float*>(t.copy[k])[i] = p;
      if (t.copy_kind[k] == kCopyBf16) static_cast<bf16*>(t.copy[k])[i] = st<bf16>(p);
    }
  }
}

}  // namespace

void adamw_update_multi(const ExecContext& c, const AdamWTensor* tensors, int64_t count, AdamWHyper h) {
  if (count <= 0) return;
  if (h.step < 1) cuda_refuse("adamw_update", "the step counts from 1");
  // As the cpu's adamw_update_path.
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  Scalars s;
  s.beta1 = h.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  s.beta2 = h.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  s.step_size = static_cast<float>(static_cast<double>(h.lr) / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = h.eps;
  s.grad_scale = h.grad_scale;
  const cudaStream_t stream = ::fp::cuda::stream_of(c);
  for (int64_t t0 = 0; t0 < count; t0 += kMaxTensors) {
    AdamwTable t{};
    t.count = static_cast<int>(std::min<int64_t>(kMaxTensors, count - t0));
    for (int k = 0; k < t.count; ++k) {
      const AdamWTensor& a = tensors[t0 + k];
      if (a.n < 0) cuda_refuse("adamw_update", "a negative element count");
      ::fp::cuda::float_check(a.grad.dtype, "adamw_update (grad)");
      Buf copy = a.param_copy;
      if (!copy.null()) ::fp::cuda::float_check(copy.dtype, "adamw_update (param_copy)");
      if (copy.dtype == DType::DType_F32 && copy.p == a.param) copy = Buf();  // the weights themselves
      t.param[k] = a.param;
      t.grad[k] = a.grad.p;
      t.m[k] = a.m;
      t.v[k] = a.v;
      t.copy[k] = copy.p;
      t.n[k] = a.n;
      t.first[k + 1] = t.first[k] + (a.n + kChunk - 1) / kChunk;
      t.decay[k] = static_cast<float>(1.0 - static_cast<double>(h.lr) * static_cast<double>(a.weight_decay));
      t.grad_bf16[k] = a.grad.dtype == DType::DType_BF16;
      t.copy_kind[k] = static_cast<int8_t>(copy.null()                      ? kCopyNone
                                           : copy.dtype == DType::DType_F32 ? kCopyF32
                                                                            : kCopyBf16);
    }
    const int64_t chunks = t.first[t.count];
    if (chunks == 0) continue;
    adamw_kernel<<<::fp::cuda::blocks_for(chunks, 1), kThreads, 0, stream>>>(t, s);
    launched("adamw_update");
  }
}

void adamw_update(const ExecContext& c, float* param, CBuf grad, float* m, float* v, int64_t n, AdamWHyper h,
                  Buf param_copy) {
  AdamWTensor t;
  t.param = param;
  t.grad = grad;
  t.m = m;
  t.v = v;
  t.n = n;
  t.weight_decay = h.weight_decay;
  t.param_copy = param_copy;
  adamw_update_multi(c, &t, 1, h);
}

}  // namespace fp::ops::cuda
