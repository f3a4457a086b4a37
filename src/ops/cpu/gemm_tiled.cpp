// The tiled GEMM (ops/gemm_tiled.h): C cut into a fixed grid of tiles, each one single-threaded
// cblas_sgemm through FP_BLAS_CALL. Dimensions: M rows of C, N columns of C, K the reduction.
#include "ops/gemm_tiled.h"

#include "core/error.h"
#include "ops/cpu/blas_check.h"
#include "ops/gemm.h"

namespace fp::ops::cpu {

void gemm_tiled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  FP_ASSERT(M >= 0 && N >= 0 && K >= 0, "gemm_tiled dims M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0 || K == 0) {
    gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);  // nothing to multiply
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  // The whole product checked here: every tile is a sub-matrix of it, so no call inside the parallel
  // region can fail (an exception must not leave an OpenMP region).
  blas_args_check(BlasCallSite{"gemm_tiled", __FILE__, __LINE__}, &cblas_sgemm, CblasRowMajor, ta, tb, M, N, K,
                  alpha, A, lda, B, ldb, beta, C, ldc);
  const int64_t tiles_m = (M + kGemmTileRows - 1) / kGemmTileRows;
  const int64_t tiles_n = (N + kGemmTileCols - 1) / kGemmTileCols;
  // Always a parallel region, even for one tile: outside one OpenBLAS would thread that tile itself.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t tile = 0; tile < tiles_m * tiles_n; ++tile) {
    const int64_t i0 = (tile / tiles_n) * kGemmTileRows, j0 = (tile % tiles_n) * kGemmTileCols;
    const int64_t m = M - i0 < kGemmTileRows ? M - i0 : kGemmTileRows;
    const int64_t n = N - j0 < kGemmTileCols ? N - j0 : kGemmTileCols;
    // op(A) rows i0.. : A (M, K) row i0, or A^T stored (K, M) column i0; likewise op(B) columns j0...
    const float* a = trans_a ? A + i0 : A + i0 * lda;  // (m, K) of op(A)
    const float* b = trans_b ? B + j0 * ldb : B + j0;  // (K, n) of op(B)
    float* c = C + i0 * ldc + j0;                      // (m, n)
    FP_BLAS_CALL(cblas_sgemm, CblasRowMajor, ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace fp::ops::cpu
