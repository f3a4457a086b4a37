// Routed token copies between token order and expert order (ops/moe_permute.h) on cuda.
// n tokens, k slots per token, m = n * k routed copies, H hidden.
// rows (m): token of each copy in expert order; slot_pos (n, k): row of token t's slot j.
//
// Each output element has one owner thread, as on the cpu (the side whose rows are written is walked), so
// there are no atomics, and each element goes through the cpu's float operations in the cpu's order: the
// slots of a token in j order, one multiply and one add each, never fused (-fmad=false), widened on load
// and rounded once: the cpu's bits (Note [Bits as the cpu's] in common.cuh). dw's dot product replays the
// cpu's dot_lanes8 (backend/cpu/kernels/moe_permute.cpp): lane l of 8 sums h = l, l + 8, ... below the last
// multiple of 8, the tail is summed in order apart, and the lanes meet in the cpu's tree; here the 8 lanes
// are 8 consecutive threads, joined by shuffles. Its bits are the cpu's too.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

// dst[dr(i) * H + h] = src[sr(i) * H + h] converted, for i < m: kGather reads rows[i], else writes there.
template <bool kGather, class S, class D>
__global__ void permute_kernel(const S* src, const int32_t* rows, D* dst, int64_t m, int64_t H) {
  FP_CUDA_GRID_STRIDE(e, m * H) {
    const int64_t i = e / H, h = e - i * H, r = rows[i];
    if (kGather)
      dst[i * H + h] = st<D>(ld(src[r * H + h]));
    else
      dst[r * H + h] = st<D>(ld(src[i * H + h]));
  }
}

template <class Y, class O>
__global__ void combine_forward_kernel(const Y* ys, const int32_t* slot_pos, const float* w, O* out, int64_t n,
                                       int64_t k, int64_t H) {
  FP_CUDA_GRID_STRIDE(e, n * H) {
    const int64_t t = e / H, h = e - t * H;
    float o = ld(out[e]);
    for (int64_t j = 0; j < k; ++j) o += w[t * k + j] * ld(ys[int64_t{slot_pos[t * k + j]} * H + h]);
    out[e] = st<O>(o);
  }
}

template <class G, class O>
__global__ void scatter_add_kernel(const G* dxs, const int32_t* slot_pos, O* dx, int64_t n, int64_t k, int64_t H) {
  FP_CUDA_GRID_STRIDE(e, n * H) {
    const int64_t t = e / H, h = e - t * H;
    float o = ld(dx[e]);
    for (int64_t j = 0; j < k; ++j) o += ld(dxs[int64_t{slot_pos[t * k + j]} * H + h]);
    dx[e] = st<O>(o);
  }
}

// One group of 8 threads per copy (t, j): dw by the cpu's dot_lanes8, then dys's row. All 32 lanes of a warp
// run the same iterations (items rounded up to the warp) so that the shuffles see them all.
template <class Y, class D, class S>
__global__ void combine_backward_kernel(const Y* ys, const int32_t* slot_pos, const float* w, const D* dout, S* dys,
                                        float* dw, int64_t n, int64_t k, int64_t H) {
  const int64_t items = n * k * 8, rounded = (items + 31) / 32 * 32, H8 = H / 8 * 8;
  const int lane = static_cast<int>(threadIdx.x % 8), group = static_cast<int>(threadIdx.x % 32) - lane;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rounded; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t tj = i / 8, t = tj / k;
    const bool live = i < items;
    const int64_t r = live ? slot_pos[tj] : 0;
    const D* d = dout + t * H;  // (H)
    const Y* y = ys + r * H;    // (H)
    float acc = 0.0f, tail = 0.0f;
    if (live) {
      for (int64_t h = lane; h < H8; h += 8) acc += ld(d[h]) * ld(y[h]);
      if (lane == 0)
        for (int64_t h = H8; h < H; ++h) tail += ld(d[h]) * ld(y[h]);
    }
    float a[8];
    for (int l = 0; l < 8; ++l) a[l] = __shfl_sync(0xffffffffu, acc, group + l);
    if (live) {
      if (lane == 0) dw[tj] = (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) + tail;
      // Every lane has read its part of the row (the shuffle waited for all 8): dys may be ys.
      const float wj = w[tj];
      for (int64_t h = lane; h < H; h += 8) dys[r * H + h] = st<S>(wj * ld(d[h]));
    }
  }
}

template <bool kGather>
void permute(const ExecContext& c, const char* kernel, CBuf src, const int32_t* rows, Buf dst, int64_t m, int64_t H) {
  if (m * H <= 0) return;
  visit_float2(src.dtype, dst.dtype, kernel, [&]<class S, class D>() {
    permute_kernel<kGather><<<blocks_for(m * H), kThreads, 0, stream_of(c)>>>(static_cast<const S*>(src.p), rows,
                                                                              static_cast<D*>(dst.p), m, H);
  });
  launched(kernel);
}

}  // namespace

void moe_gather(const ExecContext& c, CBuf x, const int32_t* rows, Buf xs, int64_t m, int64_t H) {
  permute<true>(c, "moe_gather", x, rows, xs, m, H);
}

void moe_scatter(const ExecContext& c, CBuf src, const int32_t* rows, Buf dst, int64_t m, int64_t H) {
  permute<false>(c, "moe_scatter", src, rows, dst, m, H);
}

void moe_combine_forward(const ExecContext& c, CBuf ys, const int32_t* slot_pos, const float* w, Buf out, int64_t n,
                         int64_t k, int64_t H) {
  if (n * H <= 0) return;
  visit_float2(ys.dtype, out.dtype, "moe_combine_forward", [&]<class Y, class O>() {
    combine_forward_kernel<<<blocks_for(n * H), kThreads, 0, stream_of(c)>>>(static_cast<const Y*>(ys.p), slot_pos, w,
                                                                             static_cast<O*>(out.p), n, k, H);
  });
  launched("moe_combine_forward");
}

void moe_combine_backward(const ExecContext& c, CBuf ys, const int32_t* slot_pos, const float* w, CBuf dout, Buf dys,
                          float* dw, int64_t n, int64_t k, int64_t H) {
  if (n * k <= 0) return;
  ::fp::cuda::float_check(dys.dtype, "moe_combine_backward");
  visit_float2(ys.dtype, dout.dtype, "moe_combine_backward", [&]<class Y, class D>() {
    visit_float(dys.dtype, "moe_combine_backward", [&]<class S>() {
      combine_backward_kernel<<<blocks_for(n * k * 8), kThreads, 0, stream_of(c)>>>(
          static_cast<const Y*>(ys.p), slot_pos, w, static_cast<const D*>(dout.p), static_cast<S*>(dys.p), dw, n, k, H);
    });
  });
  launched("moe_combine_backward");
}

void moe_scatter_add(const ExecContext& c, CBuf dxs, const int32_t* slot_pos, Buf dx, int64_t n, int64_t k, int64_t H) {
  if (n * H <= 0) return;
  visit_float2(dxs.dtype, dx.dtype, "moe_scatter_add", [&]<class G, class O>() {
    scatter_add_kernel<<<blocks_for(n * H), kThreads, 0, stream_of(c)>>>(static_cast<const G*>(dxs.p), slot_pos,
                                                                         static_cast<O*>(dx.p), n, k, H);
  });
  launched("moe_scatter_add");
}

}  // namespace fp::ops::cuda
