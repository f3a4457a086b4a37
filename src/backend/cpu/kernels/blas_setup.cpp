// Note [OpenBLAS's kernels are ours to choose] (blas_setup.h). gotoblas_dynamic_init/quit exist only
// in DYNAMIC_ARCH builds: they are looked up at run time, so another build links and says what it runs.
#include "backend/cpu/kernels/blas_setup.h"
#include "backend/cpu/kernels/ops.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "backend/cpu/kernels/cpu_features.h"

extern "C" {
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

namespace fp::ops::cpu {

namespace {

bool same_name(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if ((a[i] | 0x20) != (b[i] | 0x20)) return false;
  return true;
}

BlasKernels setup() {
  BlasKernels k;
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  if (user != nullptr && *user != '\0') {
    k.chosen = user;
    k.why = "OPENBLAS_CORETYPE set by the user";
  } else {
    k.detected = openblas_get_corename();
    const std::string simd = cpu_features().simd_class();
    k.chosen = simd == "avx512" ? "SkylakeX" : simd == "avx2" ? "Haswell" : simd == "avx" ? "Sandybridge" : "Prescott";
    k.why = "ours: " + simd;
    using Fn = void (*)();
    auto quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
    auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
    if (quit != nullptr && init != nullptr && !same_name(k.detected, k.chosen)) {
      setenv("OPENBLAS_CORETYPE", k.chosen.c_str(), 1);  // what gotoblas_dynamic_init reads
      quit();
      init();
    }
  }
  k.config = openblas_get_config();  // after the pin: it names the active core too
  k.active = openblas_get_corename();
  k.pinned = same_name(k.active, k.chosen);
  return k;
}

}  // namespace

std::string BlasKernels::str() const {
  std::string s = fmt::format("{}; kernels {}", config, active);
  if (pinned)
    s += fmt::format(" ({}{})", why, detected.empty() || same_name(detected, active)
                                         ? std::string()
                                         : fmt::format("; OpenBLAS's detector chose {}", detected));
  else
    s += fmt::format(" (NOT the {} asked for, {}: this OpenBLAS cannot switch kernels)", chosen, why);
  return s;
}

const BlasKernels& blas_setup() {
  static const BlasKernels k = setup();
  return k;
}

}  // namespace fp::ops::cpu
