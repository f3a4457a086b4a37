// GEMM (ops/gemm.h) through OpenBLAS. Dimensions: M rows of C, N columns of C, K the reduction.
//
// OpenBLAS owns the threading (its own pool, openblas_set_num_threads); this wrapper only maps the
// row-major, transpose-flag interface onto cblas_sgemm through FP_BLAS_CALL (ops/cpu/blas_check.h)
// and settles the empty cases itself, so that BLAS never sees a zero dimension. Its first call pins
// OpenBLAS's kernels (Note [OpenBLAS's kernels are ours to choose] in ops/cpu/blas_setup.h).
#include "ops/gemm.h"

#include "core/error.h"
#include "ops/cpu/blas_check.h"
#include "ops/cpu/blas_setup.h"

namespace fp::ops::cpu {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  FP_ASSERT(M >= 0 && N >= 0 && K >= 0, "gemm dims M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;  // C (M, N) has no element
  if (K == 0) {
    // op(A) op(B) is an empty sum: C = beta * C. As in BLAS, beta == 0 does not read C (any NaN in C
    // is overwritten), so the result matches cblas_sgemm's for K >= 1 with alpha = 0.
    FP_ASSERT(C != nullptr && ldc >= N, "gemm C={} ldc={} N={}", static_cast<const void*>(C), ldc, N);
    for (int64_t i = 0; i < M; ++i) {
      float* c = C + i * ldc;  // (N)
      if (beta == 0.0f) {
        for (int64_t j = 0; j < N; ++j) c[j] = 0.0f;
      } else {
        for (int64_t j = 0; j < N; ++j) c[j] *= beta;
      }
    }
    return;
  }
  static const bool pinned = (blas_setup(), true);
  (void)pinned;
  FP_BLAS_CALL(cblas_sgemm, CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M,
               N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace fp::ops::cpu
