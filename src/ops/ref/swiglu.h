// Scalar reference of the SwiGLU activation (ops/swiglu.h), in T: a = silu(g) * u,
// silu(g) = g sigmoid(g). Dimensions: n elements.
#pragma once

#include <algorithm>
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

// The clamped SwiGLU (Note [The clamped SwiGLU] in ops/swiglu.h): a = (u_c + 1) g_c sigmoid(alpha g_c),
// g_c = min(g, limit), u_c = clamp(u, -limit, limit).
template <class T>
void swiglu_clamped_forward(const T* g, const T* u, T* a, int64_t n, T alpha, T limit) {
  for (int64_t i = 0; i < n; ++i) {
    const T gc = std::min(g[i], limit), uc = std::max(-limit, std::min(u[i], limit));
    T s, sc;
    sigmoid_pair(alpha * gc, s, sc);
    a[i] = (uc + T(1)) * (gc * s);
  }
}

// da (n) -> dg, du (n): du = da g_c s where -limit <= u <= limit, else 0; dg = da (u_c + 1) s (1 + alpha g_c
// (1 - s)) where g <= limit, else 0 (s = sigmoid(alpha g_c)).
template <class T>
void swiglu_clamped_backward(const T* g, const T* u, const T* da, T* dg, T* du, int64_t n, T alpha, T limit) {
  for (int64_t i = 0; i < n; ++i) {
    const T gc = std::min(g[i], limit), uc = std::max(-limit, std::min(u[i], limit));
    T s, sc;
    sigmoid_pair(alpha * gc, s, sc);
    du[i] = u[i] >= -limit && u[i] <= limit ? da[i] * (gc * s) : T(0);
    dg[i] = g[i] <= limit ? (da[i] * (uc + T(1))) * (s * (T(1) + alpha * gc * sc)) : T(0);
  }
}

}  // namespace fp::ops::ref
