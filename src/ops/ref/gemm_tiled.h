// Scalar reference of the tiled GEMM (ops/gemm_tiled.h): the tiling changes no value beyond rounding,
// so its oracle is the plain GEMM reference (ops/ref/gemm.h), the dot product over k in order, in T.
// Dimensions: M rows of C, N columns of C, K the reduction.
#pragma once

#include <cstdint>

#include "ops/ref/gemm.h"

namespace fp::ops::ref {

template <class T>
void gemm_tiled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  gemm<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace fp::ops::ref
