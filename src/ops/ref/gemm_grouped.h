// Scalar reference of the grouped GEMMs (ops/gemm_grouped.h), in T: the loop over groups of the plain
// references (ops/ref/gemm.h, ops/ref/elementwise.h). Group g owns rows [offsets[g], offsets[g + 1]).
#pragma once

#include <cstdint>

#include "ops/ref/elementwise.h"
#include "ops/ref/gemm.h"

namespace fp::ops::ref {

// C[rows_g] (n_g, N) = alpha A[rows_g] (n_g, K) op(B[g]) + beta C[rows_g], then += bias[g] on every row
// (bias or bias[g] null: none). Empty groups read nothing.
template <class T>
void gemm_grouped(bool trans_b, int64_t G, const int64_t* offsets, int64_t N, int64_t K, T alpha, const T* A,
                  const T* const* B, const T* const* bias, T beta, T* C) {
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    gemm<T>(false, trans_b, n, N, K, alpha, A + r0 * K, K, B[g], trans_b ? K : N, beta, C + r0 * N, N);
    if (bias != nullptr && bias[g] != nullptr) bias_add<T>(C + r0 * N, bias[g], n, N);
  }
}

// C[g] (M, N) = alpha A[rows_g]^T B[rows_g] + beta C[g], then db[g] (M) += the column sums of A[rows_g].
template <class T>
void gemm_grouped_weight(int64_t G, const int64_t* offsets, int64_t M, int64_t N, T alpha, const T* A, const T* B,
                         T beta, T* const* C, T* const* db) {
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    gemm<T>(true, false, M, N, n, alpha, A + r0 * M, M, B + r0 * N, N, beta, C[g], N);
    if (db != nullptr && db[g] != nullptr) bias_backward<T>(A + r0 * M, db[g], n, M);
  }
}

}  // namespace fp::ops::ref
