// GEMM accounting for benchmarks: a kernel table identical to the cpu one except that every GEMM
// adds its FLOPs (2 M N K) and wall time to a global counter, so a benchmark can report the rate of
// the GEMM-bound part of a step against the sgemm rate measured in the same run.
#pragma once

#include <cstdint>

#include "backend/kernels.h"

namespace fp::ops {

struct GemmProfile {
  double seconds = 0;
  double flops = 0;
  int64_t calls = 0;
};

// The cpu table with a timed gemm. Not thread-safe across concurrent steps (benchmarks only).
const Kernels& kernels_cpu_gemm_profiled();
GemmProfile& gemm_profile();

}  // namespace fp::ops
