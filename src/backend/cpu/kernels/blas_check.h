// The one checking macro every BLAS call goes through (STYLE.md: "every call into BLAS/MPI/CUDA goes
// through one checking macro that records the call, file and line").
//
//   FP_BLAS_CALL(cblas_sgemm, CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
//
// records the call site in a thread_local (blas_last_call(), for diagnostics after a crash inside
// BLAS), validates the arguments with the blas_args_check overload for that function, then calls it.
// Each argument is evaluated once. A BLAS function without a blas_args_check overload does not
// compile, so no call goes unchecked.
//
// Note [Why BLAS arguments are checked before the call]: OpenBLAS reports a bad argument through
// xerbla, which prints a line and returns without touching C, so the bug would surface later as wrong
// numbers. A bad dimension or leading dimension here is always our bug (shapes are validated from the
// config long before), hence FP_ASSERT (fp::InternalError) naming the call text, file and line.
// Integer arguments are checked as int64_t, before they narrow to blasint (32-bit in this OpenBLAS).
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/error.h"

namespace fp::ops::cpu {

struct BlasCallSite {
  const char* call = nullptr;  // the call text as written, "cblas_sgemm(CblasRowMajor, ...)"
  const char* file = nullptr;
  int line = 0;
};

// The last BLAS call made (or attempted) by this thread; call == nullptr before the first.
inline BlasCallSite& blas_last_call() {
  thread_local BlasCallSite site;
  return site;
}

namespace blas_detail {

inline void dim_check(const BlasCallSite& s, const char* name, int64_t v) {
  FP_ASSERT(v >= 0 && v <= std::numeric_limits<blasint>::max(), "{} = {} out of range in {} at {}:{}", name, v,
            s.call, s.file, s.line);
}

// A matrix stored with `rows` x `cols` in row-major terms (or column-major, then ld covers rows):
// ld >= max(1, the contiguous extent) and data non-null when it has elements.
inline void matrix_check(const BlasCallSite& s, const char* name, CBLAS_ORDER order, int64_t rows, int64_t cols,
                         const void* data, int64_t ld) {
  const int64_t extent = order == CblasRowMajor ? cols : rows;
  FP_ASSERT(ld >= std::max<int64_t>(1, extent) && ld <= std::numeric_limits<blasint>::max(),
            "leading dimension of {} is {}, needs >= {} ({} x {}) in {} at {}:{}", name, ld,
            std::max<int64_t>(1, extent), rows, cols, s.call, s.file, s.line);
  FP_ASSERT(rows == 0 || cols == 0 || data != nullptr, "{} is null with {} x {} elements in {} at {}:{}", name, rows,
            cols, s.call, s.file, s.line);
}

}  // namespace blas_detail

// cblas_sgemm: C (M, N) = alpha op(A) (M, K) op(B) (K, N) + beta C.
inline void blas_args_check(const BlasCallSite& s, decltype(&cblas_sgemm), CBLAS_ORDER order, CBLAS_TRANSPOSE ta,
                            CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float /*alpha*/, const float* A,
                            int64_t lda, const float* B, int64_t ldb, float /*beta*/, const float* C, int64_t ldc) {
  FP_ASSERT(order == CblasRowMajor || order == CblasColMajor, "bad order in {} at {}:{}", s.call, s.file, s.line);
  FP_ASSERT((ta == CblasNoTrans || ta == CblasTrans) && (tb == CblasNoTrans || tb == CblasTrans),
            "bad transpose flag in {} at {}:{}", s.call, s.file, s.line);
  blas_detail::dim_check(s, "M", M);
  blas_detail::dim_check(s, "N", N);
  blas_detail::dim_check(s, "K", K);
  // op(A) is (M, K): A is stored (M, K), or (K, M) when transposed; likewise B (K, N) or (N, K).
  const bool at = ta == CblasTrans, bt = tb == CblasTrans;
  blas_detail::matrix_check(s, "A", order, at ? K : M, at ? M : K, A, lda);
  blas_detail::matrix_check(s, "B", order, bt ? N : K, bt ? K : N, B, ldb);
  blas_detail::matrix_check(s, "C", order, M, N, C, ldc);
}

template <class Fn, class... Args>
void blas_call(const BlasCallSite& site, Fn fn, Args... args) {
  blas_last_call() = site;
  blas_args_check(site, fn, args...);
  fn(args...);
}

}  // namespace fp::ops::cpu

#define FP_BLAS_CALL(fn, ...) \
  ::fp::ops::cpu::blas_call(::fp::ops::cpu::BlasCallSite{#fn "(" #__VA_ARGS__ ")", __FILE__, __LINE__}, fn, __VA_ARGS__)
