// GEMM. Dimensions: M rows of C, N columns of C, K the reduction.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, all row-major with leading dimensions
// lda/ldb/ldc (elements). op(X) = X^T when trans_x: then A is stored (K, M) and B (N, K). M, N or K
// may be 0; beta == 0 does not read C.
// Each of A, B, C is f32 or bf16 on its own. Products accumulate in f32 (no TF32 or other narrowed
// multiply for f32 operands), and a bf16 C is rounded once; the order of the sums is the backend's, so
// a result holds within the f32 GEMM error model of tests/common/error_bound.h, not bit for bit across
// backends.
using gemm_fn = void(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A, int64_t lda,
                     CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc);

}  // namespace fp::ops
