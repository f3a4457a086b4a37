// Scalar reference of the AdamW update (ops/adamw.h), one element at a time, in T.
// Dimensions: n elements.
#pragma once

#include <cmath>
#include <cstdint>

namespace fp::ops::ref {

// param, m, v (n) updated; grad (n). Same formula as ops::cpu::adamw_update, its AdamWHyper spelled out in T.
template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, T lr, T beta1, T beta2, T eps, T weight_decay,
                  T grad_scale, int64_t step) {
  const T bc1 = static_cast<T>(1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step)));
  const T bc2 = static_cast<T>(1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * grad_scale;
    param[i] *= T(1) - lr * weight_decay;
    m[i] = beta1 * m[i] + (T(1) - beta1) * g;
    v[i] = beta2 * v[i] + (T(1) - beta2) * g * g;
    const T denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
    param[i] -= (lr / bc1) * m[i] / denom;
  }
}

}  // namespace fp::ops::ref
