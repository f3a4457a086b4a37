// Scalar reference of the SwiGLU activation (ops/swiglu.h), in T: a = silu(g) * u,
// silu(g) = g sigmoid(g). Dimensions: n elements.
#pragma once

#include <cmath>
#include <cstdint>

namespace fp::ops::ref {

// sigmoid(g) and 1 - sigmoid(g), each from exp(-|g|) <= 1 so that nothing overflows and neither
// loses digits to a subtraction from 1.
template <class T>
void sigmoid_pair(T g, T& s, T& one_minus_s) {
  const T e = std::exp(-std::abs(g));
  const T inv = T(1) / (T(1) + e);
  s = g >= T(0) ? inv : e * inv;
  one_minus_s = g >= T(0) ? e * inv : inv;
}

// g, u (n) -> a (n)
template <class T>
void swiglu_forward(const T* g, const T* u, T* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T s, sc;
    sigmoid_pair(g[i], s, sc);
    a[i] = (g[i] * s) * u[i];
  }
}

// da (n) -> dg, du (n): du = da silu(g), dg = da u silu'(g), silu'(g) = s (1 + g (1 - s)).
template <class T>
void swiglu_backward(const T* g, const T* u, const T* da, T* dg, T* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T s, sc;
    sigmoid_pair(g[i], s, sc);
    du[i] = da[i] * (g[i] * s);
    dg[i] = (da[i] * u[i]) * (s * (T(1) + g[i] * sc));
  }
}

}  // namespace fp::ops::ref
