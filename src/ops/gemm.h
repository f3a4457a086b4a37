// GEMM. Dimensions: M rows of C, N columns of C, K the reduction.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature (a backend's table entry adds an ExecContext first,
// backend/kernels.h); cpu implements it below, a cuda backend beside it.

// C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, all row-major with leading dimensions
// lda/ldb/ldc (elements). op(X) = X^T when trans_x: then A is stored (K, M) and B (N, K). M, N or K
// may be 0; beta == 0 does not read C.
// All f32: one cblas_sgemm (checked by FP_BLAS_CHECK on its arguments). Any operand bf16 (each of A,
// B, C is f32 or bf16 on its own): Note [bf16 GEMM on a CPU without bf16 units] in ops/cpu/gemm.cpp;
// the result is the f32 GEMM of the widened operands, rounded once into a bf16 C. A and B both bf16 on
// a CPU with bf16 units: one oneDNN matmul with f32 accumulation (Note [bf16 GEMMs on the matrix units]
// in ops/cpu/gemm_onednn.h), the same products summed in another order.
using gemm_fn = void(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A, int64_t lda,
                     CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc);

}  // namespace fp::ops

namespace fp::ops::cpu {

gemm_fn gemm;

// The bound on one widened panel of the bf16 path, in floats (default 2^21, 8 MiB); tests lower it to
// cross panel edges on small shapes. Returns the previous bound.
int64_t gemm_panel_floats_set(int64_t floats);

}  // namespace fp::ops::cpu
