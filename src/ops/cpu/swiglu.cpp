// SwiGLU activation (ops/swiglu.h): a = silu(g) * u, silu(g) = g sigmoid(g). Dimensions: n elements.
//
// Note [Stable sigmoid]: sigmoid and 1 - sigmoid are both formed from e = exp(-|g|) in (0, 1]:
// for g >= 0, s = 1 / (1 + e) and 1 - s = e / (1 + e); for g < 0 the two swap. exp never overflows
// (g = -100 would give exp(100) = inf in float with the textbook 1 / (1 + exp(-g))), and 1 - s is
// never a cancelling subtraction, so silu'(g) = s (1 + g (1 - s)) stays accurate for large |g|.
//
// Bound by expf (glibc's scalar expf: g++ vectorises no libm call without -ffast-math); threads take
// fixed contiguous ranges. Element-wise, so the bits never depend on the thread count.
#include "ops/swiglu.h"

#include <cmath>

namespace fp::ops::cpu {

namespace {

// Below this many elements a parallel region costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 13;

inline void sigmoid_pair(float g, float& s, float& one_minus_s) {
  const float e = std::exp(-std::abs(g));
  const float inv = 1.0f / (1.0f + e);
  s = g >= 0.0f ? inv : e * inv;
  one_minus_s = g >= 0.0f ? e * inv : inv;
}

}  // namespace

void swiglu_forward(const float* __restrict g, const float* __restrict u, float* __restrict a, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    float s, sc;
    sigmoid_pair(g[i], s, sc);
    a[i] = (g[i] * s) * u[i];
  }
}

void swiglu_backward(const float* __restrict g, const float* __restrict u, const float* __restrict da,
                     float* __restrict dg, float* __restrict du, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    float s, sc;
    sigmoid_pair(g[i], s, sc);
    du[i] = da[i] * (g[i] * s);
    dg[i] = (da[i] * u[i]) * (s * (1.0f + g[i] * sc));
  }
}

}  // namespace fp::ops::cpu
