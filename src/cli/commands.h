// The subcommands of the flatpeak CLI: each registers its options on the app and runs.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace fp::cli {

// Options every run shares.
struct CommonOptions {
  std::string config;
  std::vector<std::string> overrides;  // --set table.key=value
  std::string device = "cpu";
  std::string device_mem = "unlimited";
  std::string host_mem = "unlimited";
};
void common_register(CLI::App& sub, CommonOptions& o);

// flatpeak step: one forward+backward of the model on a random batch; prints the loss and the peak
// of every memory category; writes memory_trace.json (and step.json) into --out.
struct StepOptions {
  CommonOptions common;
  std::string out;
  uint64_t data_seed = 1;
};
void step_register(CLI::App& app, StepOptions& o);
int step_run(const StepOptions& o);

}  // namespace fp::cli
