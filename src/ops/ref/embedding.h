// Scalar reference of the token embedding (ops/embedding.h), in T.
// Dimensions: n tokens, H hidden, V vocabulary (the table's rows).
#pragma once

#include <cstdint>

namespace fp::ops::ref {

// out (n, H) = table (V, H) [tokens (n)]
template <class T>
void embedding_forward(const int32_t* tokens, const T* table, T* out, int64_t n, int64_t H) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) out[t * H + h] = table[static_cast<int64_t>(tokens[t]) * H + h];
}

// dtable (V, H) += scatter of dout (n, H) by tokens (n), tokens in order.
template <class T>
void embedding_backward(const int32_t* tokens, const T* dout, T* dtable, int64_t n, int64_t H) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) dtable[static_cast<int64_t>(tokens[t]) * H + h] += dout[t * H + h];
}

}  // namespace fp::ops::ref
