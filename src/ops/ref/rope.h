// Scalar reference of the rotary position embedding (ops/rope.h), rotate-half layout, in T.
// Dimensions: n tokens, heads heads, hd head_dim (even).
#pragma once

#include <cmath>
#include <cstdint>

namespace fp::ops::ref {

// The rotation of pair i at position pos: inv_freq = theta^(-2i/hd) and the angle in double, then
// cos and sin rounded to T.
template <class T>
void rope_angle(int32_t pos, int64_t i, int64_t hd, double theta, T& c, T& s) {
  const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
  const double a = static_cast<double>(pos) * inv_freq;
  c = static_cast<T>(std::cos(a));
  s = static_cast<T>(std::sin(a));
}

// x (n, heads, hd) rotated in place by pos (n).
template <class T>
void rope_forward(T* x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, T theta) {
  const int64_t half = hd / 2;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + (t * heads + h) * hd;  // (hd)
      for (int64_t i = 0; i < half; ++i) {
        T c, s;
        rope_angle<T>(pos[t], i, hd, static_cast<double>(theta), c, s);
        const T x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

// dx (n, heads, hd) in place: the transpose rotation, dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s.
template <class T>
void rope_backward(T* dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, T theta) {
  const int64_t half = hd / 2;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      T* v = dx + (t * heads + h) * hd;  // (hd)
      for (int64_t i = 0; i < half; ++i) {
        T c, s;
        rope_angle<T>(pos[t], i, hd, static_cast<double>(theta), c, s);
        const T g1 = v[i], g2 = v[i + half];
        v[i] = g1 * c + g2 * s;
        v[i + half] = g2 * c - g1 * s;
      }
    }
  }
}

}  // namespace fp::ops::ref
