// GEMM over a fixed grid of output tiles: the same product as ops/gemm.h, with bits that do not depend
// on the thread count. Dimensions: M rows of C, N columns of C, K the reduction.
//
// Note [Why a tiled GEMM]: Ring-DTP promises results bitwise equal across thread counts (and across
// the ring's sizes), which a library GEMM does not give: its split among threads changes the rounding
// of C. A tiled GEMM fixes the decomposition: C is cut into a grid of tiles whose size is a constant of
// the backend, each tile keeps the whole K (no cross-tile reduction), so which thread computes a tile
// never changes its bits. The cpu backend's tiles and why: backend/cpu/kernels/gemm_tiled.cpp.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, as ops/gemm.h (row-major, leading
// dimensions in elements, op(X) = X^T when trans_x, beta == 0 does not read C), bitwise
// reproducible across thread counts. bf16 operands are widened tile by tile (the tile's rows of
// op(A), its columns of op(B)) and a bf16 C rounded once per tile: the bits are those of the f32
// tiled GEMM of the widened operands.
using gemm_tiled_fn = void(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A,
                           int64_t lda, CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc);

}  // namespace fp::ops
