// ||got - ref|| / ||ref|| (2-norms, in double): the comparison of tensors summed in another order (weight
// gradients over other rows or chunks, logits through another schedule), where one element may carry a
// relative rounding error several times larger than the tensor's. Infinite when a size differs or a value
// is not finite; with ref all zeros, ||got||.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace fp {

inline double norm_rel(const float* got, const float* ref, size_t n) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) return INFINITY;
    const double d = static_cast<double>(got[i]) - ref[i];
    diff += d * d;
    mag += static_cast<double>(ref[i]) * ref[i];
  }
  return mag > 0 ? std::sqrt(diff / mag) : std::sqrt(diff);
}

inline double norm_rel(const std::vector<float>& got, const std::vector<float>& ref) {
  return got.size() != ref.size() ? INFINITY : norm_rel(got.data(), ref.data(), ref.size());
}

}  // namespace fp
