// Scalar reference of the token permutation ops (the oracle for backend/cpu/kernels/moe_permute.cpp): routed
// token copies between token order and expert order.
// n tokens, k slots per token, m = n * k routed copies, H hidden.
// rows (m): for the i-th copy in expert order, the token it came from.
// slot_pos (n, k): for token t's slot j, the row of its copy in expert order (the inverse of rows).
#pragma once

#include <cstdint>

namespace fp::ops::ref {

// xs (m, H) = x (n, H) [rows (m)].
template <class T>
void moe_gather(const T* x, const int32_t* rows, T* xs, int64_t m, int64_t H) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t h = 0; h < H; ++h) xs[i * H + h] = x[static_cast<int64_t>(rows[i]) * H + h];
}

// dst[rows[i]] = src[i] for i < m; src (m, H), rows distinct.
template <class T>
void moe_scatter(const T* src, const int32_t* rows, T* dst, int64_t m, int64_t H) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t h = 0; h < H; ++h) dst[static_cast<int64_t>(rows[i]) * H + h] = src[i * H + h];
}

// out (n, H) += sum_j w[t, j] * ys[slot_pos[t, j]], added into out one slot at a time, in slot order.
// ys (m, H), w (n, k).
template <class T>
void moe_combine_forward(const T* ys, const int32_t* slot_pos, const T* w, T* out, int64_t n, int64_t k,
                         int64_t H) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const T* y = ys + static_cast<int64_t>(slot_pos[t * k + j]) * H;  // (H)
      for (int64_t h = 0; h < H; ++h) out[t * H + h] += w[t * k + j] * y[h];
    }
}

// From dout (n, H): dys (m, H), every row written: dys[slot_pos[t, j]] = w[t, j] * dout[t];
// dw (n, k), overwritten: dw[t, j] = dot(dout[t], ys[slot_pos[t, j]]). The dot accumulates in double
// so that ref<float> is within one rounding of the exact value and the fast kernel's error alone
// sets the test's tolerance.
template <class T>
void moe_combine_backward(const T* ys, const int32_t* slot_pos, const T* w, const T* dout, T* dys, T* dw,
                          int64_t n, int64_t k, int64_t H) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slot_pos[t * k + j];
      double dot = 0;
      for (int64_t h = 0; h < H; ++h) {
        dys[r * H + h] = w[t * k + j] * dout[t * H + h];
        dot += static_cast<double>(dout[t * H + h]) * static_cast<double>(ys[r * H + h]);
      }
      dw[t * k + j] = static_cast<T>(dot);
    }
}

// dx (n, H) += sum_j dxs[slot_pos[t, j]], added one slot at a time, in slot order; dxs (m, H).
template <class T>
void moe_scatter_add(const T* dxs, const int32_t* slot_pos, T* dx, int64_t n, int64_t k, int64_t H) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const T* g = dxs + static_cast<int64_t>(slot_pos[t * k + j]) * H;  // (H)
      for (int64_t h = 0; h < H; ++h) dx[t * H + h] += g[h];
    }
}

}  // namespace fp::ops::ref
