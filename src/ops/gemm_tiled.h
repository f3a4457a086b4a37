// GEMM over a fixed grid of output tiles: the same product as ops/gemm.h, with bits that do not depend
// on the thread count. Dimensions: M rows of C, N columns of C, K the reduction.
//
// Note [Why a tiled GEMM]: OpenBLAS (0.3.21, OpenMP build) splits a GEMM among its threads in ways
// that change the rounding of C: measured, 1 vs 2 threads differ in up to 70% of the elements of
// (64, 16389) x (16389, 64). Ring-DTP promises results bitwise equal across thread counts, so its
// GEMMs cut C into tiles of kGemmTileRows x kGemmTileCols (constants, whatever the thread count) and
// compute each tile with one single-threaded BLAS call (OpenBLAS runs single-threaded inside an OpenMP
// parallel region); threads take whole tiles, so which thread computes a tile never changes its bits.
// Every tile keeps the whole K, so there is no cross-tile reduction. Packing is repeated per tile:
// (M/256 + N/512) panels, small next to the 2 M N K flops at the sizes the head uses.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature (a backend's table entry adds an ExecContext first,
// backend/kernels.h); cpu implements it below, a cuda backend beside it.

// C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, as ops::cpu::gemm (row-major, leading
// dimensions in elements, op(X) = X^T when trans_x, beta == 0 does not read C), bitwise
// reproducible across thread counts. bf16 operands are widened tile by tile (the tile's rows of
// op(A), its columns of op(B)) and a bf16 C rounded once per tile: the bits are those of the f32
// tiled GEMM of the widened operands.
using gemm_tiled_fn = void(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A,
                           int64_t lda, CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc);

}  // namespace fp::ops

namespace fp::ops::cpu {

gemm_tiled_fn gemm_tiled;

inline constexpr int64_t kGemmTileRows = 256;
inline constexpr int64_t kGemmTileCols = 512;

}  // namespace fp::ops::cpu
