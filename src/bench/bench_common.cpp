// The benchmarks' shared helpers (bench/bench_common.h).
#include "bench/bench_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "backend/cpu/kernels/blas_setup.h"
#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/cpu_features.h"
#include "backend/cpu/kernels/gemm_onednn.h"
#include "backend/cpu/kernels/ops.h"
#include "core/rng.h"
#include "io/atomic_file.h"
#include "ops/attention.h"

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

void device_write_f32(Backend& be, Buf dst, const float* src, int64_t n) {
  if (dst.dtype == DType::DType_F32) return be.copy_from_host(dst.p, src, static_cast<uint64_t>(n) * sizeof(float));
  std::vector<char> h(static_cast<size_t>(n) * dtype_size(dst.dtype));
  ops::cpu::convert(Buf(h.data(), dst.dtype), CBuf(src), n);
  be.copy_from_host(dst.p, h.data(), h.size());
}

void device_read_f32(Backend& be, CBuf src, int64_t n, float* dst) {
  if (src.dtype == DType::DType_F32) return be.copy_to_host(dst, src.p, static_cast<uint64_t>(n) * sizeof(float));
  std::vector<char> h(static_cast<size_t>(n) * dtype_size(src.dtype));
  be.copy_to_host(h.data(), src.p, h.size());
  ops::cpu::convert(Buf(dst), CBuf(h.data(), src.dtype), n);
}

void bf16_round_inplace(std::vector<float>& x) {
  for (float& v : x) v = bf16_to_float(bf16_from_float(v));
}

void machine_json(nlohmann::json& j) {
  j["blas"] = ops::cpu::blas_setup().str();
  j["bf16_gemm"] = ops::cpu::gemm_bf16_library();
  j["cpu"] = ops::cpu::cpu_features().str();
  j["attention_kernels"] = ops::cpu::attention_kernels();
  j["attention_backward"] = ops::cpu::attention_backward_sweep();
}

void machine_print() {
  fmt::print("GEMMs: {}\nbf16 GEMMs: {}\nattention tiles: {}; backward: {}\ncpu: {}\n", ops::cpu::blas_setup().str(),
             ops::cpu::gemm_bf16_library(), ops::cpu::attention_kernels(), ops::cpu::attention_backward_sweep(), ops::cpu::cpu_features().str());
}

void json_write(const std::string& path, const nlohmann::json& j) {
  if (!path.empty()) file_write_atomic(path, j.dump(2) + "\n");
}

double gemm_rate_measure(DType t, int64_t side, int repeats) {
  const size_t n = static_cast<size_t>(side * side);
  std::vector<float> a(n), b(n), c(n);
  Rng rng(1);
  for (auto& x : a) x = static_cast<float>(rng.uniform() - 0.5);
  for (auto& x : b) x = static_cast<float>(rng.uniform() - 0.5);
  std::vector<bf16> ah(n), bh(n), ch(n);
  for (size_t i = 0; i < n; ++i) ah[i] = from_f32<bf16>(a[i]), bh[i] = from_f32<bf16>(b[i]);
  const bool half = t == DType::DType_BF16;
  const CBuf A = half ? CBuf(ah.data()) : CBuf(a.data()), B = half ? CBuf(bh.data()) : CBuf(b.data());
  const Buf C = half ? Buf(ch.data()) : Buf(c.data());
  const int64_t batch = std::max<int64_t>(1, (int64_t{256} * 256 * 256) / (side * side * side));
  const auto run = [&] {
    for (int64_t i = 0; i < batch; ++i)
      ops::cpu::gemm(false, true, side, side, side, 1.0f, A, side, B, side, 0.0f, C, side);
  };
  run();
  std::vector<double> t_s;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    run();
    t_s.push_back(seconds_since(t0));
  }
  return 2.0 * static_cast<double>(side * side * side) * static_cast<double>(batch) / median(t_s);
}

}  // namespace fp::bench
