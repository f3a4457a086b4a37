// What this CPU can run, read with CPUID and XGETBV (ours: never a library's detector). The engine
// picks kernels from it (ops/cpu/blas_setup.h pins OpenBLAS's core type with it) and benchmarks
// print it next to every rate.
#pragma once

#include <string>

namespace fp::ops::cpu {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // "Intel(R) Xeon(R) ...", or "" when the CPU gives none
  int family = 0, model = 0;
  // Each true only when the OS also saves the registers it needs (XCR0), so code using it will run.
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_bf16 = false;
  bool amx_bf16 = false;  // AMX-BF16 with the tile state enabled by the OS
  // The widest class: "avx512" (F, BW, DQ, VL), "avx2" (AVX2 and FMA), "avx", "sse".
  std::string simd_class() const;
  // One line: "AuthenticAMD family 25 model 1 (AMD EPYC): avx2 fma; lacks avx512, avx512_bf16, amx_bf16".
  std::string str() const;
};

// Read once per process.
const CpuFeatures& cpu_features();

}  // namespace fp::ops::cpu
