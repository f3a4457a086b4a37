// flatpeak bench calibrate (bench/calibrate.h). Each figure of the local profile is the median of repeats of one
// cpu kernel or transfer, timed here:
//   gemm_f32, gemm_bf16, gemm_curve  ops::cpu::gemm on square operands of side 32 .. 1024 in each dtype (f32:
//        OpenBLAS sgemm; bf16: oneDNN's bf16 matmul where the CPU has bf16 units, else the sgemm on widened
//        panels: gemm_bf16_library names the route); the curve is each side's rate over the largest's (f32);
//   attention_eff    ops::cpu::attention_forward (B 1, T 1024, 4 heads of 64, causal) at its counted FLOPs
//        (backend/kernel_work.h), over the f32 GEMM rate;
//   mem_bytes_per_s  ops::cpu::add_inplace over 32 Mi floats (reads 2, writes 1 per element);
//   other_flops      ops::cpu::swiglu_forward over 4 Mi floats at its counted 5 FLOPs per element;
//   links            memcpy of 64 MiB (host link: the cpu backend's copy streams copy; intra-node: the thread
//        world's send_recv of the same size between 2 ranks, and of 1 float for the latency);
//   launch_s         a cpu kernel call on 1 element; shared_cores  the host's hardware threads.
#include "bench/calibrate.h"

#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "backend/cpu/kernels/gemm_onednn.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/device_profile.h"
#include "backend/kernel_work.h"
#include "bench/bench_common.h"
#include "comm/thread_comm.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/timing.h"
#include "io/atomic_file.h"

