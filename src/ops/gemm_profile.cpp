#include "ops/gemm_profile.h"

#include <chrono>

namespace fp::ops {

namespace {
GemmProfile g_profile;

void gemm_timed(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const auto t0 = std::chrono::steady_clock::now();
  cpu::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  g_profile.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  g_profile.flops += 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  ++g_profile.calls;
}

// The tiled GEMM of Ring-DTP (ops/gemm_tiled.h), counted alike.
void gemm_tiled_timed(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const auto t0 = std::chrono::steady_clock::now();
  cpu::gemm_tiled(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  g_profile.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  g_profile.flops += 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  ++g_profile.calls;
}
}  // namespace

const Kernels& kernels_cpu_gemm_profiled() {
  static const Kernels k = [] {
    Kernels t = kernels_cpu();
    t.gemm = &gemm_timed;
    t.gemm_tiled = &gemm_tiled_timed;
    return t;
  }();
  return k;
}

GemmProfile& gemm_profile() { return g_profile; }

}  // namespace fp::ops
