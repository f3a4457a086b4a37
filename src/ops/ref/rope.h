// Scalar reference of the rotary position embedding (ops/rope.h), rotate-half layout, in T.
// Dimensions: n tokens, heads heads, hd head_dim (even).
#pragma once

#include <cmath>
#include <cstdint>

namespace fp::ops::ref {

// The rotation of pair i at position pos: the angle pos * inv_freq[i] in double, then scale * cos and
// scale * sin rounded to T.
template <class T>
void rope_angle(int32_t pos, int64_t i, const double* inv_freq, double scale, T& c, T& s) {
  const double a = static_cast<double>(pos) * inv_freq[i];
  c = static_cast<T>(scale * std::cos(a));
  s = static_cast<T>(scale * std::sin(a));
}

// x (n, heads, hd) rotated in place by pos (n); inv_freq (hd/2).
template <class T>
void rope_forward(T* x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, const double* inv_freq,
                  double scale = 1.0) {
  const int64_t half = hd / 2;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + (t * heads + h) * hd;  // (hd)
      for (int64_t i = 0; i < half; ++i) {
        T c, s;
        rope_angle<T>(pos[t], i, inv_freq, scale, c, s);
        const T x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

// dx (n, heads, hd) in place: the transpose rotation, dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s.
template <class T>
void rope_backward(T* dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, const double* inv_freq,
                   double scale = 1.0) {
  const int64_t half = hd / 2;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      T* v = dx + (t * heads + h) * hd;  // (hd)
      for (int64_t i = 0; i < half; ++i) {
        T c, s;
        rope_angle<T>(pos[t], i, inv_freq, scale, c, s);
        const T g1 = v[i], g2 = v[i + half];
        v[i] = g1 * c + g2 * s;
        v[i + half] = g2 * c - g1 * s;
      }
    }
  }
}

}  // namespace fp::ops::ref
