// What this CPU can run, read with CPUID and XGETBV (ours: never a library's detector). The engine
// picks kernels from it (backend/cpu/kernels/blas_setup.h pins OpenBLAS's core type with it) and benchmarks
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

// Note [One instruction-set dispatch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every hand-vectorised kernel of the engine (the attention tiles, AdamW, bf16 <-> f32 conversion)
// picks its copy from this one level, decided once per process: the best this CPU runs (from
// cpu_features(), never a compiler's or a library's detector), lowered by FLATPEAK_SIMD = baseline
// (sse2), avx2, fma or avx512. A kernel without a copy at the level runs the best copy below it
// (AdamW and the conversions stop at avx2; the attention tiles have an avx512 copy, Note [Tile products
// with AVX-512] in backend/cpu/kernels/attention_tile.h). bf16 GEMMs go to oneDNN where the CPU has bf16 units
// (Note [bf16 GEMMs on the matrix units] in backend/cpu/kernels/gemm_onednn.h, FLATPEAK_BF16_GEMM), apart too.
// OpenBLAS's kernels are chosen apart (blas_setup.h), and OPENBLAS_CORETYPE lowers them; `scripts/test --kernels` sets
// both, so the suite can run under every kernel set this CPU can execute.
enum class SimdLevel { sse2, avx2, fma, avx512 };
SimdLevel simd_level();
// "sse2", "avx2", "avx2+fma", "avx512": what benches print.
const char* simd_level_name(SimdLevel s);

}  // namespace fp::ops::cpu
