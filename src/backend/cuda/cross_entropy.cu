// The vocabulary loss on cuda: the full one (ops/cross_entropy.h: log_softmax_forward, nll_forward,
// cross_entropy_backward) and the online log-sum-exp over strips (ops/online_lse.h). One file for both:
// they are the same row reductions, and each .cu costs the build two device compilations.
// Dimensions: n (or rows) tokens; V the vocabulary, or w = v1 - v0 columns of a strip with row stride ld.
//
// f32, as the cpu table. One block of kThreads per row (grid-stride over rows): the row max (exact in any
// order), then the sum of exp(x - max) in double (Note [Why the softmax sum is taken in double] in
// backend/cpu/kernels/cross_entropy.cpp), each thread over its own columns, then block_reduce's fixed tree,
// so a run repeats its bits. Error model, not the cpu's bits (Note [Bits as the cpu's] in common.cuh): exp_f32
// and CUDA's log (1 ulp) against glibc's, and another order of the double sums; logp and the loss stay
// within an ulp or two of the cpu's. nll_forward and the state's init move values only: the cpu's bits.
// The targets are not checked against V on the device (the cpu asserts them): the data loader validates
// them, and an id past V reads the wrong row's logit rather than failing.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows < 65535 ? (rows > 0 ? rows : 1) : 65535); }

// max over x (w), every thread of the block getting it.
__device__ float row_max(const float* x, int64_t w, float* shared) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < w; j += blockDim.x) m = x[j] > m ? x[j] : m;
  return block_reduce(m, shared, MaxOp{}, -INFINITY);
}

// sum over x (w) of exp(x - m) in double, every thread of the block getting it.
__device__ double row_sum_exp(const float* x, int64_t w, float m, double* shared) {
  double s = 0;
  for (int64_t j = threadIdx.x; j < w; j += blockDim.x) s += static_cast<double>(exp_f32(x[j] - m));
  return block_reduce(s, shared, SumOp{}, 0.0);
}

__global__ void log_softmax_kernel(const float* logits, float* logp, int64_t n, int64_t V) {
  __shared__ float smax[32];
  __shared__ double ssum[32];
  for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    const float* x = logits + t * V;  // (V)
    const float m = row_max(x, V, smax);
    const double lse = static_cast<double>(m) + log(row_sum_exp(x, V, m, ssum));
    for (int64_t k = threadIdx.x; k < V; k += blockDim.x) logp[t * V + k] = static_cast<float>(x[k] - lse);
  }
}

__global__ void nll_kernel(const float* logp, const int32_t* targets, float* loss, int64_t n, int64_t V) {
  FP_CUDA_GRID_STRIDE(t, n) loss[t] = targets[t] == kIgnoreIndex ? 0.0f : -logp[t * V + targets[t]];
}

__global__ void cross_entropy_backward_kernel(const float* logp, const int32_t* targets, float scale, float* dlogits,
                                              int64_t n, int64_t V) {
  FP_CUDA_GRID_STRIDE(i, n * V) {
    const int64_t t = i / V, k = i - t * V;
    const int32_t target = targets[t];
    dlogits[i] = target == kIgnoreIndex ? 0.0f
                 : k == target          ? scale * (exp_f32(logp[i]) - 1.0f)
                                        : scale * exp_f32(logp[i]);
  }
}

__global__ void online_lse_init_kernel(float* m, double* z, float* y, int64_t rows) {
  FP_CUDA_GRID_STRIDE(t, rows) {
    m[t] = -INFINITY;
    z[t] = 0.0;
    y[t] = 0.0f;
  }
}

__global__ void online_lse_fold_kernel(const float* strip, int64_t ld, const int32_t* targets, int64_t rows, int64_t v0,
                                       int64_t v1, float* m, double* z, float* y) {
  __shared__ float smax[32];
  __shared__ double ssum[32];
  const int64_t w = v1 - v0;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const float* x = strip + t * ld;  // (w)
    const float mb = row_max(x, w, smax);
    const float m0 = m[t];
    const float mn = m0 > mb ? m0 : mb;
    const double sum = row_sum_exp(x, w, mn, ssum);
    if (threadIdx.x == 0) {
      // An empty state (z = 0, m = -inf) contributes nothing; exp(-inf - -inf) would be NaN.
      const double z0 = z[t];
      const double kept = z0 == 0.0 ? 0.0 : z0 * exp(static_cast<double>(m0) - static_cast<double>(mn));
      z[t] = kept + sum;
      m[t] = mn;
      const int64_t target = targets[t];
      if (target >= v0 && target < v1) y[t] = x[target - v0];
    }
  }
}

