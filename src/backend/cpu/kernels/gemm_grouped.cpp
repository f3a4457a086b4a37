// The grouped GEMMs (ops/gemm_grouped.h) on the cpu: a loop over the groups inside the kernel, each
// group one call of the cpu GEMM (backend/cpu/kernels/gemm.cpp; OpenBLAS threads it) and of the bias
// kernels, so a call has the bits of the host loop it replaced (Note [The experts in one call]).
// Legend: G groups, r rows in all.
#include "ops/gemm_grouped.h"

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

namespace {

void check_offsets(const char* kernel, int64_t G, const int64_t* offsets) {
  FP_ASSERT(G >= 0 && offsets != nullptr && offsets[0] == 0, "{}: G={} offsets must start at 0", kernel, G);
  for (int64_t g = 0; g < G; ++g)
    FP_ASSERT(offsets[g + 1] >= offsets[g], "{}: offsets[{}]={} < offsets[{}]={}", kernel, g + 1, offsets[g + 1], g,
              offsets[g]);
}

}  // namespace

void gemm_grouped(bool trans_b, int64_t G, const int64_t* offsets, int64_t N, int64_t K, float alpha, CBuf A,
                  const CBuf* B, const CBuf* bias, float beta, Buf C) {
  check_offsets("gemm_grouped", G, offsets);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    const Buf c = C.at(r0 * N);
    gemm(false, trans_b, n, N, K, alpha, A.at(r0 * K), K, B[g], trans_b ? K : N, beta, c, N);
    if (bias != nullptr && !bias[g].null()) bias_add(c, bias[g], n, N);
  }
}

void gemm_grouped_weight(int64_t G, const int64_t* offsets, int64_t M, int64_t N, float alpha, CBuf A, CBuf B,
                         float beta, const Buf* C, const Buf* db) {
  check_offsets("gemm_grouped_weight", G, offsets);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    const CBuf a = A.at(r0 * M);
    gemm(true, false, M, N, n, alpha, a, M, B.at(r0 * N), N, beta, C[g], N);
    if (db != nullptr && !db[g].null()) bias_backward(a, db[g], n, M);
  }
}

}  // namespace fp::ops::cpu
