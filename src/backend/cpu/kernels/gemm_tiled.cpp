// The tiled GEMM (ops/gemm_tiled.h): C cut into a fixed grid of tiles, each one single-threaded
// cblas_sgemm through FP_BLAS_CALL. Dimensions: M rows of C, N columns of C, K the reduction.
//
// The cpu backend's tiles (Note [Why a tiled GEMM] in ops/gemm_tiled.h): OpenBLAS (0.3.21, OpenMP build) splits a GEMM
// among its threads in ways that change the rounding of C: measured, 1 vs 2 threads differ in up to 70% of the elements
// of (64, 16389) x (16389, 64). Ring-DTP promises results bitwise equal across thread counts, so its GEMMs cut C into
// tiles of kGemmTileRows x kGemmTileCols (constants, whatever the thread count) and compute each tile with one
// single-threaded BLAS call (OpenBLAS runs single-threaded inside an OpenMP parallel region); threads take whole tiles,
// so which thread computes a tile never changes its bits. Every tile keeps the whole K, so there is no cross-tile
// reduction. Packing is repeated per tile: (M/256 + N/512) panels, small next to the 2 M N K flops at the sizes the
// head uses.
#include "ops/gemm_tiled.h"

#include <vector>

#include "backend/cpu/kernels/blas_check.h"
#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "ops/gemm.h"

namespace fp::ops::cpu {

namespace {

// One tile with bf16 operands: the tile's rows of op(A), columns of op(B) and its C widened into
// per-thread scratch, one sgemm, C rounded back (Note [bf16 GEMM on a CPU without bf16 units] in
// backend/cpu/kernels/gemm.cpp). The sgemm sees the same values and shape as the f32 tile would.
void tile_mixed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t K, float alpha, CBuf a, int64_t lda, CBuf b,
                int64_t ldb, float beta, Buf c, int64_t ldc) {
  thread_local std::vector<float> a_ws, b_ws, c_ws;
  const float* ap = static_cast<const float*>(a.p);
  const float* bp = static_cast<const float*>(b.p);
  int64_t lda_p = lda, ldb_p = ldb;
  if (a.dtype != DType::DType_F32) {
    a_ws.resize(static_cast<size_t>(m * K));
    trans_a ? widen_block(a, lda, K, m, a_ws.data()) : widen_block(a, lda, m, K, a_ws.data());
    ap = a_ws.data(), lda_p = trans_a ? m : K;
  }
  if (b.dtype != DType::DType_F32) {
    b_ws.resize(static_cast<size_t>(K * n));
    trans_b ? widen_block(b, ldb, n, K, b_ws.data()) : widen_block(b, ldb, K, n, b_ws.data());
    bp = b_ws.data(), ldb_p = trans_b ? K : n;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if (c.dtype == DType::DType_F32) {
    FP_BLAS_CALL(cblas_sgemm, CblasRowMajor, ta, tb, m, n, K, alpha, ap, lda_p, bp, ldb_p, beta, c.f32(), ldc);
    return;
  }
  c_ws.resize(static_cast<size_t>(m * n));
  if (beta != 0.0f) widen_block(c, ldc, m, n, c_ws.data());
  FP_BLAS_CALL(cblas_sgemm, CblasRowMajor, ta, tb, m, n, K, alpha, ap, lda_p, bp, ldb_p, beta, c_ws.data(), n);
  store_block(c_ws.data(), m, n, c, ldc);
}

}  // namespace

void gemm_tiled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A, int64_t lda, CBuf B,
                int64_t ldb, float beta, Buf C, int64_t ldc) {
  FP_ASSERT(M >= 0 && N >= 0 && K >= 0, "gemm_tiled dims M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0 || K == 0) {
    gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);  // nothing to multiply
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const bool all_f32 = A.dtype == DType::DType_F32 && B.dtype == DType::DType_F32 && C.dtype == DType::DType_F32;
  // The whole product checked here: every tile is a sub-matrix of it, so no call inside the parallel
  // region can fail (an exception must not leave an OpenMP region). Mixed dtypes: the stored layouts
  // checked with stand-in f32 pointers (the tiles' sgemms run on dense f32 scratch).
  blas_args_check(BlasCallSite{"gemm_tiled", __FILE__, __LINE__}, &cblas_sgemm, CblasRowMajor, ta, tb, M, N, K, alpha,
                  static_cast<const float*>(A.p), lda, static_cast<const float*>(B.p), ldb, beta,
                  static_cast<float*>(C.p), ldc);
  const int64_t tiles_m = (M + kGemmTileRows - 1) / kGemmTileRows;
  const int64_t tiles_n = (N + kGemmTileCols - 1) / kGemmTileCols;
  // Always a parallel region, even for one tile: outside one OpenBLAS would thread that tile itself.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t tile = 0; tile < tiles_m * tiles_n; ++tile) {
    const int64_t i0 = (tile / tiles_n) * kGemmTileRows, j0 = (tile % tiles_n) * kGemmTileCols;
    const int64_t m = M - i0 < kGemmTileRows ? M - i0 : kGemmTileRows;
    const int64_t n = N - j0 < kGemmTileCols ? N - j0 : kGemmTileCols;
    // op(A) rows i0.. : A (M, K) row i0, or A^T stored (K, M) column i0; likewise op(B) columns j0...
    const CBuf a = A.at(trans_a ? i0 : i0 * lda);  // (m, K) of op(A)
    const CBuf b = B.at(trans_b ? j0 * ldb : j0);  // (K, n) of op(B)
    const Buf c = C.at(i0 * ldc + j0);             // (m, n)
    if (all_f32) {
      FP_BLAS_CALL(cblas_sgemm, CblasRowMajor, ta, tb, m, n, K, alpha, a.f32(), lda, b.f32(), ldb, beta, c.f32(), ldc);
    } else {
      tile_mixed(trans_a, trans_b, m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
    }
  }
}

}  // namespace fp::ops::cpu
