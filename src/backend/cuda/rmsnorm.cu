// RMSNorm (ops/rmsnorm.h) on cuda: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// Dimensions: rows independent rows of width d; B = ceil(rows / br) row blocks of br rows (the cpu's).
//
// The cpu's bits (Note [Bits as the cpu's] in common.cuh), by replaying its order:
//   the row sums (sum x^2, sum dy w x) in double over 8 lanes, element i of a row in lane i % 8, the lanes
//     added in the cpu's tree: here 8 consecutive threads of a warp are a row's lanes, joined by shuffles
//     (as reduce.cu's blocks); rstd and the backward's coefficient formed in double as the cpu forms them;
//   dw by Note [Deterministic rmsnorm dw] (backend/cpu/kernels/rmsnorm.cpp): a float partial per block of
//     rows and column, rows in order, in the caller's workspace (B, d), then the partials added in block
//     order in double, one thread per column. The block size is the cpu's, so the workspace query is too.
// Every operand f32 or bf16 on its own, widened on load and rounded once on store. y may alias x: a row's
// lanes have all read it (the shuffle) before any writes, and each element is read then written by one thread.
#include <initializer_list>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

constexpr int kLanes = 8;
constexpr int64_t kRowBlock = 64;  // the cpu's
constexpr int64_t kMaxBlocks = 256;

int64_t block_rows(int64_t rows) { return std::max(kRowBlock, (rows + kMaxBlocks - 1) / kMaxBlocks); }

// The operands of a call, each f32 or bf16: bit i of `bf16` set when operand i is (x, w, y / dy, dx, dw).
struct Ops {
  const void* x;
  const void* w;
  const void* dy;
  void* y;  // y (forward) or dx
  void* dw;
  unsigned bf16;
};

template <int kIndex>
__device__ __forceinline__ float load(const Ops& o, const void* p, int64_t i) {
  return (o.bf16 >> kIndex) & 1u ? ld(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
template <int kIndex>
__device__ __forceinline__ void store(const Ops& o, void* p, int64_t i, float v) {
  if ((o.bf16 >> kIndex) & 1u)
    static_cast<bf16*>(p)[i] = st<bf16>(v);
  else
    static_cast<float*>(p)[i] = v;
}

// The cpu's lane tree over the 8 lanes of this thread's group.
__device__ __forceinline__ double lanes_sum(double lane_value, int group) {
  double l[kLanes];
  for (int j = 0; j < kLanes; ++j) l[j] = __shfl_sync(0xffffffffu, lane_value, group + j);
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// One group of 8 threads per row; every lane of a warp runs the same iterations (the shuffles).
__global__ void rmsnorm_forward_kernel(Ops o, float* rstd, int64_t rows, int64_t d, float eps) {
  const int64_t items = rows * kLanes, rounded = (items + 31) / 32 * 32;
  const int lane = static_cast<int>(threadIdx.x % kLanes), group = static_cast<int>(threadIdx.x % 32) - lane;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rounded; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / kLanes;
    const bool live = i < items;
    double ss = 0;
    if (live)
      for (int64_t j = lane; j < d; j += kLanes) {
        const double v = load<0>(o, o.x, r * d + j);
        ss += v * v;
      }
    const double sum = lanes_sum(ss, group);
    if (!live) continue;
    const float rs = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(d) + static_cast<double>(eps)));
    for (int64_t j = lane; j < d; j += kLanes)
      store<2>(o, o.y, r * d + j, (load<0>(o, o.x, r * d + j) * rs) * load<1>(o, o.w, j));
    if (lane == 0 && rstd != nullptr) rstd[r] = rs;
  }
}

