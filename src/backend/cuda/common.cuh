// What the cuda backend's .cu files share (ggml-cuda's common.cuh): the launch shape, the error checks,
// bf16 loads and stores with the cpu's rounding, and the deterministic block reductions.
//
// Note [Device code without fmt]: nvcc 13 rejects fmt 9's compile-time format strings, so .cu files never
// include core/error.h. A dtype outside a kernel's list is refused through buf_dtype_refused (core/buf.h),
// a bad launch through cuda_check, anything else through cuda_refuse; all three are defined in .cpp files
// and throw fp::Error naming the kernel.
//
// Note [Bits as the cpu's]: the cpu table is the contract (Note [Kernel coverage] in backend/kernels.h).
// A device kernel that does per element what the cpu does meets it bit for bit when it uses the same
// IEEE operations in the same order: add, multiply, divide and sqrt are correctly rounded on both (nvcc's
// defaults -prec-div=true -prec-sqrt=true, no -use_fast_math), and the target compiles with -fmad=false
// (CMakeLists.txt) so that nvcc never contracts a * b + c into one fused multiply-add, which the cpu build
// (plain x86-64, no FMA) never does either. bf16 stores round as core/dtype.h's bf16_from_float (to nearest
// even, NaN kept quiet with its sign), not through cuda_bf16.h, whose NaN bits differ. Reductions in double
// that replay the cpu's order (reduce.cu) get its bits too. Kernels calling exp, log, sin or cos meet the
// error model, not the bits: CUDA's functions are not glibc's. The float exponential is exp_f32 below, the
// double exp rounded to float: within a hair of the nearest float to e^x, as glibc's expf (0.502 ulps) is,
// so the two agree but where e^x lies within ~2^-29 ulp of a rounding boundary, and the kernel-table
// test's tolerances, written for one expf on both sides, hold (CUDA's own expf is 2 ulps off). Their
// reductions run in a fixed tree (block_reduce below), so a run repeats its own bits on one device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_stream.h"
#include "core/buf.h"

namespace fp::cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (a cap well past what fills any device).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

inline cudaStream_t stream_of(const ExecContext& c) { return CudaStream::of(c).handle(); }

// After a launch: its configuration error, if any, thrown naming the kernel.
inline void launched(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

#define FP_CUDA_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

// Loads widen exactly; stores round once (Note [Bits as the cpu's]).
__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(bf16 x) { return __uint_as_float(static_cast<uint32_t>(x.bits) << 16); }

template <class T>
__device__ __forceinline__ T st(float x);
template <>
__device__ __forceinline__ float st<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 st<bf16>(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// Refuses a dtype other than f32 and bf16, naming the kernel.
inline void float_check(DType t, const char* kernel) {
  if (t != DType::DType_F32 && t != DType::DType_BF16) buf_dtype_refused(kernel, t);
}

// e^x in float: CUDA's double exp (within 1 ulp of double) rounded once (Note [Bits as the cpu's]).
__device__ __forceinline__ float exp_f32(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// Calls f.template operator()<A, B>() with the element types of two operands (f32 or bf16 each).
template <class F>
void visit_float2(DType a, DType b, const char* kernel, F&& f) {
  visit_float(a, kernel, [&]<class A>() { visit_float(b, kernel, [&]<class B>() { f.template operator()<A, B>(); }); });
}

// The sum (or max) of one value per thread of the block, in a fixed tree: xor-shuffles within each warp,
// then warp 0 over the warps' results in warp order. Every thread gets the result. The order depends on
// blockDim only, so a launch repeats its bits. shared: 32 elements.
struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
template <class T, class Op>
__device__ T block_reduce(T v, T* shared, Op op, T identity) {
  for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // shared may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : identity;
    for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

}  // namespace fp::cuda

// The kernels' namespace sees the helpers above unqualified: one list here, not one per file.
namespace fp::ops::cuda {
using ::fp::cuda::MaxOp;
using ::fp::cuda::SumOp;
using ::fp::cuda::block_reduce;
using ::fp::cuda::blocks_for;
using ::fp::cuda::exp_f32;
using ::fp::cuda::kThreads;
using ::fp::cuda::launched;
using ::fp::cuda::ld;
using ::fp::cuda::st;
using ::fp::cuda::stream_of;
using ::fp::cuda::visit_float2;
}  // namespace fp::ops::cuda
