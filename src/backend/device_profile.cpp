// The built-in device profiles, the profile file, and the GEMM's shape curve (Note [Device profiles]).
#include "backend/device_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace fp {

namespace {

// Note [Published figures and their deratings]
// Peaks (dense, no sparsity), from NVIDIA's datasheets:
//   H100 SXM5 (nvidia.com/en-us/data-center/h100, datasheet "NVIDIA H100 Tensor Core GPU", 2023): BF16 989.4
//     TFLOP/s dense (1,979 with sparsity), FP32 67 TFLOP/s, HBM3 3.35 TB/s, NVLink 4 900 GB/s (both directions:
//     450 GB/s each way), PCIe Gen5 x16 128 GB/s (64 GB/s each way);
//   H200 SXM (nvidia.com/en-us/data-center/h200, datasheet "NVIDIA H200 Tensor Core GPU", 2024): the same
//     compute (BF16 989 TFLOP/s dense, FP32 67), HBM3e 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s;
//   between nodes, one ConnectX-7 NDR InfiniBand port of 400 Gb/s (50 GB/s) per GPU, as in a DGX H100/H200.
// Deratings, each one number for every configuration (our assumptions, not measurements; "The step on a GPU"
// calibrates them, `bench calibrate` on the GPU):
//   kGemmDerate 0.75       a large bf16 GEMM through cuBLAS(Lt) runs at about 3/4 of the dense peak;
//   kAttentionEff 0.55     FlashAttention-2/cuDNN's fused attention at about 55% of that derated rate;
//   kMemDerate 0.85        streaming kernels reach 85% of the HBM bandwidth;
//   kLinkDerate 0.80       NCCL's bus bandwidth and a pinned cudaMemcpyAsync reach 80% of a link's rate;
//   kGemmHalfDim 256       the shape curve d / (d + 256): a GEMM whose dimensions' harmonic mean is 256 runs at
//                          half the derated rate, one of 4096 at 94%;
//   latencies 5 us within a node (NVLink, NCCL), 10 us between nodes and on PCIe; launch 5 us per kernel;
//   kHostMemPerRank 38 GB/s  the host's kernels (an AdamW offloaded to the host): a DGX H100/H200's two Xeon
//                          Platinum 8480C with 8 channels of DDR5-4800 each (2 x 307 GB/s) shared by 8 GPUs, at 50%.
constexpr double kHostMemPerRank = 2 * 307.2e9 / 8 * 0.5;
constexpr double kGemmDerate = 0.75, kAttentionEff = 0.55, kMemDerate = 0.85, kLinkDerate = 0.80, kGemmHalfDim = 256;

std::vector<std::pair<double, double>> curve_half(double half) {
  std::vector<std::pair<double, double>> c;
  for (double d = 16; d <= 65536; d *= 2) c.emplace_back(d, d / (d + half));
  return c;
}

DeviceProfile hopper(const std::string& name, double hbm_bytes_per_s, const std::string& source) {
  DeviceProfile p;
  p.name = name;
  p.source = source;
  p.gemm_f32 = 67e12;
  p.gemm_bf16 = 989.4e12;
  p.gemm_derate = kGemmDerate;
  p.gemm_curve = curve_half(kGemmHalfDim);
  p.gemm_route_f32 = "cuBLAS sgemm (published peak)";
  p.gemm_route_bf16 = "cuBLASLt bf16 (published peak)";
  p.attention_eff = kAttentionEff;
  p.mem_bytes_per_s = hbm_bytes_per_s;
  p.mem_derate = kMemDerate;
  p.other_flops = 0;
  p.host_mem_bytes_per_s = kHostMemPerRank;
  p.host_link = {64e9 * kLinkDerate, 10e-6};
  p.intra_node = {450e9 * kLinkDerate, 5e-6};
  p.inter_node = {50e9 * kLinkDerate, 10e-6};
  p.ranks_per_node = 8;
  p.launch_s = 5e-6;
  return p;
}

}  // namespace

const DeviceProfile* device_profile_builtin(const std::string& name) {
  static const DeviceProfile h100 =
      hopper("h100-sxm", 3.35e12, "NVIDIA H100 SXM5 datasheet; deratings Note [Published figures and their deratings]");
  static const DeviceProfile h200 =
      hopper("h200-sxm", 4.8e12, "NVIDIA H200 SXM datasheet; deratings Note [Published figures and their deratings]");
  if (name == "h100-sxm") return &h100;
  if (name == "h200-sxm") return &h200;
  return nullptr;
}

std::string device_profile_local_path() {
  const char* env = std::getenv("FLATPEAK_PROFILE_LOCAL");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("runs/profile/local.json");
}

