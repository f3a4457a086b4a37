// Note [OpenBLAS's kernels are ours to choose]
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels at load from its own CPU detector,
// which lags new CPUs: 0.3.21 has no case for the Xeon family 6 model 207 of our development machines
// and falls to its Prescott (SSE3) kernels, 4-6x below the SkylakeX kernels on the same CPU (an empty
// or unknown OPENBLAS_CORETYPE falls back differently again). So the engine never leaves it to the
// detector: before the first BLAS call blas_setup() reads the CPU itself (cpu_features.h) and pins
// the core type (SkylakeX with AVX-512 F/BW/DQ/VL, Haswell with AVX2 + FMA, Sandybridge with AVX,
// else Prescott) by setting OPENBLAS_CORETYPE and re-running OpenBLAS's dynamic init. A user's own
// non-empty OPENBLAS_CORETYPE is kept, and said. Every benchmark prints blas_setup().str(), so a rate
// never comes without the kernels that produced it.
#pragma once

#include <string>

namespace fp::ops::cpu {

struct BlasKernels {
  std::string config;    // openblas_get_config(): version and build options
  std::string detected;  // the core type OpenBLAS's detector chose at load ("" when OPENBLAS_CORETYPE was set)
  std::string chosen;    // the core type asked for ("SkylakeX", "Haswell", ...)
  std::string why;       // "ours: avx512" ... or "OPENBLAS_CORETYPE set by the user"
  std::string active;    // openblas_get_corename() now: the kernels every GEMM runs
  bool pinned = false;   // active is chosen (false: a build without DYNAMIC_ARCH, or the pin did not take)
  // One line: "OpenBLAS 0.3.21 ... kernels Haswell (pinned, ours: avx2; its detector chose Zen)".
  std::string str() const;
};

// Once per process (thread-safe); ops::cpu::gemm calls it before its first BLAS call.
const BlasKernels& blas_setup();

}  // namespace fp::ops::cpu
