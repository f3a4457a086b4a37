// Moving routed token copies between token order and expert order.
// n tokens, k slots per token, m = n * k routed copies, H hidden.
// rows (m): for the i-th copy in expert order, the token it came from.
// slot_pos (n, k): for token t's slot j, the row of its copy in expert order (the inverse of rows).
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// xs (m, H) = x (n, H) [rows (m)].
void moe_gather(const float* x, const int32_t* rows, float* xs, int64_t m, int64_t H);
// dst[rows[i]] = src[i] for i < m: moe_gather's inverse, src (m, H) into the rows of dst (rows[i] < its
// rows). rows distinct (each row of dst has one writer); rows not named are left as they are.
void moe_scatter(const float* src, const int32_t* rows, float* dst, int64_t m, int64_t H);
// out (n, H) += sum_j w[t, j] * ys[slot_pos[t, j]]; ys (m, H), w (n, k).
void moe_combine_forward(const float* ys, const int32_t* slot_pos, const float* w, float* out, int64_t n, int64_t k,
                         int64_t H);
// From dout (n, H): dys[slot_pos[t, j]] = w[t, j] * dout[t] (every row of dys (m, H) written),
// dw[t, j] = dot(dout[t], ys[slot_pos[t, j]]) (dw (n, k) overwritten). dys may be ys: in place, each
// row's dw is taken before the row is overwritten.
void moe_combine_backward(const float* ys, const int32_t* slot_pos, const float* w, const float* dout, float* dys,
                          float* dw, int64_t n, int64_t k, int64_t H);
// dx (n, H) += sum_j dxs[slot_pos[t, j]]; dxs (m, H). Deterministic (per token, slots in order).
void moe_scatter_add(const float* dxs, const int32_t* slot_pos, float* dx, int64_t n, int64_t k, int64_t H);

}  // namespace fp::ops::cpu
