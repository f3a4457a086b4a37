// GEMM. Dimensions: M rows of C, N columns of C, K the reduction.
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, all row-major with leading dimensions
// lda/ldb/ldc (elements). op(X) = X^T when trans_x: then A is stored (K, M) and B (N, K).
// Through BLAS (cblas_sgemm, checked by FP_BLAS_CHECK on its arguments). M, N or K may be 0.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace fp::ops::cpu
