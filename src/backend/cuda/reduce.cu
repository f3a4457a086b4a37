// The sums and sums of squares (ops/elementwise.h: reduce_sum, reduce_sumsq, reduce_sumsq_multi) on cuda.
// Dimensions: n elements of x; B = ceil(n / 4096) blocks of it; count tensors of a bucket.
//
// Note [Device reductions in the cpu's order]: the cpu cuts x into blocks of 4096 elements, sums each in
// double over 8 lanes (element i of a block to lane i % 8, in element order), adds the lanes in a fixed
// tree and then the block partials in block order from 0 (Note [Deterministic reductions] in
// backend/cpu/kernels/elementwise.cpp). The device replays exactly that: stage 1 gives each (block, lane)
// a thread that walks its 512 elements in order, the 8 lanes of a block sit in 8 consecutive threads of a
// warp and are added in the cpu's tree through shuffles, and stage 2 gives each tensor one thread that adds
// its block partials in order. Double adds are correctly rounded on both, a square of a float is exact in
// double, and -fmad=false keeps every multiply and add apart (Note [Bits as the cpu's] in common.cuh): the
// result has the cpu's bits, so a gradient norm is the same number on either backend. Stage 1 reads
// memory at full width (a warp loads 4 blocks x 32 contiguous bytes per step); stage 2 is B dependent adds
// on one thread per tensor (~1 ms for 10^9 elements), the price of the cpu's order.
//
// The partials (B doubles, 8 bytes per 4096 elements) live in the stream's scratch (CudaStream::scratch).
// A bucket goes in launches of up to kMaxTensors tensors whose table travels as a kernel parameter
// (PyTorch's multi_tensor_apply), so nothing is copied to the device at the call.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

constexpr int64_t kBlock = 4096;  // the cpu's kReduceBlock
constexpr int kLanes = 8;
constexpr int kMaxTensors = 64;

struct ReduceTable {
  const void* x[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t first[kMaxTensors + 1];  // tensor t's blocks are [first[t], first[t + 1]) of the partials
  bool bf16[kMaxTensors];
  int count;
};

template <bool kSquare, class T>
__device__ double lane_sum(const T* x, int64_t len, int lane) {
  double s = 0;
  for (int64_t i = lane; i < len; i += kLanes) {
    const double v = ld(x[i]);
    s += kSquare ? v * v : v;
  }
  return s;
}

// Stage 1: partial[b] = the cpu's block_sum of block b (Note [Device reductions in the cpu's order]). Every
// thread of a warp runs the same number of iterations (items rounded up to the warp) so that the
// shuffles see all 32 lanes.
template <bool kSquare>
__global__ void reduce_blocks_kernel(const __grid_constant__ ReduceTable t, double* partial) {
  const int64_t items = t.first[t.count] * kLanes, rounded = (items + 31) / 32 * 32;
  const int lane = static_cast<int>(threadIdx.x % kLanes), group = static_cast<int>(threadIdx.x % 32) - lane;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rounded; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / kLanes;
    double s = 0;
    if (i < items) {
      int k = 0;
      while (b >= t.first[k + 1]) ++k;
      const int64_t begin = (b - t.first[k]) * kBlock, len = min(kBlock, t.n[k] - begin);
      s = t.bf16[k] ? lane_sum<kSquare>(static_cast<const bf16*>(t.x[k]) + begin, len, lane)
                    : lane_sum<kSquare>(static_cast<const float*>(t.x[k]) + begin, len, lane);
    }
    double l[kLanes];
    for (int j = 0; j < kLanes; ++j) l[j] = __shfl_sync(0xffffffffu, s, group + j);
    if (i < items && lane == 0) partial[b] = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
  }
}

// Stage 2: out[k] = the partials of tensor k added in block order, as float.
__global__ void reduce_fold_kernel(const __grid_constant__ ReduceTable t, const double* partial, float* out) {
  const int k = static_cast<int>(threadIdx.x);
  if (k >= t.count) return;
  double s = 0;
  for (int64_t b = t.first[k]; b < t.first[k + 1]; ++b) s += partial[b];
  out[k] = static_cast<float>(s);
}

template <bool kSquare>
void reduce_launch(const ExecContext& c, const char* kernel, const CBuf* x, const int64_t* n, int64_t count,
                   float* out) {
  CudaStream& s = CudaStream::of(c);
  for (int64_t t0 = 0; t0 < count; t0 += kMaxTensors) {
    ReduceTable t{};
    t.count = static_cast<int>(std::min<int64_t>(kMaxTensors, count - t0));
    for (int k = 0; k < t.count; ++k) {
      const CBuf& xk = x[t0 + k];
      const int64_t nk = n[t0 + k];
      if (nk < 0) cuda_refuse(kernel, "a negative element count");
      if (nk > 0) ::fp::cuda::float_check(xk.dtype, kernel);
      t.x[k] = xk.p;
      t.n[k] = nk;
      t.bf16[k] = xk.dtype == DType::DType_BF16;
      t.first[k + 1] = t.first[k] + (nk + kBlock - 1) / kBlock;
    }
    const int64_t blocks = t.first[t.count];
    double* partial = static_cast<double*>(s.scratch(static_cast<uint64_t>(std::max<int64_t>(blocks, 1)) * 8));
    if (blocks > 0) {
      reduce_blocks_kernel<kSquare><<<::fp::cuda::blocks_for(blocks * kLanes), kThreads, 0, s.handle()>>>(t, partial);
      launched(kernel);
    }
    reduce_fold_kernel<<<1, kMaxTensors, 0, s.handle()>>>(t, partial, out + t0);
    launched(kernel);
  }
}

}  // namespace

void reduce_sum(const ExecContext& c, CBuf x, int64_t n, float* out) {
  reduce_launch<false>(c, "reduce_sum", &x, &n, 1, out);
}

void reduce_sumsq(const ExecContext& c, CBuf x, int64_t n, float* out) {
  reduce_launch<true>(c, "reduce_sumsq", &x, &n, 1, out);
}

void reduce_sumsq_multi(const ExecContext& c, const CBuf* x, const int64_t* n, int64_t count, float* out) {
  if (count <= 0) return;
  reduce_launch<true>(c, "reduce_sumsq_multi", x, n, count, out);
}

}  // namespace fp::ops::cuda