namespace {

nlohmann::json link_json(const LinkProfile& l) { return {{"bytes_per_s", l.bytes_per_s}, {"latency_s", l.latency_s}}; }
LinkProfile link_parse(const nlohmann::json& j) {
  return {j.at("bytes_per_s").get<double>(), j.at("latency_s").get<double>()};
}

}  // namespace

std::string device_profile_json(const DeviceProfile& p) {
  nlohmann::json j;
  j["name"] = p.name;
  j["source"] = p.source;
  j["measured"] = p.measured;
  j["gemm_f32"] = p.gemm_f32;
  j["gemm_bf16"] = p.gemm_bf16;
  j["gemm_derate"] = p.gemm_derate;
  j["gemm_curve"] = p.gemm_curve;
  j["gemm_route_f32"] = p.gemm_route_f32;
  j["gemm_route_bf16"] = p.gemm_route_bf16;
  j["attention_eff"] = p.attention_eff;
  j["mem_bytes_per_s"] = p.mem_bytes_per_s;
  j["mem_derate"] = p.mem_derate;
  j["other_flops"] = p.other_flops;
  j["host_mem_bytes_per_s"] = p.host_mem_bytes_per_s;
  j["host_link"] = link_json(p.host_link);
  j["intra_node"] = link_json(p.intra_node);
  j["inter_node"] = link_json(p.inter_node);
  j["ranks_per_node"] = p.ranks_per_node;
  j["launch_s"] = p.launch_s;
  j["shared_cores"] = p.shared_cores;
  return j.dump(2) + "\n";
}

DeviceProfile device_profile_parse(const std::string& text, const std::string& origin) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    DeviceProfile p;
    p.name = j.at("name").get<std::string>();
    p.source = j.value("source", origin);
    p.measured = j.value("measured", false);
    p.gemm_f32 = j.at("gemm_f32").get<double>();
    p.gemm_bf16 = j.at("gemm_bf16").get<double>();
    p.gemm_derate = j.value("gemm_derate", 1.0);
    p.gemm_curve = j.value("gemm_curve", std::vector<std::pair<double, double>>{});
    p.gemm_route_f32 = j.value("gemm_route_f32", "");
    p.gemm_route_bf16 = j.value("gemm_route_bf16", "");
    p.attention_eff = j.value("attention_eff", 1.0);
    p.mem_bytes_per_s = j.at("mem_bytes_per_s").get<double>();
    p.mem_derate = j.value("mem_derate", 1.0);
    p.other_flops = j.value("other_flops", 0.0);
    p.host_mem_bytes_per_s = j.value("host_mem_bytes_per_s", 0.0);
    p.host_link = link_parse(j.at("host_link"));
    p.intra_node = link_parse(j.at("intra_node"));
    p.inter_node = link_parse(j.at("inter_node"));
    p.ranks_per_node = j.value("ranks_per_node", 8);
    p.launch_s = j.value("launch_s", 0.0);
    p.shared_cores = j.value("shared_cores", 0);
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("device profile {} is not a profile: {}", origin, e.what()),
                "write it with `flatpeak bench calibrate`, or name a built-in (h100-sxm, h200-sxm)");
  }
}

DeviceProfile device_profile_load(const std::string& name_or_path) {
  if (const DeviceProfile* p = device_profile_builtin(name_or_path)) return *p;
  const std::string path = name_or_path == "local" ? device_profile_local_path() : name_or_path;
  std::ifstream in(path);
  if (!in)
    throw Error(fmt::format("no device profile '{}' ({} cannot be read)", name_or_path, path),
                name_or_path == "local" ? "measure this machine first: flatpeak bench calibrate"
                                        : "name a built-in (h100-sxm, h200-sxm), local, or a profile file");
  std::stringstream ss;
  ss << in.rdbuf();
  return device_profile_parse(ss.str(), path);
}

double device_profile_gemm_fraction(const DeviceProfile& p, double M, double N, double K) {
  if (p.gemm_curve.empty()) return 1.0;
  if (M <= 0 || N <= 0 || K <= 0) return 1.0;
  const double d = 3.0 / (1.0 / M + 1.0 / N + 1.0 / K);
  const auto& c = p.gemm_curve;
  if (d <= c.front().first) return c.front().second;
  if (d >= c.back().first) return c.back().second;
  size_t i = 1;
  while (c[i].first < d) ++i;
  const double t = std::log(d / c[i - 1].first) / std::log(c[i].first / c[i - 1].first);
  return c[i - 1].second + t * (c[i].second - c[i - 1].second);
}

double device_profile_gemm_rate(const DeviceProfile& p, DType t) {
  return (t == DType::DType_F32 ? p.gemm_f32 : p.gemm_bf16) * p.gemm_derate;
}

}  // namespace fp
