// Element-wise CUDA kernels (cuda_kernels.h): one thread per element, grid-stride loops so any n fits
// one launch of at most 65535 x 256 threads.
#include "backend/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fp::ops::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? b : 65535);
}

void launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

__global__ void fill_kernel(float* y, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) y[i] = v;
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] += x[i];
}

__global__ void scale_kernel(float* y, float a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] *= a;
}

}  // namespace

void fill(cudaStream_t stream, Buf y, float v, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y.f32(), v, n);
  launched("fill");
}

void add_inplace(cudaStream_t stream, Buf y, CBuf x, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y.f32(), x.f32(), n);
  launched("add_inplace");
}

void scale_inplace(cudaStream_t stream, Buf y, float a, int64_t n) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y.f32(), a, n);
  launched("scale_inplace");
}

}  // namespace fp::ops::cuda
