// Scalar reference of RMSNorm (ops/rmsnorm.h), in T: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// Dimensions: rows independent rows of width d.
#pragma once

#include <cmath>
#include <cstdint>

namespace fp::ops::ref {

// x (rows, d), w (d) -> y (rows, d); rstd (rows) written when not null. The sum of squares is taken
// in double (as the cpu kernel does), everything else in T.
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t d, T eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;  // (d)
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * static_cast<double>(xr[i]);
    const T rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = (xr[i] * rs) * w[i];
    if (rstd != nullptr) rstd[r] = rs;
  }
}

// dx (rows, d) overwritten, dw (d) accumulated (+=), from x (rows, d), w (d), rstd (rows), dy (rows, d):
//   dx_i = rstd w_i dy_i - x_i rstd^3 / d * sum_j dy_j w_j x_j,   dw_i += sum_rows dy_i x_i rstd.
// Sums in double, rows in order.
template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;    // (d)
    const T* dyr = dy + r * d;  // (d)
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += static_cast<double>(dyr[i]) * static_cast<double>(w[i]) * xr[i];
    const double rs = rstd[r];
    const T coef = static_cast<T>(rs * rs * rs * s / static_cast<double>(d));
    for (int64_t i = 0; i < d; ++i) dx[r * d + i] = rstd[r] * (w[i] * dyr[i]) - xr[i] * coef;
  }
  for (int64_t i = 0; i < d; ++i) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(dy[r * d + i] * (x[r * d + i] * rstd[r]));
    dw[i] += static_cast<T>(acc);
  }
}

}  // namespace fp::ops::ref
