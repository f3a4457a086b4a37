// Scalar reference of the element-wise kernels and reductions (ops/elementwise.h), in T.
// Dimensions: n elements.
#pragma once

#include <cstdint>

namespace fp::ops::ref {

// y (n) += x (n)
template <class T>
void add_inplace(T* y, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// y (n) *= a
template <class T>
void scale_inplace(T* y, T a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

// y (n) = v
template <class T>
void fill(T* y, T v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = v;
}

// dst (n) = src (n)
template <class T>
void copy(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// out (1) = sum of x (n), one double accumulator in index order.
template <class T>
void reduce_sum(const T* x, int64_t n, T* out) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
  *out = static_cast<T>(s);
}

// out (1) = sum of x (n)^2, one double accumulator in index order.
template <class T>
void reduce_sumsq(const T* x, int64_t n, T* out) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  *out = static_cast<T>(s);
}

}  // namespace fp::ops::ref
