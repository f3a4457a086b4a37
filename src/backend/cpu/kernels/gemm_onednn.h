// bf16 GEMMs on the CPU's bf16 units through oneDNN (Note [bf16 GEMMs on the matrix units]). Private to
// the cpu kernels: ops::cpu::gemm calls it; benches print gemm_bf16_library().
//
// Note [bf16 GEMMs on the matrix units]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where the CPU has AVX512_BF16 (vdpbf16ps: a pair of bf16 products summed into f32 per lane) or
// AMX-BF16, and the build found oneDNN (Debian's libdnnl-dev 2.6; docs/benchmarks.md measures it against
// PyPI's 3.2 and OpenBLAS), a GEMM whose A and B are both bf16 runs one oneDNN matmul: bf16 inputs, f32
// accumulation, C f32 or bf16 (rounded once), alpha as the output scale and beta as a sum post-op. This
// is what bf16 is for on a CPU: twice the f32 rate or more, where the widening path (Note [bf16 GEMM on
// a CPU without bf16 units] in backend/cpu/kernels/gemm.cpp) runs below sgemm. Primitives are built once per
// (transposes, C's dtype, beta), with M, N, K, the leading dimensions and alpha given at run time, so
// every GEMM of a run shares a handful of them (the experts' included, whose M, or K for the weight
// gradients, is the tokens each expert got); the cache is process-wide, guarded and bounded.
// oneDNN's scratchpad is the caller's (user mode, a per-thread host buffer), but these run-time-shaped
// primitives ask for none (0 bytes, oneDNN 2.6): its GEMM driver packs into buffers it allocates
// itself, host memory bounded by its blocking, as OpenBLAS does. Neither is device memory of the step
// (a device with bf16 GEMMs of its own needs no widening or packing of ours), so the ledger and the
// planner's peaks do not include them.
// Exactness: each product of two bf16 is exact in f32, so the result differs from the widening path's
// only in the order of the f32 sums (and vdpbf16ps flushes subnormal inputs and outputs to zero);
// tests hold it to the same error bound (tests/ops/test_gemm.cpp). Deterministic: one primitive and
// thread count give the same bits on every call.
// FLATPEAK_BF16_GEMM=widen forces the widening path (scripts/test's kernel sets other than native do),
// =onednn insists on oneDNN (an error where it cannot run); unset: oneDNN where it can run.
#pragma once

#include <cstdint>
#include <string>

#include "core/buf.h"

namespace fp::ops::cpu {

// C (M, N) = alpha op(A) op(B) + beta C as ops::cpu::gemm, when A and B are bf16 and the oneDNN path is
// on (above); returns false, touching nothing, when it does not apply (the caller widens instead).
bool gemm_bf16_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A, int64_t lda,
                      CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc);

// Whether a GEMM with A and B bf16 runs on oneDNN in this process (decided once).
bool gemm_bf16_onednn_active();

// What runs a bf16 GEMM here, for benches: "oneDNN 2.6.3 (isa avx512_core_bf16; gemm:jit)" or
// "widened to f32, OpenBLAS sgemm (no AVX512_BF16 or AMX)" with the reason.
std::string gemm_bf16_library();

}  // namespace fp::ops::cpu