// One thread, rows in order (as the cpu: the order fixes the bits; n logs are nothing next to the strips).
__global__ void online_lse_loss_kernel(const float* m, const double* z, const float* y, const int32_t* targets,
                                       int64_t rows, double* loss_sum) {
  double s = 0;
  for (int64_t t = 0; t < rows; ++t)
    if (targets[t] != kIgnoreIndex) s += (static_cast<double>(m[t]) + log(z[t])) - static_cast<double>(y[t]);
  *loss_sum = s;
}

// Each column read then written by one thread, the target's included: no ordering needed within a row.
__global__ void online_lse_backward_kernel(float* strip, int64_t ld, const int32_t* targets, int64_t rows, int64_t v0,
                                           int64_t v1, const float* m, const double* z, float scale) {
  const int64_t w = v1 - v0;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    float* x = strip + t * ld;  // (w)
    const int64_t target = targets[t];
    if (target == kIgnoreIndex) {
      for (int64_t j = threadIdx.x; j < w; j += blockDim.x) x[j] = 0.0f;
      continue;
    }
    const double lse = static_cast<double>(m[t]) + log(z[t]);
    for (int64_t j = threadIdx.x; j < w; j += blockDim.x) {
      const float e = exp_f32(static_cast<float>(static_cast<double>(x[j]) - lse));
      x[j] = v0 + j == target ? scale * (e - 1.0f) : scale * e;
    }
  }
}

void range_check(const char* kernel, int64_t ld, int64_t v0, int64_t v1) {
  if (!(v0 >= 0 && v1 > v0 && ld >= v1 - v0)) cuda_refuse(kernel, "a strip needs 0 <= v0 < v1 and ld >= v1 - v0");
}

}  // namespace

void log_softmax_forward(const ExecContext& c, const float* logits, float* logp, int64_t n, int64_t V) {
  if (V < 1) cuda_refuse("log_softmax_forward", "an empty vocabulary");
  if (n <= 0) return;
  log_softmax_kernel<<<row_blocks(n), kThreads, 0, stream_of(c)>>>(logits, logp, n, V);
  launched("log_softmax_forward");
}

void nll_forward(const ExecContext& c, const float* logp, const int32_t* targets, float* loss, int64_t n, int64_t V) {
  if (n <= 0) return;
  nll_kernel<<<blocks_for(n), kThreads, 0, stream_of(c)>>>(logp, targets, loss, n, V);
  launched("nll_forward");
}

void cross_entropy_backward(const ExecContext& c, const float* logp, const int32_t* targets, float scale,
                            float* dlogits, int64_t n, int64_t V) {
  if (n <= 0 || V <= 0) return;
  cross_entropy_backward_kernel<<<blocks_for(n * V), kThreads, 0, stream_of(c)>>>(logp, targets, scale, dlogits, n, V);
  launched("cross_entropy_backward");
}

void online_lse_init(const ExecContext& c, float* m, double* z, float* y, int64_t rows) {
  if (rows <= 0) return;
  online_lse_init_kernel<<<blocks_for(rows), kThreads, 0, stream_of(c)>>>(m, z, y, rows);
  launched("online_lse_init");
}

void online_lse_fold(const ExecContext& c, const float* strip, int64_t ld, const int32_t* targets, int64_t rows,
                     int64_t v0, int64_t v1, float* m, double* z, float* y) {
  range_check("online_lse_fold", ld, v0, v1);
  if (rows <= 0) return;
  online_lse_fold_kernel<<<row_blocks(rows), kThreads, 0, stream_of(c)>>>(strip, ld, targets, rows, v0, v1, m, z, y);
  launched("online_lse_fold");
}

void online_lse_loss(const ExecContext& c, const float* m, const double* z, const float* y, const int32_t* targets,
                     int64_t rows, double* loss_sum) {
  online_lse_loss_kernel<<<1, 1, 0, stream_of(c)>>>(m, z, y, targets, rows, loss_sum);
  launched("online_lse_loss");
}

void online_lse_backward(const ExecContext& c, float* strip, int64_t ld, const int32_t* targets, int64_t rows,
                         int64_t v0, int64_t v1, const float* m, const double* z, float scale) {
  range_check("online_lse_backward", ld, v0, v1);
  if (rows <= 0) return;
  online_lse_backward_kernel<<<row_blocks(rows), kThreads, 0, stream_of(c)>>>(strip, ld, targets, rows, v0, v1, m, z,
                                                                              scale);
  launched("online_lse_backward");
}

}  // namespace fp::ops::cuda
