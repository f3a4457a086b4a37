// Wall-clock timing and the median of repeats: what the benchmarks, the trainer's loss-spike guard, the
// planner and the offloaded optimizer's breakdown all measure with.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace fp {

using Clock = std::chrono::steady_clock;

// Seconds from t0 to now.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The median of the values (the mean of the middle two for an even count); NaN when there are none.
inline double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace fp
