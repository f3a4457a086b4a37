// flatpeak bench step: the training step's speed and memory, for comparison with the PyTorch twin
// (scripts/bench_step drives both in one run and prints the ratios).
//
// Reports the median step time over repeats (forward, backward with recompute, AdamW), tokens/s,
// the device ledger's peaks, the process's max RSS, the share of the step spent in GEMMs and their
// rate against the sgemm rate measured in the same run (large square GEMMs), and the model FLOP
// utilisation (6 x matmul parameters x tokens + attention, no recompute counted) against that rate.
#pragma once

#include <string>
#include <vector>

namespace fp::bench {

struct BenchStepOptions {
  std::string config;                  // the run config (TOML)
  std::vector<std::string> overrides;  // table.key=value
  int repeats = 5;                     // timed steps (median reported)
  int warmup = 1;                      // untimed steps first
  std::string json;                    // results file ("": none)
  std::string case_path;               // also the weights and batch (safetensors) for the PyTorch twin
};

// Runs the benchmark, prints its report and writes o.json; returns the exit code (0).
int bench_step_run(const BenchStepOptions& o);

}  // namespace fp::bench
