// A device profile: the rates that turn the meta backend's counts of work (backend/work_log.h) into a
// predicted time. Every figure of a predicted step comes from one of these numbers, so each has a name, a
// unit and, for the published profiles, a source (docs/design.md, "Time in the planner").
//
// Note [Device profiles]
// Three kinds of figures make a profile:
//   rates       the matmul rate per dtype (FLOP/s), memory bandwidth (B/s), each link's bandwidth (B/s) and
//               latency (s), the launch overhead (s per kernel);
//   deratings   named fractions of a rate that a real kernel reaches (gemm_derate: of the dense peak;
//               attention_eff: of the derated matmul rate; mem_derate: of the memory bandwidth; the links'
//               derates). Published peaks are never reached; a derating says by how much we assume they
//               are not, one number each, never tuned per configuration;
//   shape curve the GEMM's efficiency by the operands' size: a table of (d, fraction) with d the harmonic
//               mean of M, N and K, interpolated in log d and clamped at its ends (a small GEMM runs far below
//               the peak on any machine).
//   `local`     measured on this machine by `flatpeak bench calibrate` (a file; src/bench/calibrate.cpp);
//   `h100-sxm`, `h200-sxm`  from NVIDIA's published figures (device_profile.cpp cites each).
// A profile is a prediction's premise: every predicted figure is printed as one, with the profile's name.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace fp {

struct LinkProfile {
  double bytes_per_s = 0;  // per direction, per rank, already derated
  double latency_s = 0;    // per message (per hop of a ring)
};

struct DeviceProfile {
  std::string name;    // "local", "h100-sxm", ...
  std::string source;  // where the figures come from (a citation, or the calibration's command and date)
  bool measured = false;
  // The GEMM: dense peak FLOP/s per dtype (f32 without TF32; bf16 with f32 accumulation), the derating to what
  // a large GEMM reaches, and the shape curve (Note [Device profiles]).
  double gemm_f32 = 0, gemm_bf16 = 0;
  double gemm_derate = 1.0;
  std::vector<std::pair<double, double>> gemm_curve;  // (d, fraction of the derated rate), d ascending
  std::string gemm_route_f32, gemm_route_bf16;        // which library ran each (calibration's pick)
  // Attention (FlashAttention-style tiles): a fraction of the derated matmul rate of its dtype.
  double attention_eff = 1.0;
  // Memory: the bandwidth of device memory (B/s) and the fraction that the streaming kernels reach. Kernels
  // that are not GEMMs or attention take max(bytes / bandwidth, flops / other_flops).
  double mem_bytes_per_s = 0;
  double mem_derate = 1.0;
  double other_flops = 0;  // FLOP/s of the elementwise kernels' arithmetic (exp, rsqrt, ...); 0: not bound
  // The host's memory bandwidth per rank (B/s, derated): the host kernels' (an offloaded AdamW on the host) rate.
  // 0: the device's (a cpu, whose device memory is host memory).
  double host_mem_bytes_per_s = 0;
  // Links: device memory to device memory is mem; the host link (PCIe: offloads), within a node (NVLink, or
  // shared memory between processes), between nodes (InfiniBand).
  LinkProfile host_link, intra_node, inter_node;
  int ranks_per_node = 8;
  double launch_s = 0;  // per kernel call, on the stream's critical path
  // The ranks of a run share this many cores (a profile of a cpu: W ranks on one machine share its cores, so
  // each gets cores / W of the single-process rate when W > cores). 0: every rank has a device of its own.
  int shared_cores = 0;
};

// The built-in profiles (Note [Device profiles]): "h100-sxm", "h200-sxm"; null for another name.
const DeviceProfile* device_profile_builtin(const std::string& name);
// A profile by name or file: a built-in, or "local" (the file `bench calibrate` wrote: $FLATPEAK_PROFILE_LOCAL,
// else runs/profile/local.json), or the path of a profile file. Throws fp::Error naming what is missing.
DeviceProfile device_profile_load(const std::string& name_or_path);
// The default path of the local profile.
std::string device_profile_local_path();
// A profile as JSON text, and back (the file `bench calibrate` writes).
std::string device_profile_json(const DeviceProfile& p);
DeviceProfile device_profile_parse(const std::string& json_text, const std::string& origin);

// The GEMM's efficiency at M x N x K (Note [Device profiles]), and its rate in FLOP/s for operands in t.
double device_profile_gemm_fraction(const DeviceProfile& p, double M, double N, double K);
double device_profile_gemm_rate(const DeviceProfile& p, DType t);

}  // namespace fp
