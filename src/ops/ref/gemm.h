// Scalar reference of GEMM (ops/gemm.h), in T. Dimensions: M rows of C, N columns of C, K the
// reduction.
#pragma once

#include <cstdint>

namespace fp::ops::ref {

// C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C; A stored (M, K), or (K, M) when trans_a;
// B stored (K, N), or (N, K) when trans_b; leading dimensions in elements. The dot product runs over
// k in order, in T. beta == 0 does not read C (BLAS convention).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      T acc = T(0);
      for (int64_t k = 0; k < K; ++k) {
        const T a = trans_a ? A[k * lda + i] : A[i * lda + k];
        const T b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
        acc += a * b;
      }
      T& c = C[i * ldc + j];
      c = beta == T(0) ? alpha * acc : alpha * acc + beta * c;
    }
  }
}

}  // namespace fp::ops::ref
