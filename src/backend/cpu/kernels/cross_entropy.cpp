// The plain (full) vocabulary loss (ops/cross_entropy.h): log-softmax, NLL and their gradient.
// Dimensions: n tokens, V vocabulary. Target kIgnoreIndex (-100) = ignored.
//
// Threads split the rows (independent, so the bits never depend on the thread count). Bound by
// expf: V of them per row forward and again backward.
//
// Note [Why the softmax sum is taken in double]: the row sum of exp(x - m) has V terms in (0, 1]
// (V up to ~150k). In float, sequential rounding could cost up to V eps ~ 1e-2 relative in the
// worst case; pairwise or lane-split float sums fix the bound but add code. In double the sum is
// exact to well below float precision for any V, costs nothing next to the expf calls, and
// lse = m + log(sum) and x - lse are formed in double too, so logp is rounded to float once.
#include "ops/cross_entropy.h"

#include <cmath>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

namespace {

// Below this many elements (n * V) a parallel region costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 13;
constexpr int kLanes = 8;

// Targets come validated from the data loader; one out of range here is our bug. Checked before the
// parallel loops because an exception must not leave an OpenMP region.
void targets_check(const int32_t* targets, int64_t n, int64_t V) {
  for (int64_t t = 0; t < n; ++t) {
    FP_ASSERT(targets[t] == kIgnoreIndex || (targets[t] >= 0 && targets[t] < V), "target {} is {} with V = {}", t,
              targets[t], V);
  }
}

float row_max(const float* __restrict x, int64_t V) {
  float lane[kLanes];
  for (int j = 0; j < kLanes; ++j) lane[j] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  for (int j = 0; i < V; ++i, ++j) lane[j] = x[i] > lane[j] ? x[i] : lane[j];
  float m = lane[0];
  for (int j = 1; j < kLanes; ++j) m = lane[j] > m ? lane[j] : m;
  return m;
}

}  // namespace

void log_softmax_forward(const float* logits, float* logp, int64_t n, int64_t V) {
  FP_ASSERT(V >= 1, "log_softmax over V = {}", V);
#pragma omp parallel for schedule(static) if (n * V >= kParallelMinElements)
  for (int64_t t = 0; t < n; ++t) {
    const float* __restrict x = logits + t * V;  // (V)
    float* __restrict lp = logp + t * V;         // (V)
    const float m = row_max(x, V);
    // Note [Why the softmax sum is taken in double].
    double lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= V; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(std::exp(x[i + j] - m));
    for (int j = 0; i < V; ++i, ++j) lane[j] += static_cast<double>(std::exp(x[i] - m));
    const double sum = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    const double lse = static_cast<double>(m) + std::log(sum);
    for (int64_t k = 0; k < V; ++k) lp[k] = static_cast<float>(static_cast<double>(x[k]) - lse);
  }
}

void nll_forward(const float* logp, const int32_t* targets, float* loss, int64_t n, int64_t V) {
  targets_check(targets, n, V);
  for (int64_t t = 0; t < n; ++t) loss[t] = targets[t] == kIgnoreIndex ? 0.0f : -logp[t * V + targets[t]];
}

void cross_entropy_backward(const float* logp, const int32_t* targets, float scale, float* dlogits, int64_t n,
                            int64_t V) {
  targets_check(targets, n, V);
#pragma omp parallel for schedule(static) if (n * V >= kParallelMinElements)
  for (int64_t t = 0; t < n; ++t) {
    float* __restrict d = dlogits + t * V;  // (V)
    const int32_t target = targets[t];
    if (target == kIgnoreIndex) {
      // Not read: the row's logp may hold anything.
      for (int64_t i = 0; i < V; ++i) d[i] = 0.0f;
      continue;
    }
    const float* __restrict lp = logp + t * V;  // (V)
    for (int64_t i = 0; i < V; ++i) d[i] = scale * std::exp(lp[i]);
    d[target] = scale * (std::exp(lp[target]) - 1.0f);
  }
}

}  // namespace fp::ops::cpu
