// GEMM (ops/gemm.h) through OpenBLAS. Dimensions: M rows of C, N columns of C, K the reduction.
//
// OpenBLAS owns the threading (its own pool, openblas_set_num_threads); this wrapper only maps the
// row-major, transpose-flag interface onto cblas_sgemm through FP_BLAS_CALL (backend/cpu/kernels/blas_check.h)
// and settles the empty cases itself, so that BLAS never sees a zero dimension. Its first call pins
// OpenBLAS's kernels (Note [OpenBLAS's kernels are ours to choose] in backend/cpu/kernels/blas_setup.h).
//
// Note [bf16 GEMM on a CPU without bf16 units]: a CPU without AVX512_BF16 or AMX multiplies bf16
// slower than f32 (oneDNN's bf16 matmul there is an emulation, or absent), so bf16 operands are
// widened to f32 and multiplied by sgemm, exactly (widening is exact; the products and sums are the
// f32 GEMM's), and a bf16 C is rounded once at the end. The widening goes panel by panel so the
// scratch stays bounded whatever the shapes: C is cut into blocks of mb rows x nb columns; the
// columns of op(B) of a block are widened once per column block, the rows of op(A) once per block,
// and a bf16 C block is widened (beta != 0), multiplied into and rounded back. Each panel holds at
// most 2^21 floats (gemm_panel_floats_set) unless one row (K) alone is larger. Panels cut only M and N: every element
// of C is still one sgemm dot product over the whole K. The scratch is per-thread host memory, grown
// once and reused, outside the device ledger: a device with bf16 GEMMs (cuBLAS, oneDNN on AMX)
// reads bf16 directly and needs none of it, so the planner's peaks do not include it.
// A CPU with bf16 units takes a GEMM whose A and B are both bf16 to oneDNN instead (Note [bf16 GEMMs
// on the matrix units] in backend/cpu/kernels/gemm_onednn.h); a pair of one f32 and one bf16 widens there too.
#include "ops/gemm.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "backend/cpu/kernels/blas_check.h"
#include "backend/cpu/kernels/blas_setup.h"
#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/gemm_onednn.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

namespace {

std::atomic<int64_t> g_panel_floats{int64_t{1} << 21};  // 8 MiB of f32 per panel

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
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

float* scratch(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The stored layout of an operand must hold its op's block: rows x cols with ld >= cols.
void check_stored(const char* what, const void* p, int64_t rows, int64_t cols, int64_t ld) {
  FP_ASSERT(p != nullptr && ld >= std::max<int64_t>(cols, 1), "gemm {}: {} stored ({}, {}) with ld {}", what,
            p == nullptr ? "null" : "operand", rows, cols, ld);
}

}  // namespace

int64_t gemm_panel_floats_set(int64_t floats) {
  FP_ASSERT(floats > 0, "gemm panel bound {} floats", floats);
  return g_panel_floats.exchange(floats);
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A, int64_t lda, CBuf B,
          int64_t ldb, float beta, Buf C, int64_t ldc) {
  FP_ASSERT(M >= 0 && N >= 0 && K >= 0, "gemm dims M={} N={} K={}", M, N, K);
  const bool f32_a = A.dtype == DType::DType_F32, f32_b = B.dtype == DType::DType_F32,
             f32_c = C.dtype == DType::DType_F32;
  if (f32_a && f32_b && f32_c) {
    sgemm(trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(A.p), lda, static_cast<const float*>(B.p), ldb,
          beta, static_cast<float*>(C.p), ldc);
    return;
  }
  if (M == 0 || N == 0) return;
  check_stored("C", C.p, M, N, ldc);
  if (K > 0) {
    check_stored("A", A.p, trans_a ? K : M, trans_a ? M : K, lda);
    check_stored("B", B.p, trans_b ? N : K, trans_b ? K : N, ldb);
  }
  // Both inputs bf16 on a CPU with bf16 units: Note [bf16 GEMMs on the matrix units].
  if (gemm_bf16_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  // Note [bf16 GEMM on a CPU without bf16 units]: panel sizes.
  const int64_t panel = g_panel_floats.load(std::memory_order_relaxed);
  const int64_t nb = f32_b ? N : std::clamp<int64_t>(panel / std::max<int64_t>(K, 1), std::min<int64_t>(64, N), N);
  const int64_t mb =
      f32_a && f32_c ? M : std::clamp<int64_t>(panel / std::max({K, nb, int64_t{1}}), std::min<int64_t>(64, M), M);
  thread_local std::vector<float> a_ws, b_ws, c_ws;
  for (int64_t j0 = 0; j0 < N; j0 += nb) {
    const int64_t n = std::min(nb, N - j0);
    // op(B) columns j0..j0+n: stored (K, N) columns j0.., or (N, K) rows j0...
    const float* b = nullptr;
    int64_t ldb_p = ldb;
    if (f32_b) {
      b = static_cast<const float*>(B.at(trans_b ? j0 * ldb : j0).p);
    } else if (K > 0) {
      float* w = scratch(b_ws, K * n);
      if (trans_b) {
        widen_block(B.at(j0 * ldb), ldb, n, K, w), ldb_p = K;
      } else {
        widen_block(B.at(j0), ldb, K, n, w), ldb_p = n;
      }
      b = w;
    }
    for (int64_t i0 = 0; i0 < M; i0 += mb) {
      const int64_t m = std::min(mb, M - i0);
      // op(A) rows i0..i0+m: stored (M, K) rows i0.., or (K, M) columns i0...
      const float* a = nullptr;
      int64_t lda_p = lda;
      if (f32_a) {
        a = static_cast<const float*>(A.at(trans_a ? i0 : i0 * lda).p);
      } else if (K > 0) {
        float* w = scratch(a_ws, m * K);
        if (trans_a) {
          widen_block(A.at(i0), lda, K, m, w), lda_p = m;
        } else {
          widen_block(A.at(i0 * lda), lda, m, K, w), lda_p = K;
        }
        a = w;
      }
      const Buf c_blk = C.at(i0 * ldc + j0);
      if (f32_c) {
        sgemm(trans_a, trans_b, m, n, K, alpha, a, lda_p, b, ldb_p, beta, c_blk.f32(), ldc);
      } else {
        float* c = scratch(c_ws, m * n);
        if (beta != 0.0f) widen_block(c_blk, ldc, m, n, c);
        sgemm(trans_a, trans_b, m, n, K, alpha, a, lda_p, b, ldb_p, beta, c, n);
        store_block(c, m, n, c_blk, ldc);
      }
    }
  }
}

}  // namespace fp::ops::cpu
