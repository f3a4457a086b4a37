#include "backend/cpu/gemm_profile.h"

#include "backend/cpu/cpu_backend.h"
#include "core/timing.h"

namespace fp::ops {

namespace {
GemmProfile g_profile;

// A GEMM entry of the cpu table (gemm, or Ring-DTP's gemm_tiled, ops/gemm_tiled.h) that counts its FLOPs
// and time.
template <auto Member>
void gemm_timed(const ExecContext& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, CBuf A,
                int64_t lda, CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc) {
  const Clock::time_point t0 = Clock::now();
  (kernels_cpu().*Member)(c, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  g_profile.seconds += seconds_since(t0);
  g_profile.flops += 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  ++g_profile.calls;
}
}  // namespace

const Kernels& kernels_cpu_gemm_profiled() {
  static const Kernels k = [] {
    Kernels t = kernels_cpu();
    t.gemm = &gemm_timed<&Kernels::gemm>;
    t.gemm_tiled = &gemm_timed<&Kernels::gemm_tiled>;
    return t;
  }();
  return k;
}

GemmProfile& gemm_profile() { return g_profile; }

}  // namespace fp::ops