// dx per row: coef = rs^3 sum(dy w x) / d in double, dx = rs (w dy) - x coef in float.
__global__ void rmsnorm_dx_kernel(Ops o, const float* rstd, int64_t rows, int64_t d) {
  const int64_t items = rows * kLanes, rounded = (items + 31) / 32 * 32;
  const int lane = static_cast<int>(threadIdx.x % kLanes), group = static_cast<int>(threadIdx.x % 32) - lane;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rounded; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / kLanes;
    const bool live = i < items;
    double dot = 0;
    if (live)
      for (int64_t j = lane; j < d; j += kLanes)
        dot += static_cast<double>(load<2>(o, o.dy, r * d + j)) * load<1>(o, o.w, j) * load<0>(o, o.x, r * d + j);
    const double sum = lanes_sum(dot, group);
    if (!live) continue;
    const double rs = rstd[r];
    const float rsf = rstd[r];
    const float coef = static_cast<float>(rs * rs * rs * sum / static_cast<double>(d));
    for (int64_t j = lane; j < d; j += kLanes) {
      const float x = load<0>(o, o.x, r * d + j), w = load<1>(o, o.w, j), dy = load<2>(o, o.dy, r * d + j);
      store<3>(o, o.y, r * d + j, rsf * (w * dy) - x * coef);
    }
  }
}

// partial[b * d + j] = sum over the rows of block b, in order, of dy (x rs) in float.
__global__ void rmsnorm_partial_kernel(Ops o, const float* rstd, int64_t rows, int64_t d, int64_t br, int64_t nblocks,
                                       float* partial) {
  FP_CUDA_GRID_STRIDE(i, nblocks * d) {
    const int64_t b = i / d, j = i - b * d, r_end = min(rows, (b + 1) * br);
    float p = 0.0f;
    for (int64_t r = b * br; r < r_end; ++r) {
      const float rsf = rstd[r];
      p += load<2>(o, o.dy, r * d + j) * (load<0>(o, o.x, r * d + j) * rsf);
    }
    partial[i] = p;
  }
}

// dw (d) += the partials in block order, in double; a bf16 dw rounded once.
__global__ void rmsnorm_dw_kernel(Ops o, int64_t d, int64_t nblocks, const float* partial) {
  FP_CUDA_GRID_STRIDE(j, d) {
    double acc = 0;
    for (int64_t b = 0; b < nblocks; ++b) acc += partial[b * d + j];
    store<4>(o, o.dw, j, load<4>(o, o.dw, j) + static_cast<float>(acc));
  }
}

unsigned bf16_bits(const char* kernel, std::initializer_list<DType> dtypes) {
  unsigned bits = 0, i = 0;
  for (const DType t : dtypes) {
    ::fp::cuda::float_check(t, kernel);
    bits |= (t == DType::DType_BF16 ? 1u : 0u) << i++;
  }
  return bits;
}

}  // namespace

int64_t rmsnorm_backward_workspace(int64_t rows, int64_t d) {
  if (rows <= 0 || d <= 0) return 0;
  const int64_t br = block_rows(rows);
  return (rows + br - 1) / br * d;
}

void rmsnorm_forward(const ExecContext& c, CBuf x, CBuf w, Buf y, float* rstd, int64_t rows, int64_t d, float eps) {
  if (rows <= 0 || d <= 0) return;
  const Ops o{x.p, w.p, nullptr, y.p, nullptr, bf16_bits("rmsnorm_forward", {x.dtype, w.dtype, y.dtype})};
  rmsnorm_forward_kernel<<<blocks_for(rows * kLanes), kThreads, 0, stream_of(c)>>>(o, rstd, rows, d, eps);
  launched("rmsnorm_forward");
}

void rmsnorm_backward(const ExecContext& c, CBuf x, CBuf w, const float* rstd, CBuf dy, Buf dx, Buf dw, int64_t rows,
                      int64_t d, float* workspace) {
  if (rows <= 0 || d <= 0) return;
  const unsigned bits = bf16_bits("rmsnorm_backward", {x.dtype, w.dtype, dy.dtype, dx.dtype, dw.dtype});
  const Ops o{x.p, w.p, dy.p, dx.p, dw.p, bits};
  const int64_t br = block_rows(rows), nblocks = (rows + br - 1) / br;
  const cudaStream_t s = stream_of(c);
  rmsnorm_dx_kernel<<<blocks_for(rows * kLanes), kThreads, 0, s>>>(o, rstd, rows, d);
  launched("rmsnorm_backward");
  rmsnorm_partial_kernel<<<blocks_for(nblocks * d), kThreads, 0, s>>>(o, rstd, rows, d, br, nblocks, workspace);
  launched("rmsnorm_backward");
  rmsnorm_dw_kernel<<<blocks_for(d), kThreads, 0, s>>>(o, d, nblocks, workspace);
  launched("rmsnorm_backward");
}

}  // namespace fp::ops::cuda
