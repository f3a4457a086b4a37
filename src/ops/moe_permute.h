// Moving routed token copies between token order and expert order.
// n tokens, k slots per token, m = n * k routed copies, H hidden.
// rows (m): for the i-th copy in expert order, the token it came from.
// slot_pos (n, k): for token t's slot j, the row of its copy in expert order (the inverse of rows).
//
// Token rows (x, xs, src, dst, ys, out, dout, dys, dxs, dx) are activations, f32 or bf16 each on its
// own (Note [Kernel operands carry their dtype] in core/buf.h); the routing weights w and dw are the
// router's, f32 in every recipe, and stay float*. Arithmetic is f32 whatever the storage: a bf16 row
// is widened (exact), and a bf16 result is rounded to nearest even once per element per call, so a
// kernel with bf16 operands gives the bits of its f32 self run on the widened operands, then rounded.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// xs (m, H) = x (n, H) [rows (m)]. A copy: bit for bit when x and xs share a dtype, else each element
// converted (widened exactly, or rounded to nearest even).
using moe_gather_fn = void(CBuf x, const int32_t* rows, Buf xs, int64_t m, int64_t H);

// dst[rows[i]] = src[i] for i < m: moe_gather's inverse, src (m, H) into the rows of dst (rows[i] < its
// rows). rows distinct (each row of dst has one writer); rows not named are left as they are. A copy
// (or a conversion) as moe_gather.
using moe_scatter_fn = void(CBuf src, const int32_t* rows, Buf dst, int64_t m, int64_t H);

// out (n, H) += sum_j w[t, j] * ys[slot_pos[t, j]]; ys (m, H), w (n, k) f32. Each element of out is
// summed in f32, starting from its widened value and adding the slots in order, and rounded once
// (a bf16 out): round(((out + w_0 y_0) + w_1 y_1) + ...).
using moe_combine_forward_fn = void(CBuf ys, const int32_t* slot_pos, const float* w, Buf out, int64_t n, int64_t k,
                                    int64_t H);

// From dout (n, H): dys[slot_pos[t, j]] = w[t, j] * dout[t] (every row of dys (m, H) written, the f32
// product rounded once when dys is bf16), dw[t, j] = dot(dout[t], ys[slot_pos[t, j]]) (dw (n, k) f32,
// overwritten; an f32 dot product over H of the widened values). dys may be ys (same pointer and
// dtype): in place, each row's dw is taken before the row is overwritten.
using moe_combine_backward_fn = void(CBuf ys, const int32_t* slot_pos, const float* w, CBuf dout, Buf dys, float* dw,
                                     int64_t n, int64_t k, int64_t H);

// dx (n, H) += sum_j dxs[slot_pos[t, j]]; dxs (m, H). Deterministic (per token, slots in order). Each
// element is accumulated in f32 registers, from its widened value through the k slots in order, and
// rounded once (a bf16 dx): dx = round(((dx + g_0) + g_1) + ...), never k roundings to bf16.
using moe_scatter_add_fn = void(CBuf dxs, const int32_t* slot_pos, Buf dx, int64_t n, int64_t k, int64_t H);

}  // namespace fp::ops
