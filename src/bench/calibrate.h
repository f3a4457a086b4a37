// flatpeak bench calibrate: the `local` device profile, measured on this machine (Note [Device profiles] in
// backend/device_profile.h; src/bench/calibrate.cpp says what each figure times).
#pragma once

#include <string>

namespace fp::bench {

struct BenchCalibrateOptions {
  std::string out;  // the profile file ("": device_profile_local_path())
  int repeats = 5;  // timed runs per measurement (median)
};

int bench_calibrate_run(const BenchCalibrateOptions& o);

}  // namespace fp::bench
