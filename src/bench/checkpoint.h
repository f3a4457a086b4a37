// flatpeak bench checkpoint: the plain checkpoint store (every boundary on the device) against SCO
// (sched/ckpt/sco.h) in the same process, on the same weights and batch.
//
// Checks first: one forward+backward of each must give bit-identical losses and gradients (cpu).
// Then times forward+backward (the optimizer step is left out: it does not touch the boundaries and
// would only dilute the ratio), the variants alternating step by step so drift hits both, and
// reports per variant the checkpoints-category peak (also in boundaries of n x H fp32), the device
// total peak, the host peak and the median step seconds, with the sco/device ratios.
// Legend: L layers, n = batch_size * seq_len tokens, H hidden.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp::bench {

struct BenchCheckpointOptions {
  std::string config;                  // the run config (TOML)
  std::vector<std::string> overrides;  // table.key=value
  std::string device = "cpu";          // cpu or meta
  std::string device_mem = "unlimited";
  std::string host_mem = "unlimited";
  int64_t layers = 0;  // 0: model.num_hidden_layers of the config
  int repeats = 5;
  int warmup = 1;
  double link_gbps = 0;  // Note [Emulated link] (backend/backend.h); 0: plain memcpy
  std::string json;      // results file ("": none)
};

// Runs the benchmark, prints its report and writes o.json; returns the exit code (0). A variant
// that differs from the other (cpu) is an fp::Error.
int bench_checkpoint_run(const BenchCheckpointOptions& o);

}  // namespace fp::bench
