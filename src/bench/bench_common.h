// What the benchmarks (bench/*.h) share: wall-clock seconds and medians of repeats (core/timing.h), reductions over
// the ranks, the relative difference the variant checks compare, the GEMM library and CPU every
// report names, and the --json results file. Each benchmark is a library function over a plain
// options struct; `flatpeak bench ...` (cli/bench.cpp) only parses the command line into it.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/comm.h"
#include "core/buf.h"
#include "core/dtype.h"
#include "core/timing.h"

namespace fp {
class Backend;
}

namespace fp::bench {

using fp::Clock;  // wall-clock seconds and medians: core/timing.h
using fp::median;
using fp::seconds_since;

// The largest v over the ranks (every rank passes its own and gets the largest): floating values
// travel as float64, integers as int64.
template <class T>
T max_over_ranks(Comm& comm, T v) {
  if constexpr (std::is_floating_point_v<T>) {
    double d = static_cast<double>(v);
    comm.all_reduce_max(&d, 1, DType::DType_F64);
    return static_cast<T>(d);
  } else {
    int64_t d = static_cast<int64_t>(v);
    comm.all_reduce_max(&d, 1, DType::DType_I64);
    return static_cast<T>(d);
  }
}

// max_i |got_i - ref_i| / max_i |ref_i| over n elements (the absolute difference when ref is all
// zero); infinite when got holds a NaN or an infinity, so a check against a bound fails.
double max_rel_diff(const float* got, const float* ref, int64_t n);
inline double max_rel_diff(const std::vector<float>& got, const std::vector<float>& ref) {
  return max_rel_diff(got.data(), ref.data(), static_cast<int64_t>(ref.size()));
}

// Host f32 and device storage of either dtype (the benchmarks' inputs and results under a precision
// recipe, core/precision.h): n elements of src written into dst in dst's dtype (rounded to nearest
// even into bf16), and n elements of src read back widened (exact). dst/src are device buffers of be.
void device_write_f32(Backend& be, Buf dst, const float* src, int64_t n);
void device_read_f32(Backend& be, CBuf src, int64_t n, float* dst);
// x rounded to the nearest bf16 and widened back, in place: the values a bf16 tensor written from x
// holds, so that a float64 oracle fed them measures the kernels, not the rounding of their inputs.
void bf16_round_inplace(std::vector<float>& x);

// The machine a result was measured on: the GEMM library's setup (Note [OpenBLAS's kernels are ours
// to choose]) and the CPU's features, as j["blas"] and j["cpu"], and printed as the report's
// "GEMMs: ..." and "cpu: ..." lines.
void machine_json(nlohmann::json& j);
void machine_print();

// The results file: j written atomically (2-space indent, a final newline) to path; nothing when
// path is empty (no --json).
void json_write(const std::string& path, const nlohmann::json& j);

// The rate (FLOP/s) of the cpu GEMM on square operands of side `side` stored in `t` (f32: OpenBLAS's
// sgemm; bf16: oneDNN's bf16 matmul where the CPU has bf16 units, Note [bf16 GEMMs on the matrix units],
// else the sgemm on widened panels, the CPU's best bf16 there): one call first, then the median of `repeats`
// timed samples. Small GEMMs are timed in batches so that a sample is well above the clock's resolution
// (one GEMM a sample from side 256 up). The peak `bench step` measures its GEMMs against, and the curve
// `bench calibrate` fits.
double gemm_rate_measure(DType t, int64_t side, int repeats);

}  // namespace fp::bench
