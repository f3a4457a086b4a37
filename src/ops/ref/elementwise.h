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

// y (rows, d) += b (d) on every row.
template <class T>
void bias_add(T* y, const T* b, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j) y[r * d + j] += b[j];
}

// db (d) += column sums of dy (rows, d), one double accumulator per column in row order.
template <class T>
void bias_backward(const T* dy, T* db, int64_t rows, int64_t d) {
  for (int64_t j = 0; j < d; ++j) {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += static_cast<double>(dy[r * d + j]);
    db[j] = static_cast<T>(static_cast<double>(db[j]) + s);
  }
}

// out (d) += column sums of x (rows, d), one double accumulator per column in row order.
template <class T>
void column_sums_f64(const T* x, int64_t rows, int64_t d, double* out) {
  for (int64_t j = 0; j < d; ++j) {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += static_cast<double>(x[r * d + j]);
    out[j] += s;
  }
}

}  // namespace fp::ops::ref
