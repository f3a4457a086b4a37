// Scalar reference of the online log-sum-exp cross-entropy (ops/online_lse.h), logits in T.
// Dimensions: rows tokens of a strip, ld its row stride, [v0, v1) the vocabulary ids of its columns.
// State: m (rows) T running max, z (rows) double running sum, y (rows) T target logit.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/cross_entropy.h"

namespace fp::ops::ref {

template <class T>
void online_lse_init(T* m, double* z, T* y, int64_t rows) {
  for (int64_t t = 0; t < rows; ++t) {
    m[t] = -std::numeric_limits<T>::infinity();
    z[t] = 0.0;
    y[t] = T(0);
  }
}

// m' = max(m, max_j x_j); z' = z exp(m - m') + sum_j exp(x_j - m') (exponentials in T, sums in
// double); y = x[target - v0] when v0 <= target < v1.
template <class T>
void online_lse_fold(const T* strip, int64_t ld, const int32_t* targets, int64_t rows, int64_t v0, int64_t v1, T* m,
                     double* z, T* y) {
  const int64_t w = v1 - v0;
  for (int64_t t = 0; t < rows; ++t) {
    const T* x = strip + t * ld;  // (w)
    T mb = x[0];
    for (int64_t j = 1; j < w; ++j) mb = x[j] > mb ? x[j] : mb;
    const T mn = m[t] > mb ? m[t] : mb;
    double sum = 0;
    for (int64_t j = 0; j < w; ++j) sum += static_cast<double>(std::exp(x[j] - mn));
    // An empty state (z = 0, m = -inf) contributes nothing; exp(-inf - -inf) would be NaN.
    const double kept = z[t] == 0.0 ? 0.0 : z[t] * std::exp(static_cast<double>(m[t]) - static_cast<double>(mn));
    z[t] = kept + sum;
    m[t] = mn;
    if (targets[t] >= v0 && targets[t] < v1) y[t] = x[targets[t] - v0];
  }
}

template <class T>
void online_lse_loss(const T* m, const double* z, const T* y, const int32_t* targets, int64_t rows,
                     double* loss_sum) {
  double s = 0;
  for (int64_t t = 0; t < rows; ++t) {
    if (targets[t] == kIgnoreIndex) continue;
    s += (static_cast<double>(m[t]) + std::log(z[t])) - static_cast<double>(y[t]);
  }
  *loss_sum = s;
}

// x_j -> scale (exp(x_j - lse) - onehot), the difference x_j - lse in double rounded once to T, as
// the full loss forms logp.
template <class T>
void online_lse_backward(T* strip, int64_t ld, const int32_t* targets, int64_t rows, int64_t v0, int64_t v1,
                         const T* m, const double* z, T scale) {
  const int64_t w = v1 - v0;
  for (int64_t t = 0; t < rows; ++t) {
    T* x = strip + t * ld;  // (w)
    if (targets[t] == kIgnoreIndex) {
      for (int64_t j = 0; j < w; ++j) x[j] = T(0);
      continue;
    }
    const double lse = static_cast<double>(m[t]) + std::log(z[t]);
    for (int64_t j = 0; j < w; ++j) {
      const T lp = static_cast<T>(static_cast<double>(x[j]) - lse);
      x[j] = scale * (std::exp(lp) - (v0 + j == targets[t] ? T(1) : T(0)));
    }
  }
}

}  // namespace fp::ops::ref
