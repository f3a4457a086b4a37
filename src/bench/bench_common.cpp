// The benchmarks' shared helpers (bench/bench_common.h).
#include "bench/bench_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "io/atomic_file.h"
#include "ops/cpu/blas_setup.h"
#include "ops/cpu/cpu_features.h"

namespace fp::bench {

double max_rel_diff(const float* got, const float* ref, int64_t n) {
  double diff = 0, mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(ref[i])));
  }
  return mag > 0 ? diff / mag : diff;
}

void machine_json(nlohmann::json& j) {
  j["blas"] = ops::cpu::blas_setup().str();
  j["cpu"] = ops::cpu::cpu_features().str();
}

void machine_print() {
  fmt::print("GEMMs: {}\ncpu: {}\n", ops::cpu::blas_setup().str(), ops::cpu::cpu_features().str());
}

void json_write(const std::string& path, const nlohmann::json& j) {
  if (!path.empty()) file_write_atomic(path, j.dump(2) + "\n");
}

}  // namespace fp::bench
