// The online log-sum-exp cross-entropy over vocabulary strips (ops/online_lse.h).
// Dimensions: rows tokens of a strip, ld its row stride, w = v1 - v0 columns (vocabulary ids [v0, v1)).
//
// Threads split the rows, and each row is reduced in one fixed order (8 lanes, combined pairwise in a
// fixed tree), so the bits never depend on the thread count. Like the full loss (cross_entropy.cpp)
// the work is bound by expf: w per row in the fold, w again in the backward; the arithmetic per
// element is the full loss's, so one range over [0, V) gives the full loss's values to the bit.
#include "ops/online_lse.h"

#include <cmath>
#include <limits>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "ops/cross_entropy.h"

namespace fp::ops::cpu {

namespace {

// Below this many elements (rows * w) a parallel region costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 13;
constexpr int kLanes = 8;

// Targets come validated from the data loader; a negative one other than -100 here is our bug (an id
// >= V cannot be seen from one range). Checked before the parallel loops: an exception must not leave
// an OpenMP region.
void targets_check(const int32_t* targets, int64_t rows) {
  for (int64_t t = 0; t < rows; ++t)
    FP_ASSERT(targets[t] == kIgnoreIndex || targets[t] >= 0, "target {} is {}", t, targets[t]);
}

void range_check(int64_t ld, int64_t v0, int64_t v1) {
  FP_ASSERT(v0 >= 0 && v1 > v0 && ld >= v1 - v0, "strip of ids [{}, {}) with row stride {}", v0, v1, ld);
}

float row_max(const float* __restrict x, int64_t w) {
  float lane[kLanes];
  for (int j = 0; j < kLanes; ++j) lane[j] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= w; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  for (int j = 0; i < w; ++i, ++j) lane[j] = x[i] > lane[j] ? x[i] : lane[j];
  float m = lane[0];
  for (int j = 1; j < kLanes; ++j) m = lane[j] > m ? lane[j] : m;
  return m;
}

// sum_j exp(x_j - m) in double (Note [Why z is a double], ops/online_lse.h).
double row_sum_exp(const float* __restrict x, int64_t w, float m) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= w; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(std::exp(x[i + j] - m));
  for (int j = 0; i < w; ++i, ++j) lane[j] += static_cast<double>(std::exp(x[i] - m));
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

}  // namespace

void online_lse_init(float* m, double* z, float* y, int64_t rows) {
  for (int64_t t = 0; t < rows; ++t) {
    m[t] = -std::numeric_limits<float>::infinity();
    z[t] = 0.0;
    y[t] = 0.0f;
  }
}

void online_lse_fold(const float* strip, int64_t ld, const int32_t* targets, int64_t rows, int64_t v0, int64_t v1,
                     float* m, double* z, float* y) {
  range_check(ld, v0, v1);
  targets_check(targets, rows);
  const int64_t w = v1 - v0;
#pragma omp parallel for schedule(static) if (rows * w >= kParallelMinElements)
  for (int64_t t = 0; t < rows; ++t) {
    const float* __restrict x = strip + t * ld;  // (w)
    const float mb = row_max(x, w);
    const float mn = m[t] > mb ? m[t] : mb;
    const double sum = row_sum_exp(x, w, mn);
    // An empty state (z = 0, m = -inf) contributes nothing; exp(-inf - -inf) would be NaN.
    const double kept = z[t] == 0.0 ? 0.0 : z[t] * std::exp(static_cast<double>(m[t]) - static_cast<double>(mn));
    z[t] = kept + sum;
    m[t] = mn;
    const int64_t target = targets[t];
    if (target >= v0 && target < v1) y[t] = x[target - v0];
  }
}

void online_lse_loss(const float* m, const double* z, const float* y, const int32_t* targets, int64_t rows,
                     double* loss_sum) {
  // Serial: n logs are nothing next to the strips' GEMMs, and the row order fixes the bits.
  double s = 0;
  for (int64_t t = 0; t < rows; ++t) {
    if (targets[t] == kIgnoreIndex) continue;
    s += (static_cast<double>(m[t]) + std::log(z[t])) - static_cast<double>(y[t]);
  }
  *loss_sum = s;
}

void online_lse_backward(float* strip, int64_t ld, const int32_t* targets, int64_t rows, int64_t v0, int64_t v1,
                         const float* m, const double* z, float scale) {
  range_check(ld, v0, v1);
  targets_check(targets, rows);
  const int64_t w = v1 - v0;
#pragma omp parallel for schedule(static) if (rows * w >= kParallelMinElements)
  for (int64_t t = 0; t < rows; ++t) {
    float* __restrict x = strip + t * ld;  // (w)
    const int64_t target = targets[t];
    if (target == kIgnoreIndex) {
      for (int64_t j = 0; j < w; ++j) x[j] = 0.0f;
      continue;
    }
    // As the full loss: logp = x - lse formed in double and rounded once, then exponentiated.
    const double lse = static_cast<double>(m[t]) + std::log(z[t]);
    const bool holds_target = target >= v0 && target < v1;
    const float x_target = holds_target ? x[target - v0] : 0.0f;  // read before the row is overwritten
    for (int64_t j = 0; j < w; ++j) x[j] = scale * std::exp(static_cast<float>(static_cast<double>(x[j]) - lse));
    if (holds_target)
      x[target - v0] = scale * (std::exp(static_cast<float>(static_cast<double>(x_target) - lse)) - 1.0f);
  }
}

}  // namespace fp::ops::cpu
