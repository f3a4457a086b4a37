// Grouped GEMMs: the experts of an MoE block in one call. Rows grouped by expert, G groups; group g owns
// rows [offsets[g], offsets[g + 1]) (n_g of them) of the row-grouped operands, r = offsets[G] rows in all.
//
// Note [The experts in one call]: an MoE block computes every expert it holds on the rows routed to it,
// so the model once looped over the experts on the host, two GEMM and two bias launches per expert and
// projection. On a GPU that is a launch per expert; these entries take the whole block instead (ggml's
// mul_mat_id, cuBLAS's grouped GEMM, CUTLASS's grouped kernels) and a backend computes the groups as it
// likes: the cpu backend loops inside its kernel, calling its own GEMM per group, so its bits are those
// of the loop it replaced.
//   - The row offsets (G + 1, offsets[0] = 0) are host memory, read when the call is made: every caller
//     already has them there, because the dispatch buffers the rows arrive in are sized by the same counts
//     (the one inherent host sync of an MoE layer, docs/design.md "Host syncs of one step"). A backend
//     that wants them on its device uploads them with the launch (an asynchronous copy, no sync), as
//     cuBLAS's grouped GEMM takes its problem sizes from the host.
//   - The per-group operands (B, bias, C, db) are tables of G device operands in host memory, each with
//     its own dtype: experts' weights are separate parameters (or rows of a received buffer, LLEP), not
//     one strided tensor. Entries of empty groups are never read (they may be null).
//   - Both tables must stay alive until the stream has passed the call, as the device operands do.
//   - Groups are computed as if one after another in g order, each by the op's plain GEMM (ops/gemm.h)
//     and bias kernels (ops/elementwise.h); within a backend, a call has the bits of that loop. Two
//     groups may accumulate into the same C or db (their sums then follow g order).
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// Per group g with n_g > 0:
//   C[rows_g] (n_g, N) = alpha * A[rows_g] (n_g, K) * op(B[g]) (K, N) + beta * C[rows_g]
//   then, when bias is not null and bias[g] is not null, C[rows_g] += bias[g] (N) on every row.
// A (r, K) and C (r, N) are dense row-major; B[g] is stored (N, K) when trans_b (a linear layer's
// forward, nn.Linear's weight), else (K, N) (its backward to the input). beta == 0 does not read C.
// The GEMM is ops/gemm.h's (f32 products and sums in the backend's order), the bias ops/elementwise.h's
// bias_add, so each group holds bit for bit what gemm then bias_add give on its rows.
using gemm_grouped_fn = void(bool trans_b, int64_t G, const int64_t* offsets, int64_t N, int64_t K, float alpha, CBuf A,
                             const CBuf* B, const CBuf* bias, float beta, Buf C);

// A linear layer's weight gradients, group by group. Per group g with n_g > 0:
//   C[g] (M, N) = alpha * A[rows_g]^T (M, n_g) * B[rows_g] (n_g, N) + beta * C[g]
//   then, when db is not null and db[g] is not null, db[g] (M) += the column sums of A[rows_g] (bias_backward).
// A (r, M) and B (r, N) are dense row-major (A the output gradient, B the layer's input); C[g] dense.
// The bits are those of gemm (trans_a) then bias_backward on the group's rows.
using gemm_grouped_weight_fn = void(int64_t G, const int64_t* offsets, int64_t M, int64_t N, float alpha, CBuf A,
                                    CBuf B, float beta, const Buf* C, const Buf* db);

}  // namespace fp::ops
