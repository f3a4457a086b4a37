// Token permutation kernels: routed copies between token order and expert order.
// n tokens, k slots per token, m = n * k routed copies, H hidden.
// rows (m): token of each copy in expert order; slot_pos (n, k): row of token t's slot j.
//
// Every kernel walks the side whose rows it writes (copies for the gather and the scatter, tokens for
// the rest), so each output row has one owner thread: no atomics, and the per-row arithmetic is
// fixed, so any thread count gives the same bits. The inner loops run over H and vectorise.
#include "ops/moe_permute.h"

#include <cstring>

namespace fp::ops::cpu {

namespace {
// Below this many elements the OpenMP fork costs more than the work.
constexpr int64_t kParallelMin = 1 << 15;

// dot(a (H), b (H)) with 8 partial sums: a plain float reduction does not vectorise without
// -ffast-math (it would reorder the sum), so the reorder is written out, fixed, and the partials are
// combined in a fixed tree. Error <= H eps sum|a b|, like the sequential sum.
inline float dot_lanes8(const float* a, const float* b, int64_t H) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t h = 0;
  for (; h + 8 <= H; h += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[h + l] * b[h + l];
  float tail = 0;
  for (; h < H; ++h) tail += a[h] * b[h];
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}
}  // namespace

void moe_gather(const float* x, const int32_t* rows, float* xs, int64_t m, int64_t H) {
#pragma omp parallel for schedule(static) if (m * H >= kParallelMin)
  for (int64_t i = 0; i < m; ++i)
    std::memcpy(xs + i * H, x + static_cast<int64_t>(rows[i]) * H, static_cast<size_t>(H) * sizeof(float));
}

void moe_scatter(const float* src, const int32_t* rows, float* dst, int64_t m, int64_t H) {
#pragma omp parallel for schedule(static) if (m * H >= kParallelMin)
  for (int64_t i = 0; i < m; ++i)
    std::memcpy(dst + static_cast<int64_t>(rows[i]) * H, src + i * H, static_cast<size_t>(H) * sizeof(float));
}

void moe_combine_forward(const float* ys, const int32_t* slot_pos, const float* w, float* out, int64_t n, int64_t k,
                         int64_t H) {
#pragma omp parallel for schedule(static) if (n * k * H >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    float* __restrict o = out + t * H;  // (H)
    for (int64_t j = 0; j < k; ++j) {
      const float* __restrict y = ys + static_cast<int64_t>(slot_pos[t * k + j]) * H;  // (H)
      const float wj = w[t * k + j];
      for (int64_t h = 0; h < H; ++h) o[h] += wj * y[h];
    }
  }
}

void moe_combine_backward(const float* ys, const int32_t* slot_pos, const float* w, const float* dout, float* dys,
                          float* dw, int64_t n, int64_t k, int64_t H) {
#pragma omp parallel for schedule(static) if (n * k * H >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* __restrict d = dout + t * H;  // (H)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slot_pos[t * k + j];
      // dys may be ys (in place): the row is read for dw before it is overwritten; rows are distinct.
      dw[t * k + j] = dot_lanes8(d, ys + r * H, H);
      float* dy = dys + r * H;  // (H)
      const float wj = w[t * k + j];
      for (int64_t h = 0; h < H; ++h) dy[h] = wj * d[h];
    }
  }
}

void moe_scatter_add(const float* dxs, const int32_t* slot_pos, float* dx, int64_t n, int64_t k, int64_t H) {
#pragma omp parallel for schedule(static) if (n * k * H >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    float* __restrict o = dx + t * H;  // (H)
    for (int64_t j = 0; j < k; ++j) {
      const float* __restrict g = dxs + static_cast<int64_t>(slot_pos[t * k + j]) * H;  // (H)
      for (int64_t h = 0; h < H; ++h) o[h] += g[h];
    }
  }
}

}  // namespace fp::ops::cpu