namespace fp::bench {

namespace {

template <class F>
double time_median(int repeats, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  return median(t);
}

}  // namespace

int bench_calibrate_run(const BenchCalibrateOptions& o) {
  DeviceProfile p;
  p.name = "local";
  p.measured = true;
  const int reps = std::max(o.repeats, 1);
  // The GEMM: rates per side and dtype.
  std::vector<std::pair<double, double>> f32_rates;
  for (int64_t side : {32, 64, 128, 256, 512, 1024})
    f32_rates.emplace_back(static_cast<double>(side), gemm_rate_measure(DType::DType_F32, side, reps));
  // A larger GEMM never runs slower per FLOP through BLAS; a sample below a smaller side's is noise (a shared
  // machine), so the curve is the running maximum and the peak its last value.
  for (size_t i = 1; i < f32_rates.size(); ++i)
    f32_rates[i].second = std::max(f32_rates[i].second, f32_rates[i - 1].second);
  const double top = f32_rates.back().second;
  p.gemm_f32 = top;
  for (const auto& [d, r] : f32_rates) p.gemm_curve.emplace_back(d, r / top);
  p.gemm_bf16 = gemm_rate_measure(DType::DType_BF16, 1024, reps) / p.gemm_curve.back().second;
  p.gemm_derate = 1.0;  // measured: the rates are the kernels' own
  p.gemm_route_f32 = "OpenBLAS sgemm";
  p.gemm_route_bf16 = ops::cpu::gemm_bf16_library();
  // Attention: the real kernel at its counted FLOPs, over the f32 GEMM rate.
  {
    const int64_t T = 1024, nh = 4, hd = 64;
    std::vector<float> q(static_cast<size_t>(T * nh * hd), 0.01f), k(q), v(q), out(q), lse(static_cast<size_t>(nh * T));
    const ops::AttentionSpec a = ops::attention_spec(1, T, nh, nh, hd, hd, 0.125f, 0);
    const double s = time_median(
        reps, [&] { ops::cpu::attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), a); });
    const KernelWork w = kernel_work::attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), a);
    p.attention_eff = w.flops / s / p.gemm_f32;
  }
  // Memory and the elementwise kernels.
  {
    const int64_t n = int64_t{32} << 20;
    std::vector<float> x(static_cast<size_t>(n), 1.0f), y(static_cast<size_t>(n), 2.0f);
    const double s = time_median(reps, [&] { ops::cpu::add_inplace(y.data(), x.data(), n); });
    p.mem_bytes_per_s = 12.0 * static_cast<double>(n) / s;
    p.mem_derate = 1.0;
    const int64_t m = int64_t{4} << 20;
    const double s2 = time_median(reps, [&] { ops::cpu::swiglu_forward(x.data(), y.data(), x.data() + m, m); });
    p.other_flops = 5.0 * static_cast<double>(m) / s2;
    // The host link: the cpu backend's copy streams memcpy host memory.
    const size_t bytes = size_t{64} << 20;
    const double s3 = time_median(reps, [&] { std::memcpy(y.data(), x.data(), bytes); });
    p.host_link = {static_cast<double>(bytes) / s3, 0};
    // A kernel call's overhead.
    const double s4 = time_median(reps, [&] {
      for (int i = 0; i < 10000; ++i) ops::cpu::add_inplace(y.data(), x.data(), 1);
    });
    p.launch_s = s4 / 10000;
  }
  // Within a node: two ranks of a thread world exchange 64 MiB, and one float (the latency).
  {
    const int64_t n = int64_t{16} << 20;
    std::vector<double> big(2), small(2);
    ThreadWorld world(2);
    world.run([&](Comm& comm) {
      std::vector<float> s(static_cast<size_t>(n), 1.0f), r(static_cast<size_t>(n));
      const int peer = 1 - comm.rank();
      const double tb =
          time_median(reps, [&] { comm.send_recv(s.data(), n, peer, r.data(), n, peer, DType::DType_F32); });
      const double ts = time_median(reps, [&] {
        for (int i = 0; i < 100; ++i) comm.send_recv(s.data(), 1, peer, r.data(), 1, peer, DType::DType_F32);
      });
      big[static_cast<size_t>(comm.rank())] = tb;
      small[static_cast<size_t>(comm.rank())] = ts / 100;
    });
    p.intra_node = {4.0 * static_cast<double>(n) / std::max(big[0], big[1]), std::max(small[0], small[1])};
    p.inter_node = p.intra_node;  // one machine: every rank is within it
  }
  p.ranks_per_node = 1 << 20;
  p.shared_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  p.source = fmt::format("flatpeak bench calibrate on this machine ({} hardware threads)", p.shared_cores);
  const std::string out = o.out.empty() ? device_profile_local_path() : o.out;
  const std::filesystem::path dir = std::filesystem::path(out).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  file_write_atomic(out, device_profile_json(p));
  fmt::print("local profile (measured here, medians of {}):\n", reps);
  fmt::print("  GEMM f32 {:.2f} GFLOP/s ({}), bf16 {:.2f} GFLOP/s ({})\n", p.gemm_f32 / 1e9, p.gemm_route_f32,
             p.gemm_bf16 / 1e9, p.gemm_route_bf16);
  std::string curve;
  for (const auto& [d, f] : p.gemm_curve) curve += fmt::format(" {:.0f}:{:.2f}", d, f);
  fmt::print("  GEMM shape curve (side:fraction of f32 peak):{}\n", curve);
  fmt::print("  attention {:.0f}% of the f32 GEMM rate; memory {:.2f} GB/s; elementwise {:.2f} GFLOP/s\n",
             100 * p.attention_eff, p.mem_bytes_per_s / 1e9, p.other_flops / 1e9);
  fmt::print(
      "  host link (memcpy) {:.2f} GB/s; ranks (thread world) {:.2f} GB/s, {:.1f} us; kernel call {:.2f} us; "
      "{} cores shared by the ranks\n",
      p.host_link.bytes_per_s / 1e9, p.intra_node.bytes_per_s / 1e9, p.intra_node.latency_s * 1e6, p.launch_s * 1e6,
      p.shared_cores);
  fmt::print("wrote {}\n", out);
  machine_print();
  return 0;
}

}  // namespace fp::bench
