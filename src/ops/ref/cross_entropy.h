// Scalar reference of the full-vocabulary loss (ops/cross_entropy.h), in T.
// Dimensions: n tokens, V vocabulary. Target kIgnoreIndex (-100) = ignored.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/cross_entropy.h"

namespace fp::ops::ref {

// logits (n, V) -> logp (n, V): logp = x - (m + log sum exp(x - m)), m the row max; the sum and the
// subtraction in double, the exponentials in T.
template <class T>
void log_softmax_forward(const T* logits, T* logp, int64_t n, int64_t V) {
  for (int64_t t = 0; t < n; ++t) {
    const T* x = logits + t * V;  // (V)
    T m = x[0];
    for (int64_t i = 1; i < V; ++i) m = x[i] > m ? x[i] : m;
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += static_cast<double>(std::exp(x[i] - m));
    const double lse = static_cast<double>(m) + std::log(sum);
    for (int64_t i = 0; i < V; ++i) logp[t * V + i] = static_cast<T>(static_cast<double>(x[i]) - lse);
  }
}

// loss (n) = -logp[t, targets[t]] (targets (n)), 0 where ignored.
template <class T>
void nll_forward(const T* logp, const int32_t* targets, T* loss, int64_t n, int64_t V) {
  for (int64_t t = 0; t < n; ++t)
    loss[t] = targets[t] == kIgnoreIndex ? T(0) : -logp[t * V + targets[t]];
}

// dlogits (n, V) = scale * (exp(logp) - onehot(target)); rows of ignored targets 0.
template <class T>
void cross_entropy_backward(const T* logp, const int32_t* targets, T scale, T* dlogits, int64_t n, int64_t V) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < V; ++i) {
      T& d = dlogits[t * V + i];
      if (targets[t] == kIgnoreIndex) {
        d = T(0);
      } else {
        d = scale * (std::exp(logp[t * V + i]) - (i == targets[t] ? T(1) : T(0)));
      }
    }
  }
}

}  // namespace fp::ops::ref
